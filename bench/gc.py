"""`bench.gc`: what the GC costs per orphan it deletes, run by the reconciler daemon's own
schedule (issue 22: "1,000 planted orphans past the horizon are deleted after one
scheduled audit with <= 16 store requests per candidate in the GC runs, no audit started
by the GC, one GC log file per run").

In process, on MiniStack:

1. **seed** (real time, as collectors do it; not counted): ``--accepted`` batches through
   `collector.accept.BatchAcceptor` with its index log (blob, manifest, log rows);
   ``--conflicts`` of them sent again with other content, so the acceptor's conflict path
   writes a quarantine record naming the submitted blob (that blob must survive too); and
   ``--orphans`` raw blobs no record names (`bench.gc_seed`): most of fresh identities,
   half of those with a ``blob`` log row (a batch whose manifest never came: the steady
   pass nominates it) and half without (the row was lost: only the audit's orphan file
   finds it), some the losing twin of an accepted batch (the proof reads a manifest naming
   another hash) and some of 128-byte agent ids (two agent key forms: the proof reads two
   manifest keys and lists two quarantine prefixes).
2. **the daemon**: `reconciler.daemon.Reconciler.run()` as deployed (background audit,
   here a task of the daemon's process — the class's default; ``lm-reconciler run`` runs it
   in a child process, which could not share this benchmark's clock; no GC request differs —
   steady passes every ``loop_interval_s``, compaction, GC at most every
   ``max(loop_interval_s, gc.mark_grace_s)``), on a clock running ahead of MiniStack by
   ``retry_horizon_s`` + 60 s, so every blob is past the horizon when its first pass starts
   the first scheduled audit. Each GC run is counted through
   `store.counting.CountingStore.scope` (its own requests and its tasks', not the
   audit's or the lease renewer's running beside it). When a run ends, the benchmark waits
   (real time, bounded) for a running audit to finish and moves the clock on by
   ``gc.mark_grace_s`` + 1 s: the daemon's next pass runs the next GC at once, as it would
   one grace later. It stops one run after the last planted orphan is gone (that last run
   shows a GC run's fixed cost).

Checked at the end (a failed check is printed as FAIL): every planted orphan deleted,
every accepted batch's blob and every quarantine record's submitted blob still there, no
mark left, no problem recorded, exactly one audit record (the scheduled one), no audit
record written by a GC run's requests, one GC log file per run that deleted something.

Why the clock runs ahead instead of ages being waited out: MiniStack stamps LastModified
with its own clock, and store time (PROTOCOL §3.8) is the reconciler's clock plus the
offset measured from MiniStack's ``Date`` headers against the S3 client's clock (the
system clock here). A reconciler clock ahead by D sees every object D older: the "caller
with a clock of its own" of `store.time`. Its real-time sleeps keep the lease renewal
honest (a `ManualClock` would race ahead as the renewer sleeps on it). D must stay small:
`store.time.ClockOffset` widens its bounds by 1e-3 of D, which comes off the 30 s lease's
margin; hence ``gc.retry_horizon_s`` = 300 s by default (the deployment's is 2 days; the
ages change no request). ``gc.max_delete_fraction`` is 1.0: 1,000 orphans beside a few
hundred batches would trip the default 0.1 guard, which is there for a broken index, not
for this.

    .venv/bin/python -m bench.gc                    # 1,000 orphans beside 200 batches
    .venv/bin/python -m bench.gc --orphans 200 --markdown /tmp/gc.md
    .venv/bin/python -m bench.gc --bundles 1000 --orphans 0 --twin-orphans 0 \
        --long-agent-orphans 0                      # issue 33: 1,000 orphan bundles of ~1 MiB
    .venv/bin/python -m bench.gc --quick [--bundles 100 ...]   # a smoke run

With ``--bundles N``, N orphan bundles of ``--bundle-frames`` frames (`bench.gc_bundles`)
are planted too; the report adds requests and bytes read per candidate bundle.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import reconciler.daemon
from bench._common import fast_temp_root
from bench.gc_bundles import ByteCountingStore, plant_orphan_bundles
from bench.gc_checks import audit_records, check_end_state, orphans_left
from bench.gc_report import GcRun, Result, render
from bench.gc_seed import Seeded, seed
from chaos.s3_server import (
    CREDENTIALS,
    REGION,
    fresh_bucket,
    start_ministack,
    use_dummy_aws_credentials,
)
from config import GcSettings, LoggingSettings, Settings, configure_logging
from protocol.clock import SystemClock
from reconciler.context import ReconcilerContext
from reconciler.daemon import Reconciler
from reconciler.gc.policy import GcOutcome
from reconciler.gc.run import run_gc as real_run_gc
from store.base import ObjectStore
from store.fs import FileSystemStore
from store.s3 import S3Store

RETRY_HORIZON_S = 300.0
MAX_GC_RUNS = 12
WAIT_STEP_S = 0.2
AUDIT_WAIT_S = 300.0
RUN_TIMEOUT_S = 1800.0


class AheadClock(SystemClock):
    """The system clock plus a shift that only grows (`advance`); sleeps are real."""

    def __init__(self) -> None:
        self.shift_s = 0.0

    def now_ns(self) -> int:
        return time.time_ns() + int(self.shift_s * 1e9)

    def monotonic(self) -> float:
        return time.monotonic() + self.shift_s

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes backwards")
        self.shift_s += seconds


def bench_settings(args: argparse.Namespace) -> Settings:
    """The deployment's defaults but for the short retry horizon and the guard (see the
    module docstring)."""
    return Settings(
        gc=GcSettings(enabled=True, retry_horizon_s=args.retry_horizon_s, max_delete_fraction=1.0)
    )


class ScheduleDriver:
    """Stands in for `reconciler.daemon.run_gc` while the daemon runs: counts each GC run
    in its own scope, then moves the clock one grace on (see the module docstring)."""

    def __init__(
        self,
        *,
        counting: ByteCountingStore,
        clock: AheadClock,
        settings: Settings,
        seeded: Seeded,
        result: Result,
    ) -> None:
        self.counting, self.clock, self.settings = counting, clock, settings
        self.seeded, self.result = seeded, result
        self.reconciler: Reconciler | None = None
        self.finished = asyncio.Event()
        self._cleared_at: int | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        with mock.patch.object(reconciler.daemon, "run_gc", self.run_gc):
            yield

    async def run_gc(self, ctx: ReconcilerContext, *, dry_run: bool) -> GcOutcome:
        assert self.reconciler is not None
        inner = self.counting.inner
        index = len(self.result.runs) + 1
        audits_before = len(await audit_records(inner))
        if index == 1 and self.seeded.orphan_bundles:
            # Bundles: the first run waits for the first audit, as in a deployment, where
            # a blob log row is past the retry horizon (2 days) only after a daily audit
            # listed its bundle: a steady-pass suspect is a hash only, and the GC learns
            # that it is a bundle from the latest audit's orphan file (else it marks the
            # frame blob of that hash, withdraws it, and waits for the next audit).
            await self._audit_finished()
        running = self.reconciler.audits.running
        outcome: GcOutcome | None = None
        error: str | None = None
        started = time.perf_counter()
        try:
            with self.counting.scope(f"gc run {index}"), self.counting.reading(f"gc run {index}"):
                outcome = await real_run_gc(ctx, dry_run=dry_run)
        except Exception as exc:
            error = repr(exc)
            raise
        finally:
            seconds = time.perf_counter() - started
            left = await orphans_left(inner, self.seeded)
            self.result.runs.append(
                GcRun(
                    index=index,
                    tally=self.counting.scoped[f"gc run {index}"],
                    bytes_read=self.counting.bytes_read[f"gc run {index}"],
                    seconds=seconds,
                    outcome=outcome,
                    error=error,
                    audit_running_at_start=running,
                    audits_before=audits_before,
                    audits_after=len(await audit_records(inner)),
                    orphans_left=left,
                    loadavg=os.getloadavg(),
                )
            )
            print(self._progress(self.result.runs[-1]), flush=True)
            await self._next(left)
        assert outcome is not None
        return outcome

    @staticmethod
    def _progress(run: GcRun) -> str:
        record = run.outcome.record if run.outcome else None
        what = (
            f"candidates {record.candidates}, marked {record.marked}, deleted {record.deleted}"
            if record
            else f"failed: {run.error}"
        )
        return (
            f"GC run {run.index}: {what}; {sum(run.tally.values())} requests in "
            f"{run.seconds:.1f} s; orphans left {run.orphans_left}"
        )

    async def _audit_finished(self) -> None:
        assert self.reconciler is not None
        waited = 0.0
        while self.reconciler.audits.running and waited < AUDIT_WAIT_S:
            await asyncio.sleep(WAIT_STEP_S)  # bounded: an audit of ~1,400 objects
            waited += WAIT_STEP_S

    async def _next(self, left: int) -> None:
        """End after the run that follows the last deletion, or after `MAX_GC_RUNS`;
        else wait out a running audit and move one grace on."""
        runs = self.result.runs
        if left == 0 and self._cleared_at is None:
            self._cleared_at = len(runs)
        if (self._cleared_at is not None and len(runs) > self._cleared_at) or len(
            runs
        ) >= MAX_GC_RUNS:
            self.finished.set()
            return
        await self._audit_finished()
        self.clock.advance(self.settings.gc.mark_grace_s + 1)


async def run_daemon(
    counting: ByteCountingStore,
    clock: AheadClock,
    settings: Settings,
    seeded: Seeded,
    result: Result,
) -> None:
    driver = ScheduleDriver(
        counting=counting, clock=clock, settings=settings, seeded=seeded, result=result
    )
    daemon = Reconciler(
        store=counting,
        settings=settings,
        clock=clock,
        rng=random.Random(22),
        owner="bench-gc-reconciler",
    )
    driver.reconciler = daemon
    with driver.installed():
        task = asyncio.create_task(daemon.run(), name="bench-gc-daemon")
        try:
            await asyncio.wait_for(driver.finished.wait(), RUN_TIMEOUT_S)
        finally:
            await daemon.stop(grace_s=60.0)
            await task


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


async def open_store(args: argparse.Namespace, work_dir: Path) -> tuple[ObjectStore, Any]:
    """MiniStack (and its server, to stop), or the fs store stamping the system clock."""
    if args.store == "fs":
        return FileSystemStore(work_dir / "store", clock=SystemClock()), None
    server = await asyncio.to_thread(start_ministack, work_dir / "ministack")
    s3 = S3Store(
        bucket=fresh_bucket(server, "lm-bench-gc"),
        endpoint_url=server.endpoint_url,
        region=REGION,
        credentials=CREDENTIALS,
    )
    await s3.open()
    return s3, server


async def run(args: argparse.Namespace, work_dir: Path) -> Result:
    settings = bench_settings(args)
    inner, server = await open_store(args, work_dir)
    try:
        counting = ByteCountingStore(inner)
        try:
            started = time.perf_counter()
            seeded = await seed(inner, args, rng=random.Random(args.seed))
            if args.bundles:
                hashes, size = await plant_orphan_bundles(inner, args, rng=random.Random(33))
                seeded.orphan_bundles, seeded.bundle_bytes = hashes, size
                seeded.bundle_frames = args.bundle_frames
            result = Result(args=args, settings=settings, seeded=seeded)
            result.seed_seconds = time.perf_counter() - started
            print(f"seeded in {result.seed_seconds:.1f} s: {seeded.describe()}", flush=True)
            clock = AheadClock()
            clock.advance(settings.gc.retry_horizon_s + 60)  # every blob past the horizon
            started = time.perf_counter()
            await run_daemon(counting, clock, settings, seeded, result)
            result.total_seconds = time.perf_counter() - started
            result.shift_s = clock.shift_s
            await check_end_state(inner, seeded, result)
        finally:
            await counting.close()
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gc", description=__doc__.split("\n")[0])
    parser.add_argument("--orphans", type=int, default=1000)
    parser.add_argument("--accepted", type=int, default=200, help="accepted batches beside them")
    parser.add_argument(
        "--conflicts", type=int, default=20, help="accepted batches re-sent with other content"
    )
    parser.add_argument(
        "--twin-orphans", type=int, default=100, help="orphans that are twins of accepted batches"
    )
    parser.add_argument(
        "--long-agent-orphans", type=int, default=10, help="orphans of 128-byte agent ids"
    )
    parser.add_argument(
        "--bundles", type=int, default=0, help="orphan bundles to plant (issue 33; 1,000: ~1 GiB)"
    )
    parser.add_argument("--bundle-frames", type=int, default=100, help="frames per orphan bundle")
    parser.add_argument(
        "--bundle-frame-bytes", type=int, default=10_240, help="about, per bundled frame"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 100 orphans (and at most 100 bundles) beside 50 batches",
    )
    parser.add_argument("--retry-horizon-s", type=float, default=RETRY_HORIZON_S)
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument(
        "--store",
        choices=("ministack", "fs"),
        default="ministack",
        help="fs: the file store (stamps the system clock), for a quick check of the harness",
    )
    parser.add_argument("--markdown", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    if args.quick:
        args.orphans, args.accepted, args.conflicts = min(args.orphans, 100), 50, 5
        args.twin_orphans = min(args.twin_orphans, 10)
        args.long_agent_orphans = min(args.long_agent_orphans, 4)
        args.bundles = min(args.bundles, 100)
    configure_logging(LoggingSettings(level="warning", format="console"))
    use_dummy_aws_credentials()
    work_dir = Path(tempfile.mkdtemp(prefix="lm-bench-gc-", dir=fast_temp_root()))
    uptimes = [uptime()]
    try:
        result = asyncio.run(run(args, work_dir))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    uptimes.append(uptime())
    result.uptime = uptimes
    report = render(result)
    print(report)
    if args.markdown:
        args.markdown.write_text(report + "\n")
    return 0 if all(ok for _what, ok, _detail in result.checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
