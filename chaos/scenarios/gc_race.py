"""gc-race: GC with short horizons while agents re-send old content.

Some frames are planted as orphan blobs first, as a collector that crashed after the
blob would leave them (half with their ``blob`` row in an index log segment, flushed
before the crash; half without, for the audit's listing to find); then, at seeded moments
spread over the GC's horizon, mark grace and deletion, agents send them (and send some
again later). Others are never sent: true orphans the GC must delete. Meanwhile the
proxy makes manifest creates fail now and then (more orphans, re-sent by the agents'
retry rounds), answers GC deletes late (applied after the GC gave up and retried) and
loses answers to the GC's mark and log writes.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time

from agent import DeliveryRecord, LoadSpec, SyntheticLoad, Uploader, UploadPolicy
from agent.truth import PlannedFrame, truth_record
from chaos.cluster import Timing
from chaos.load import LoadShape
from chaos.proxy import FaultRule, Phase
from chaos.scenarios.base import Scenario, ScenarioContext
from chaos.scenarios.phases import CONDITIONAL, STORMS, K
from index.log_writer import IndexLogWriter
from index.rows import blob_row
from protocol import keys
from protocol.clock import SystemClock
from store.errors import PreconditionFailed, StoreError
from store.retry import Backoff

ORPHAN_MAKER = FaultRule({K.SLOWDOWN_503: 0.2}, ops=CONDITIONAL, prefix="accepted/v1/")


def gc_phase() -> Phase:
    return Phase("gc-race", (*STORMS["gc-writes"], ORPHAN_MAKER))


async def drive_gc_race(ctx: ScenarioContext, *, phases: bool = True, frames: int = 16) -> None:
    if phases:
        ctx.planned(0.0, "phase", name="gc-race")
        ctx.set_phase(gc_phase())
    timing = ctx.cluster.timing
    seed = int.from_bytes(hashlib.sha256(f"{ctx.rng.random()}".encode()).digest()[:8], "big")
    spec = LoadSpec(
        agents=4,
        batches=max(1, frames // 4),
        points_per_batch=20,
        seed=seed,
        agent_prefix=f"chaos-gc-r{ctx.round_index}",
        start_ns=1_760_000_000 * 1_000_000_000 + seed % 86_400 * 1_000_000_000,
    )
    planned = list(SyntheticLoad(spec).originals())
    # Sends spread over the horizon, marks, graces and deletions (squeezed into short
    # rounds, so that a smoke sends old content too).
    window = min(timing.retry_horizon_s + 4 * timing.mark_grace_s, 0.8 * ctx.length_s)
    sends: list[tuple[float, PlannedFrame]] = []
    plant: list[PlannedFrame] = []
    for frame in planned:
        if ctx.rng.random() < 0.7:
            plant.append(frame)
        if ctx.rng.random() < 0.85:
            first = ctx.rng.uniform(0.3 * timing.retry_horizon_s, window)
            sends.append((first, frame))
            if ctx.rng.random() < 0.4:  # the same old content once more, later
                sends.append((first + ctx.rng.uniform(2.0, 3 * timing.mark_grace_s), frame))
    sends.sort(key=lambda item: item[0])
    for frame in plant:
        ctx.planned(0.0, "plant_orphan", frame_sha256=frame.frame_sha256[:16])
    for at, frame in sends:
        ctx.planned(at, "send", frame_sha256=frame.frame_sha256[:16])
    await _plant(ctx, plant)
    async with Uploader(
        urls=ctx.cluster.collector_urls,
        token=None,
        policy=UploadPolicy(
            concurrency=4,
            request_timeout_s=15.0,
            backoff=Backoff(attempts=3, base_s=0.2, cap_s=1.0),
        ),
    ) as uploader:
        tasks = [asyncio.create_task(_send_at(ctx, uploader, at, frame)) for at, frame in sends]
        await asyncio.gather(*tasks)
    await ctx.until(ctx.length_s)


async def _plant(ctx: ScenarioContext, frames: list[PlannedFrame]) -> None:
    store = ctx.cluster.direct_store()
    log = IndexLogWriter(
        store=store,
        clock=SystemClock(),
        rng=random.Random(ctx.rng.random()),
        writer_id=f"chaos-crashed-r{ctx.round_index}",
    )
    try:
        for frame in frames:
            created_ns = time.time_ns()
            try:
                blob_key = keys.raw_blob_key(frame.frame_sha256)
                await store.put(blob_key, frame.frame, if_none_match=True)
            except PreconditionFailed:
                continue
            except StoreError:
                # The store may be restarting (an outage of the "all" scenario).
                ctx.counts["orphan_plant_failures"] += 1
                continue
            ctx.counts["orphans_planted"] += 1
            ctx.book.planted[frame.frame_sha256] = created_ns
            if ctx.rng.random() < 0.5:  # the crashed collector had flushed its blob row
                log.append(blob_row(frame.frame_sha256, created_ns))
                ctx.counts["orphans_logged"] += 1
        await log.flush()  # a failure leaves rows unwritten: those orphans need the listing
    finally:
        await store.close()


async def _send_at(
    ctx: ScenarioContext, uploader: Uploader, at: float, frame: PlannedFrame
) -> None:
    if not await ctx.until(at):
        return
    result = await uploader.send(frame.frame, frame.identity, frame.frame_sha256)
    ctx.counts["old_content_sends"] += 1
    ctx.book.record(DeliveryRecord("gc-race", truth_record(frame), result, result.attempts, 1))


GC_RACE = Scenario(
    "gc-race",
    "GC with short horizons while agents re-send old content: planted orphans sent "
    "before, during and after their mark, grace and deletion; late GC deletes",
    drive_gc_race,
    # Light background load: every GC run lists and checks every blob.
    load=LoadShape(lanes=2, twins=0, agents=2, batches=4, concurrency=2, wave_pause_s=2.0),
    timing=Timing(retry_horizon_s=3.0),
)
