"""`bench.steady`: the reconciler's steady pass beside the collectors (issue 22, PROTOCOL §3.9).

On MiniStack, with real processes and the deployment's default settings:

1. one ``lm-reconciler run --once`` on the empty bucket: the first run ever always audits
   (and runs the GC); it is measured apart (**first run**) so the audit does not hide the
   steady pass;
2. ``--collectors`` (2) ``lm-collector serve`` processes accept ``--batches`` (20,000)
   new batches from the agent's synthetic load (`bench._common.FrameSource`: agent frames
   of ``--points`` points re-stamped with fresh identities, sent with the agent's
   ``Uploader``, one uploader per collector, ``--concurrency`` each), after a short
   warm-up; then each is stopped (SIGTERM: it flushes its index log buffer and exits);
3. ONE ``lm-reconciler run --once`` catalogs them all (**steady run**: the steady pass,
   no audit due, compaction, the log sweep and a GC run, as ``--once`` does);
4. one more ``lm-reconciler run --once`` with nothing new (**empty run**): the fixed
   cost of a process (imports, lease, ETag check, GC), subtracted to give the steady
   pass's marginal cost per batch (what a long-running daemon pays);
5. the catalog is read back: every accepted batch must be cataloged exactly by its key.

CPU: ``/proc/<pid>/stat`` utime+stime of each process (`bench.proc_exit`: a collector's
from the end of the warm-up to its exit, the index log flushes included; a reconciler's
whole life, read from its zombie before it is reaped). Requests: each reconciler run
goes through its own counting proxy (`bench.counting`). The ratio is
collector CPU per batch / reconciler CPU per batch: how many collector cores one
reconciler core keeps up with (target >= 50). ``--profile`` then re-runs the steady pass
in this process under cProfile against the same bucket (checkpoint deleted first) and
prints where the time goes.

    .venv/bin/python -m bench.steady                    # 20,000 batches, ~5-10 min
    .venv/bin/python -m bench.steady --batches 2000 --profile
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import io
import json
import os
import pstats
import random
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from agent.load import LoadSpec, SyntheticLoad
from agent.uploader import Outcome
from bench import _common as c
from bench.cost_stack import CostStack, on_cost_stack
from bench.ingest_collector import uploader_for
from bench.proc_exit import ExitedProcess, stop_exit_cpu, uptime, wait_exit_cpu
from bench.steady_report import CatalogCheck, CollectorRun, ReconcilerRun, Result, render
from config import Settings
from index import catalog
from index.rows import read_table
from protocol import keys
from protocol.clock import SystemClock
from reconciler.context import ReconcilerContext, open_context
from reconciler.steady import CHUNK_ROWS, SteadyScanner
from store.base import ObjectStore
from store.errors import NotFound
from store.lease import LeaseHeld

TARGET_RATIO = 50.0
WARM_UP_PER_COLLECTOR = 64


def frame_source(points: int) -> c.FrameSource:
    spec = LoadSpec(agents=8, batches=1, points_per_batch=points, seed=20261201)
    planned = list(SyntheticLoad(spec).originals())
    return c.FrameSource([p.frame for p in planned], [p.identity for p in planned])


async def drive(
    url: str, frames: c.FrameSource, total: int, concurrency: int, run: CollectorRun | None
) -> list[str]:
    """Send until ``total`` batches were accepted by the collector at ``url``; their
    manifest keys. Bounded: at most twice ``total`` attempts."""
    accepted: list[str] = []
    attempts = 0
    async with uploader_for(url, concurrency) as uploader:

        async def worker() -> None:
            nonlocal attempts
            while len(accepted) < total and attempts < 2 * total:
                attempts += 1
                frame = frames.take()
                answer = await uploader.send(frame.frame, frame.identity, frame.frame_sha256)
                if run is not None:
                    run.retries += answer.retries
                if answer.outcome is Outcome.ACCEPTED:
                    accepted.append(keys.accepted_manifest_key(frame.identity))
                elif run is not None:
                    run.failures += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    if len(accepted) < total:
        raise RuntimeError(f"{url}: only {len(accepted)} of {total} batches accepted")
    return accepted


async def reconcile_once(
    stack: CostStack, bucket: str, label: str, timeout_s: float = 1800.0
) -> ReconcilerRun:
    """One ``lm-reconciler run --once`` through its own counting proxy."""
    proxy = await stack.proxy(bucket, label)
    child = stack.spawn(label, ["-m", "reconciler", "run", "--once"], stack.env(bucket, proxy.url))
    try:
        exited: ExitedProcess = await asyncio.to_thread(wait_exit_cpu, child.process, timeout_s)
    finally:
        stack.children.remove(child)
    report: dict[str, Any] = {}
    for line in child.log_path.read_text(errors="replace").splitlines():
        if line.startswith('{"epoch"'):
            report = json.loads(line)
    if exited.code != 0:
        raise RuntimeError(f"{label} exited with {exited.code}:\n{child.tail()}")
    return ReconcilerRun(label, exited.cpu_s, exited.seconds, exited.code, report, proxy.snapshot())


async def check_catalog(store: ObjectStore, expected: set[str]) -> CatalogCheck:
    check = CatalogCheck(expected=len(expected))
    found: set[str] = set()
    async for info in catalog.list_all_files(store):
        body, _etag = await store.get(info.key)
        table = read_table(body, source=info.key)
        check.files += 1
        check.rows += table.num_rows
        check.read_back_rows += int(
            pc.sum(pc.equal(table.column("source"), "read-back")).as_py() or 0
        )
        check.rows_without_etag += table.column("etag").null_count
        accepted = table.filter(pc.equal(table.column("kind"), "accepted"))
        found.update(accepted.column("key").to_pylist())
    check.accepted_keys = len(found)
    missing = expected - found
    check.missing = len(missing)
    check.unexpected = len(found - expected)
    if missing:  # the reconciler's fault, or did no log segment name them?
        logged: set[str] = set()
        async for info in store.list(keys.INDEX_LOG_PREFIX):
            body, _etag = await store.get(info.key)
            logged.update(read_table(body, source=info.key).column("key").to_pylist())
        check.missing_from_log = len(missing - logged)
    return check


async def _open_when_released(store: ObjectStore) -> ReconcilerContext:
    """The reconciler context, once the last ``run --once``'s lease is free: it released
    the lease by setting its expiry to the store's "now" as that process estimated it
    (whole seconds from Date headers), so for up to about a second it still reads as held.
    Bounded (20 tries, ~10 s in all) and jittered; repeating is safe: taking a lease is a
    compare-and-swap that either lands or changes nothing."""
    rng = random.Random()
    for attempt in range(20):
        try:
            return await open_context(store, settings=Settings(), clock=SystemClock(), rng=rng)
        except LeaseHeld:
            if attempt == 19:
                raise
            await asyncio.sleep(rng.uniform(0.25, 0.75))
    raise AssertionError("unreachable")


async def profile_steady_pass(store: ObjectStore, etags_attest: bool) -> str:
    """The steady pass in this process under cProfile, over every segment again (the
    checkpoint is deleted first, so the catalog gets a second copy of each row)."""
    try:
        await store.delete(keys.RECONCILER_INDEX_CHECKPOINT_KEY)
    except NotFound:
        pass
    ctx = await _open_when_released(store)
    ctx = dataclasses.replace(ctx, etags_attest=etags_attest)
    scanner = SteadyScanner(ctx)
    profiler = cProfile.Profile(time.process_time)  # CPU, not wall: the machine is shared
    cpu_before, wall_before = time.process_time(), time.monotonic()
    profiler.enable()
    result = await scanner.run_pass()
    profiler.disable()
    cpu, wall = time.process_time() - cpu_before, time.monotonic() - wall_before
    await ctx.fence.release()
    out = io.StringIO()
    out.write(
        f"in-process steady pass (under cProfile): {result.accepted_rows} accepted rows, "
        f"{result.segments_read} segments, {result.records_read} records read, "
        f"CPU {cpu:.2f} s ({cpu / max(1, result.accepted_rows) * 1e6:.0f} us/batch), "
        f"wall {wall:.2f} s\n"
    )
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(30)
    return out.getvalue()


async def measure(args: argparse.Namespace, stack: CostStack) -> Result:
    defaults = Settings()
    result = Result(
        args={k: v for k, v in vars(args).items() if k not in ("work_dir", "json", "markdown")},
        settings={
            "ingest.index_flush_max_age_ms": defaults.ingest.index_flush_max_age_ms,
            "ingest.index_flush_rows": defaults.ingest.index_flush_rows,
            "reconciler.verify_sample_rate": defaults.reconciler.verify_sample_rate,
            "reconciler.concurrency": defaults.reconciler.concurrency,
            "reconciler.steady CHUNK_ROWS": CHUNK_ROWS,
            "gc.enabled": defaults.gc.enabled,
        },
    )
    result.uptime["start"] = uptime()
    bucket = await stack.new_bucket("steady")
    direct = stack.direct_store(bucket)

    print("first run --once (the first audit of the empty bucket) ...", flush=True)
    result.runs["first"] = await reconcile_once(stack, bucket, "first-run")

    frames = frame_source(args.points)
    collectors = [
        await stack.start_collector(f"collector-{i + 1}", stack.direct_env(bucket))
        for i in range(args.collectors)
    ]
    runs = [CollectorRun(f"collector-{i + 1}", p.pid) for i, p in enumerate(collectors)]
    result.collectors = runs
    expected: list[str] = []
    for process in collectors:
        expected += await drive(process.url, frames, WARM_UP_PER_COLLECTOR, 8, None)
    result.warm_up_batches = len(expected)
    await asyncio.sleep(1.5)  # the warm-up's index log flush (1 s age) before the window
    started_cpu = [c.cpu_seconds(r.pid) for r in runs]
    per_collector = -(-args.batches // args.collectors)
    print(f"load: {per_collector} batches to each of {len(runs)} collectors ...", flush=True)
    meter = c.CpuMeter(
        {
            "collectors": [r.pid for r in runs],
            "ministack": [stack.ministack.pid] if stack.ministack and stack.ministack.pid else [],
            "driver": [os.getpid()],
        }
    )
    result.uptime["load start"] = uptime()
    meter.start()
    started = time.monotonic()
    accepted = await asyncio.gather(
        *(
            drive(p.url, frames, per_collector, args.concurrency, run)
            for p, run in zip(collectors, runs, strict=True)
        )
    )
    result.load_seconds = time.monotonic() - started
    result.load_cpu = meter.stop()  # the collectors' window CPU is read at their exit
    result.uptime["load end"] = uptime()
    for process, run, keys_of, cpu_before in zip(
        collectors, runs, accepted, started_cpu, strict=True
    ):
        expected += keys_of
        run.accepted = len(keys_of)
        exited = await asyncio.to_thread(stop_exit_cpu, process.process)
        run.cpu_s = exited.cpu_s - cpu_before
    stack.collectors.clear()

    print(f"steady run --once over {len(expected)} batches ...", flush=True)
    result.uptime["steady run start"] = uptime()
    result.runs["steady"] = await reconcile_once(stack, bucket, "steady-run")
    result.uptime["steady run end"] = uptime()
    result.runs["empty"] = await reconcile_once(stack, bucket, "empty-run")
    result.catalog = await check_catalog(direct, set(expected))
    result.uptime["end"] = uptime()
    emit(result, args)  # before the profile: the measurement stands on its own
    if args.profile:
        checkpoint, _ = await direct.get(keys.RECONCILER_INDEX_CHECKPOINT_KEY)
        attest = bool(json.loads(checkpoint).get("etags_attest", True))
        print("profiling the steady pass in process ...", flush=True)
        result.profile = await profile_steady_pass(direct, attest)
        emit(result, args)
    return result


def emit(result: Result, args: argparse.Namespace) -> None:
    text, summary = render(result, TARGET_RATIO)
    c.publish(text, summary, args)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.steady", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--collectors", type=int, default=2)
    parser.add_argument("--batches", type=int, default=20_000, help="accepted, after warm-up")
    parser.add_argument("--points", type=int, default=575, help="points per batch (64 KiB)")
    parser.add_argument("--concurrency", type=int, default=32, help="per collector")
    parser.add_argument("--profile", action="store_true", help="cProfile the pass in process")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--keep-work-dir", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM ends the run like Ctrl-C: the finally blocks stop every child by its PID.
    signal.signal(signal.SIGTERM, c.exit_on_sigterm)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-steady-"))
    try:
        result = asyncio.run(on_cost_stack(work_dir, lambda stack: measure(args, stack)))
    finally:
        if not args.keep_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    return 0 if result.catalog.missing == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
