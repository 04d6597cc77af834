"""`bench.raw_retention`: what raw retention costs per retired batch, and how fast the GC
deletes with ``gc.concurrency`` 1 (baseline) against 8 (the default) and 32.

In process, on MiniStack (default; one server, one bucket per variant) or the fs store,
with the reconciler's real context, audit and GC (`reconciler.gc.run.run_gc`) on a
`ManualClock` per variant that starts at real time (MiniStack stamps LastModified with
its own clock, so ages agree). For each concurrency, the same steps in the same run
(each step runs for every variant before the next step starts, so they see the same
load):

1. **seed**: ``--batches`` accepted batches (raw blob + manifest, the two PUTs of an
   acknowledgement) over ``--hours`` accepted hours that ended before the clock's start;
   a listing audit catalogs them and catalog compaction leaves one file per hour (as the
   daemon's compaction does); a rollup commit whose ledger includes every one;
2. the clock moves past ``raw_days`` (and the GC's retry horizon), then, as a reconciler
   runs them: **audit 1** (seals the hours), **GC: retiring** (raw retention retires them
   all), **audit 2** (flags every blob ``raw-retention``), **GC: marking**, the clock moves
   past ``gc.mark_grace``, **audit 3** (proves them), **GC: deleting**; then **audit 4**
   (a check: nothing reported missing), not part of the cost.

Checked (a failed check ends the run): every hour retired, every blob marked and
deleted by raw retention, ``raw-blobs/v1/`` empty and every manifest still present, no
mark left and no problem recorded. The report says whether the GC phases' requests were
identical across the concurrencies (they should be: concurrency changes only the order).

Requests are counted by a `store.counting.CountingStore` around each store and
classed as `bench.counting` does (PUT-class: PUT, COPY, POST, LIST; GET-class: the rest,
DELETE included though S3 does not bill it); on MiniStack the S3 client's own request
count is printed beside the wrapper's. Wall times are of the whole `run_gc` call, with
the CPU the driver (this process), MiniStack, the delay proxy and everyone else used
meanwhile: on this shared 2-core machine MiniStack answers in ~1 ms, so the GC is bound
by CPU, not latency, unless ``--latency-ms`` adds the round trip a real S3 has.

    .venv/bin/python -m bench.raw_retention                       # MiniStack, 2,000 batches
    .venv/bin/python -m bench.raw_retention --store fs --batches 500
    .venv/bin/python -m bench.raw_retention --batches 500 --latency-ms 10   # S3-like latency
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TypeVar

from bench._common import CpuMeter, fast_temp_root
from bench.counting import attach_wire_count, since
from bench.delay_proxy import start_delay_proxy
from bench.proc_exit import uptime
from bench.raw_retention_report import Variant, render
from chaos.s3_server import (
    CREDENTIALS,
    REGION,
    RunningServer,
    fresh_bucket,
    start_ministack,
    use_dummy_aws_credentials,
)
from config import GcSettings, LoggingSettings, RetentionSettings, Settings, configure_logging
from protocol import keys
from protocol.clock import ManualClock
from protocol.frame_encode import encode_frame, points_table
from protocol.records import AcceptedManifest, AuditRecord
from reconciler.audit.run import run_full_audit
from reconciler.compaction import CatalogCompactor
from reconciler.context import ReconcilerContext, open_context
from reconciler.gc import GcOutcome
from reconciler.gc.bounded import for_each_bounded
from reconciler.gc.raw_retention import read_state
from reconciler.gc.run import run_gc
from rollup.table.commit import commit, load_latest
from rollup.table.ledger import LedgerRow, write_ledger_files
from rollup.table.owner import OwnerLease
from store.base import ObjectStore
from store.counting import CountingStore
from store.fs import FileSystemStore
from store.s3 import S3Store

T = TypeVar("T")
HOUR_NS = 3600 * keys.NS_PER_S
SEED_CONCURRENCY = 16
RAW_DAYS = 0.1
RETRY_HORIZON_S = 2 * 3600.0
"""Short ages (as `tests/reconciler/test_gc_backends.py` uses): they change no request,
only how far the manual clock jumps. On MiniStack the jump must stay small: store time is
the manual clock plus an offset measured on the real clock, whose uncertainty grows by
`store.time.MAX_DRIFT` (1e-3) of the distance between the two, and past ~25 s (a 7-hour
jump) the reconciler's 30 s lease looks expired to itself (`LeaseLost`)."""
BOOT_ID = str(uuid.UUID("0b5e0b5e-0000-4000-8000-000000000001"))
STEPS = ("audit 1", "GC: retiring", "audit 2", "GC: marking", "audit 3", "GC: deleting")


