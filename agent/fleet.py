"""Whole agent runs in one call: a synthetic fleet (`run_fleet`) or given points
(`send_points`), against one or more collector URLs, returning the summary and the
ground truth. This is what the demo, benchmarks, chaos runs and collector tests call.

Both open the spool at ``spool_dir`` (recovering and re-sending what an earlier run left
pending there), share one `Uploader` (round-robin over ``urls``) across all agents, run
one `DeliveryRun`, and close everything. Neither raises for HTTP outcomes; they are in
`FleetResult.summary` (see `agent.summary` for the exit-code rule). They raise
`SpoolLocked` if the spool is in use, and let local errors (disk) propagate.
"""

from __future__ import annotations

import hashlib
import os
import random
import uuid
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass, field

import aiohttp
import pyarrow as pa

from agent.load import LoadSpec, SyntheticLoad
from agent.pipeline import DeliveryRun
from agent.producer import BatchProducer
from agent.spool import Spool
from agent.summary import DeliveryRecord, RunSummary, summarize
from agent.truth import BatchKind, GroundTruth, PlannedFrame, finite_sum
from agent.uploader import Uploader, UploadPolicy
from protocol.clock import Clock, SystemClock


@dataclass(frozen=True, slots=True)
class SpoolSettings:
    """Where and how big the agent's spool is. ``fsync=False`` only for benchmarks."""

    directory: str | os.PathLike[str]
    max_pending_frames: int = 10_000
    max_pending_bytes: int = 1 << 30
    fsync: bool = True


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How hard to try: retries per round live in ``policy``; ``max_rounds`` rounds over
    deferred frames, ``round_delay_s`` apart."""

    policy: UploadPolicy = field(default_factory=UploadPolicy)
    max_rounds: int = 3
    round_delay_s: float = 1.0


@dataclass(frozen=True, slots=True)
class FleetResult:
    summary: RunSummary
    truth: GroundTruth
    records: list[DeliveryRecord]


async def run_fleet(
    *,
    urls: list[str],
    token: str | None,
    spool: SpoolSettings,
    spec: LoadSpec,
    options: RunOptions | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    session: aiohttp.ClientSession | None = None,
    on_record: Callable[[DeliveryRecord], None] | None = None,
) -> FleetResult:
    """Send the synthetic fleet ``spec`` (with its injected duplicates and conflicts).

    ``rng`` drives only retry jitter (frames come from ``spec.seed``)."""
    load = SyntheticLoad(spec)
    return await _run(
        urls=urls,
        token=token,
        spool=spool,
        frames=load.originals(),
        planned_total=spec.total_batches,
        followups=load.followups,
        options=options,
        clock=clock,
        rng=rng,
        session=session,
        on_record=on_record,
    )


async def send_points(
    *,
    urls: list[str],
    token: str | None,
    spool: SpoolSettings,
    agent_id: str,
    tables: Iterable[pa.Table],
    boot_id: uuid.UUID | None = None,
    options: RunOptions | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    session: aiohttp.ClientSession | None = None,
    on_record: Callable[[DeliveryRecord], None] | None = None,
) -> FleetResult:
    """Send ``tables`` (canonical points tables, one frame each) as one agent boot
    (``boot_id`` defaults to a fresh random UUID: a new boot)."""
    producer = BatchProducer(agent_id=agent_id, boot_id=boot_id)
    return await _run(
        urls=urls,
        token=token,
        spool=spool,
        frames=_planned_from_tables(producer, tables),
        planned_total=len(tables) if isinstance(tables, Sized) else None,
        followups=None,
        options=options,
        clock=clock,
        rng=rng,
        session=session,
        on_record=on_record,
    )


def _planned_from_tables(
    producer: BatchProducer, tables: Iterable[pa.Table]
) -> Iterator[PlannedFrame]:
    # Lazy: each range is consumed only when the pipeline is about to spool its frame.
    for table in tables:
        frame, identity = producer.frame(table)
        yield PlannedFrame(
            BatchKind.ORIGINAL,
            identity,
            frame,
            hashlib.sha256(frame).hexdigest(),
            table.num_rows,
            finite_sum(table.column("value").to_pylist()),
        )


async def _run(
    *,
    urls: list[str],
    token: str | None,
    spool: SpoolSettings,
    frames: Iterable[PlannedFrame],
    planned_total: int | None,
    followups: Callable[[PlannedFrame], Iterable[PlannedFrame]] | None,
    options: RunOptions | None,
    clock: Clock | None,
    rng: random.Random | None,
    session: aiohttp.ClientSession | None,
    on_record: Callable[[DeliveryRecord], None] | None,
) -> FleetResult:
    options = options if options is not None else RunOptions()
    clock = clock if clock is not None else SystemClock()
    truth = GroundTruth()
    started = clock.monotonic()
    with Spool.open(
        spool.directory,
        max_pending_frames=spool.max_pending_frames,
        max_pending_bytes=spool.max_pending_bytes,
        fsync=spool.fsync,
    ) as opened:
        async with Uploader(
            urls=urls, token=token, policy=options.policy, clock=clock, rng=rng, session=session
        ) as uploader:
            delivery = DeliveryRun(
                spool=opened,
                uploader=uploader,
                truth=truth,
                clock=clock,
                max_rounds=options.max_rounds,
                round_delay_s=options.round_delay_s,
                on_record=on_record,
            )
            records = await delivery.run(frames, followups, planned_total=planned_total)
    summary = summarize(records, elapsed_s=clock.monotonic() - started, not_sent=delivery.not_sent)
    return FleetResult(summary, truth, records)
