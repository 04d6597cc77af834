"""The rollup's cost against the size of history (`bench.cost`, PROTOCOL §4: "a run's
requests grow with the new batches and the hours they fall in, never with the total
history").

For each history factor (1x, 10x) a fresh bucket gets ``factor x base`` batches spread
over ``factor x base_hours`` past hours (the same density per hour: 10x is ten times as
long a history), cataloged the way the reconciler catalogs them (`Cataloger.commit`:
one catalog file and one rollup work marker per hour) and rolled up by an uncounted
``lm-rollup run``. Then ``new`` batches land in the current hour (cataloged likewise) and
one ``lm-rollup run`` through a counting proxy includes them: its requests are the
figure compared. Seeding writes blobs and manifests straight to MiniStack (not counted).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from agent.load import LoadSpec, SyntheticLoad
from agent.truth import PlannedFrame
from bench.cost_stack import CostStack
from bench.counting import Tally, by_class
from config import Settings
from index.rows import accepted_row
from protocol import keys
from protocol.clock import SystemClock
from protocol.records import AcceptedManifest
from reconciler.cataloger import Cataloger
from reconciler.context import open_context
from reconciler.problems import ProblemBook
from store.base import ObjectStore

PUT_CONCURRENCY = 32
AGENTS_PER_HOUR = 10
ROLLUP_TIMEOUT_S = 1800.0


@dataclass
class HistoryRun:
    factor: int
    history_batches: int
    history_hours: int
    new_batches: int
    seed_s: float
    tally: Tally
    seconds: float

    @property
    def classes(self) -> dict[str, int]:
        return by_class(self.tally)


def frames_for_hour(
    hour: keys.UtcHour, batches: int, *, seed: int, points: int
) -> Iterator[PlannedFrame]:
    """``batches`` small frames whose points fall inside ``hour`` (unique identities:
    the boot ids derive from ``seed``)."""
    per_agent = max(1, -(-batches // AGENTS_PER_HOUR))
    spec = LoadSpec(
        agents=AGENTS_PER_HOUR,
        batches=per_agent,
        points_per_batch=points,
        seed=seed,
        start_ns=hour.start_ns,
        interval_ns=max(1, 3_000 * keys.NS_PER_S // (per_agent * points)),
        agent_prefix="history",
    )
    for index, frame in enumerate(SyntheticLoad(spec).originals()):
        if index >= batches:
            return
        yield frame


async def land(
    store: ObjectStore, frames: Sequence[PlannedFrame], accepted_at_ns: int
) -> list[AcceptedManifest]:
    """Blob and manifest of each frame, as a collector writes them (not counted)."""
    limit = asyncio.Semaphore(PUT_CONCURRENCY)

    async def one(offset: int, frame: PlannedFrame) -> AcceptedManifest:
        identity = frame.identity
        manifest = AcceptedManifest(
            agent_id=identity.agent_id,
            boot_id=str(identity.boot_id),
            seq_start=identity.seq_start,
            seq_end=identity.seq_end,
            record_count=identity.seq_end - identity.seq_start + 1,
            frame_sha256=frame.frame_sha256,
            frame_bytes=len(frame.frame),
            raw_blob_key=keys.raw_blob_key(frame.frame_sha256),
            accepted_at_unix_ns=accepted_at_ns + offset,
            collector_id="bench-seed",
        )
        async with limit:
            await store.put(manifest.raw_blob_key, frame.frame, if_none_match=True)
            await store.put(manifest.manifest_key, manifest.to_json(), if_none_match=True)
        return manifest

    return list(await asyncio.gather(*(one(i, f) for i, f in enumerate(frames))))


async def catalog(store: ObjectStore, manifests: Sequence[AcceptedManifest]) -> None:
    """Catalog files and work markers for ``manifests``, as the reconciler writes them."""
    ctx = await open_context(store, settings=Settings(), clock=SystemClock(), rng=random.Random(7))
    try:
        await Cataloger(ctx, ProblemBook(ctx)).commit(
            (accepted_row(m) for m in manifests), writer="steady"
        )
    finally:
        await ctx.fence.release()


async def history_run(
    stack: CostStack, *, factor: int, base_batches: int, base_hours: int, new: int, points: int
) -> HistoryRun:
    started = time.monotonic()
    bucket = await stack.new_bucket(f"h{factor}x")
    store = stack.direct_store(bucket)
    now_hour = keys.UtcHour.from_unix_ns(time.time_ns())
    hours = factor * base_hours
    per_hour = base_batches // base_hours
    landed: list[AcceptedManifest] = []
    for back in range(hours, 0, -1):
        hour = now_hour.shifted(-back - 1)  # the hour before the current one stays empty
        frames = list(frames_for_hour(hour, per_hour, seed=factor * 100_000 + back, points=points))
        landed += await land(store, frames, hour.start_ns + keys.NS_PER_S)
    await catalog(store, landed)
    await stack.run_to_end(
        f"rollup-seed-{factor}x",
        ["-m", "rollup", "run"],
        stack.direct_env(bucket),
        ROLLUP_TIMEOUT_S,
    )
    frames = list(frames_for_hour(now_hour, new, seed=factor * 100_000, points=points))
    await catalog(store, await land(store, frames, time.time_ns()))
    seed_s = time.monotonic() - started
    proxy = await stack.proxy(bucket, "rollup")
    before = proxy.snapshot()
    _code, seconds = await stack.run_to_end(
        f"rollup-{factor}x", ["-m", "rollup", "run"], stack.env(bucket, proxy.url), ROLLUP_TIMEOUT_S
    )
    tally = proxy.snapshot()
    tally.subtract(before)
    return HistoryRun(
        factor=factor,
        history_batches=per_hour * hours,
        history_hours=hours,
        new_batches=len(frames),
        seed_s=seed_s,
        tally=+tally,
        seconds=seconds,
    )