def bench_settings(concurrency: int) -> Settings:
    """The defaults (as deployed), with raw retention on, ``gc.concurrency`` set and the
    short retry horizon of `RETRY_HORIZON_S`."""
    return Settings(
        retention=RetentionSettings(raw_days=RAW_DAYS),
        gc=GcSettings(concurrency=concurrency, retry_horizon_s=RETRY_HORIZON_S),
    )


def planned_batches(
    count: int, hours: int, first_hour_ns: int
) -> list[tuple[bytes, AcceptedManifest]]:
    """``count`` batches spread evenly over ``hours`` accepted hours from ``first_hour_ns``;
    valid frames of 10 points (the GC's proof reads a blob's identity from its header,
    PROTOCOL §3.5 rule 7), 16 agents."""
    per_hour = -(-count // hours)
    planned = []
    points = points_table(
        [first_hour_ns + n for n in range(10)],
        ["bench"] * 10,
        [float(n) for n in range(10)],
        [None] * 10,
    )
    for i in range(count):
        hour, slot = divmod(i, per_hour)
        frame = encode_frame(
            agent_id=f"bench-{i % 16:02d}",
            boot_id=uuid.UUID(BOOT_ID),
            seq_start=i * 10,
            points=points,
        )
        sha = hashlib.sha256(frame).hexdigest()
        manifest = AcceptedManifest(
            agent_id=f"bench-{i % 16:02d}",
            boot_id=BOOT_ID,
            seq_start=i * 10,
            seq_end=i * 10 + 9,
            record_count=10,
            frame_sha256=sha,
            frame_bytes=len(frame),
            raw_blob_key=keys.raw_blob_key(sha),
            accepted_at_unix_ns=first_hour_ns + hour * HOUR_NS + slot * (HOUR_NS // per_hour),
            collector_id="bench-collector",
        )
        planned.append((frame, manifest))
    return planned


async def accept_all(store: ObjectStore, planned: Sequence[tuple[bytes, AcceptedManifest]]) -> None:
    """The two PUTs of each acknowledged batch (PROTOCOL §3.2), as a collector sends them."""

    async def one(item: tuple[bytes, AcceptedManifest]) -> None:
        frame, manifest = item
        await store.put(manifest.raw_blob_key, frame, if_none_match=True)
        await store.put(manifest.manifest_key, manifest.to_json(), if_none_match=True)

    await for_each_bounded(planned, one, SEED_CONCURRENCY)


async def commit_ledger(
    store: ObjectStore, clock: ManualClock, manifests: Sequence[AcceptedManifest]
) -> None:
    """A rollup commit whose ledger includes every batch (one ledger file per hour), as
    the rollup job commits one (no data files: raw retention reads only the ledger)."""
    changes = await write_ledger_files(store, [LedgerRow.of_manifest(m) for m in manifests])
    owner = await OwnerLease.acquire(store, "bench-rollup", 600, clock)
    await commit(store, base=await load_latest(store), changes=changes, owner=owner, clock=clock)
    await owner.release()


def catch_up(clock: ManualClock) -> None:
    """Move ``clock`` to at least real time: MiniStack stamps LastModified with its own
    clock, and an object stamped in the manual clock's future is too young to touch (a
    compacted catalog file's inputs would never be deleted, say)."""
    clock.advance(max(0.0, (time.time_ns() - clock.now_ns()) / 1e9 + 1))


async def compact_all(
    ctx: ReconcilerContext, clock: ManualClock, planned: Sequence[tuple[bytes, AcceptedManifest]]
) -> None:
    """Each hour's catalog files merged into one, inputs deleted (`force`: no grace)."""
    compactor = CatalogCompactor()
    for hour in {m.accepted_hour for _frame, m in planned}:
        compactor.touched(hour)
    first = await compactor.run(ctx, force=True)  # merges
    catch_up(clock)
    second = await compactor.run(ctx, force=True)  # deletes the inputs
    if first.failed or second.failed or compactor.pending or not second.inputs_deleted:
        raise RuntimeError(f"catalog compaction did not finish: {first}, {second}")


async def measured(variant: Variant, name: str, meter: CpuMeter, work: Awaitable[T]) -> T:
    """Run ``work`` as phase ``name`` of ``variant``: its requests, wall time, and the
    cores other processes used meanwhile."""
    before = variant.store.snapshot()
    meter.start()
    started = time.perf_counter()
    result = await work
    variant.seconds[name] = time.perf_counter() - started
    variant.cpu_s[name] = meter.stop()
    variant.others_cores[name] = variant.cpu_s[name]["others"] / max(variant.seconds[name], 1e-9)
    variant.phases[name] = since(variant.store.snapshot(), before)
    return result


async def completed_audit(ctx: ReconcilerContext) -> AuditRecord:
    record = await run_full_audit(ctx)
    if record.status != "completed":
        raise RuntimeError(f"audit {record.audit_id} did not complete: {record}")
    return record


def expect(what: str, got: object, wanted: object) -> None:
    if got != wanted:
        raise AssertionError(f"{what}: expected {wanted!r}, got {got!r}")


async def seed(
    variant: Variant, planned: Sequence[tuple[bytes, AcceptedManifest]], meter: CpuMeter
) -> None:
    store, clock = variant.store, variant.clock
    catch_up(clock)
    await measured(variant, "seed: acceptance", meter, accept_all(store, planned))
    variant.ctx = await open_context(
        store,
        settings=bench_settings(variant.concurrency),
        clock=clock,
        rng=random.Random(variant.concurrency),
        owner=f"bench-reconciler-{variant.concurrency}",
    )
    audit = await measured(variant, "seed: audit (catalogs)", meter, completed_audit(variant.ctx))
    expect("seed audit cataloged", audit.cataloged, len(planned))
    await measured(
        variant, "seed: catalog compaction", meter, compact_all(variant.ctx, clock, planned)
    )
    manifests = [m for _frame, m in planned]
    await measured(variant, "seed: rollup commit", meter, commit_ledger(store, clock, manifests))
    clock.advance(max(RAW_DAYS * 86_400, RETRY_HORIZON_S) + 1800)


async def step(variant: Variant, name: str, batches: int, meter: CpuMeter) -> None:
    """One of `STEPS` for ``variant``, with the checks that say it did its part."""
    ctx = variant.context()
    if name.startswith("audit"):
        audit = await measured(variant, name, meter, completed_audit(ctx))
        if name == "audit 2":
            expect("audit 2 orphans (flagged raw-retention)", audit.orphans, batches)
        variant.clock.advance(1)
        return
    outcome: GcOutcome = await measured(variant, name, meter, run_gc(ctx, dry_run=False))
    if name == "GC: retiring":
        state, _etag = await read_state(variant.store.inner)
        expect("batches retired", state.retired_batches if state else 0, batches)
    elif name == "GC: marking":
        expect("blobs marked", outcome.record.marked, batches)
        variant.clock.advance(ctx.settings.gc.mark_grace_s + 1)
    else:
        expect("blobs deleted by raw retention", outcome.record.deleted_raw_retention, batches)


async def check_end_state(variant: Variant, batches: int, meter: CpuMeter) -> None:
    """Every blob deleted, every manifest kept, no mark left, nothing reported (by a
    fourth audit, measured apart)."""
    await measured(variant, "audit 4 (check)", meter, completed_audit(variant.context()))
    inner = variant.store.inner

    async def count(prefix: str) -> int:
        return sum([1 async for _info in inner.list(prefix)])

    expect("raw blobs left", await count(keys.RAW_BLOBS_PREFIX), 0)
    expect("accepted manifests", await count(keys.ACCEPTED_PREFIX), batches)
    expect("GC marks left", await count(keys.GC_MARKS_PREFIX), 0)
    problems = [info.key async for info in inner.list(keys.RECONCILER_PROBLEMS_PREFIX)]
    expect("problems recorded", problems, [])


async def open_variants(
    args: argparse.Namespace, work_dir: Path, server: RunningServer | None, endpoint_url: str
) -> list[Variant]:
    variants = []
    for concurrency in args.concurrency:
        clock = ManualClock(time.time_ns())
        wire = None
        inner: ObjectStore
        if server is None:
            inner = FileSystemStore(work_dir / f"store-c{concurrency}", clock=clock)
        else:
            s3 = S3Store(
                bucket=fresh_bucket(server, "lm-bench-retention"),
                endpoint_url=endpoint_url,
                region=REGION,
                credentials=CREDENTIALS,
            )
            await s3.open()
            wire = attach_wire_count(await s3._s3())  # benchmark-only: a private client
            inner = s3
        variants.append(Variant(concurrency, CountingStore(inner), clock, wire=wire))
    return variants


async def run(args: argparse.Namespace, work_dir: Path, uptimes: list[str]) -> str:
    loads = [os.getloadavg()]
    server, proxy = None, None
    pids = {"driver": [os.getpid()]}
    if args.store == "ministack":
        server = await asyncio.to_thread(start_ministack, work_dir / "ministack")
        assert server.pid is not None
        pids["ministack"] = [server.pid]
    try:
        endpoint_url = server.endpoint_url if server else ""
        if server and args.latency_ms:
            proxy = start_delay_proxy(
                upstream_port=server.port, delay_ms=args.latency_ms, work_dir=work_dir
            )
            pids["proxy"] = [proxy.pid]
            endpoint_url = proxy.endpoint_url
        meter = CpuMeter(pids)
        variants = await open_variants(args, work_dir, server, endpoint_url)
        try:
            first_hour_ns = (time.time_ns() // HOUR_NS - args.hours - 1) * HOUR_NS
            planned = planned_batches(args.batches, args.hours, first_hour_ns)
            for variant in variants:
                await seed(variant, planned, meter)
                print(f"seeded concurrency {variant.concurrency}", flush=True)
            for index, name in enumerate(STEPS):
                # Alternate the order, so no concurrency always runs first after a pause.
                for variant in variants if index % 2 == 0 else variants[::-1]:
                    await step(variant, name, args.batches, meter)
                    print(
                        f"{name:14} concurrency {variant.concurrency:3}: "
                        f"{variant.seconds[name]:.2f} s",
                        flush=True,
                    )
            for variant in variants:
                await check_end_state(variant, args.batches, meter)
                await variant.context().fence.release()
        finally:
            for variant in variants:
                await variant.store.close()
    finally:
        if proxy is not None:
            proxy.stop()
        if server is not None:
            server.stop()
    loads.append(os.getloadavg())
    uptimes.append(await asyncio.to_thread(uptime))
    return render(variants, args=args, raw_days=RAW_DAYS, loads=loads, uptime=uptimes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.raw_retention", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--hours", type=int, default=4, help="accepted hours the batches fall in")
    parser.add_argument("--store", choices=("ministack", "fs"), default="ministack")
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="MiniStack only: reach it through a delay-line proxy adding this much to every "
        "request's round trip (bench.delay_proxy.DelayProxy), as a real S3 would",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, 8, 32],
        help="gc.concurrency values; the first is the baseline",
    )
    parser.add_argument("--markdown", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    configure_logging(LoggingSettings(level="warning", format="console"))
    use_dummy_aws_credentials()
    work_dir = Path(tempfile.mkdtemp(prefix="lm-bench-retention-", dir=fast_temp_root()))
    try:
        report = asyncio.run(run(args, work_dir, [uptime()]))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    print(report)
    if args.markdown:
        args.markdown.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
