"""`bench.steady_lag`: the reconciler daemon's catalog lag under a synthetic index log
(issue 22, second "Done when"; PROTOCOL §3.7, §3.9).

1. A fresh filesystem store (``file://``; by default on tmpfs, ``/dev/shm``: a small file
   costs ~20 us of CPU to create there against ~60-110 us and a slow delete on this
   machine's disk, and ~4.6 KiB of memory, so the run refuses what would take more than
   half the available memory) with its 65,536 blob directories made up front;
   the real daemon (``lm-reconciler run``, its own process and session, metrics on, the
   deployment's settings but ``reconciler.max_audit_interval_s`` = ``--audit-interval-s``
   so full audits run inside the window); its first pass audits the empty store.
2. ``--writer-procs`` processes of `bench.steady_lag_writer` play ``--writers`` (40)
   collectors for ``--duration-s`` (300) at ``--rate`` (5,000) batches/s in total: real
   `IndexLogWriter`s (about one segment per writer per second), blob and manifest files,
   ``own_create`` rows with the manifest's real ETag (1 % read-derived rows).
3. Every ``--sample-s`` (2) this process samples:
   - **lag** as ``lm-reconciler status`` defines it: how long the oldest segment not yet
     consumed has waited, from its first row's time (`reconciler.status`); here computed
     from the writers' ledger (every segment's key and the moment its create returned)
     and the stored checkpoint (``log_through_ns`` and ``log_seen``), with no listing;
     also **since written** (the same, from the moment the segment's create returned:
     the reconciler's own share, without the flush age);
   - the daemon's gauge ``lm_reconciler_log_lag_seconds`` from its ``/metrics`` (read at
     each scrape from what the steady pass listed and has not consumed yet,
     `reconciler.log_lag`: an upper bound of the lag, fresh also while a pass runs);
   - whether a full audit is running (the newest audit record's status);
   - CPU (``/proc``) of the daemon, the writers and everything else, and the daemon's RSS.
4. When the writers are done, sampling goes on until every segment is consumed; then the
   daemon is stopped (its whole-life CPU read before it is reaped) and the catalog is read
   back: every batch written must be cataloged.

Target: the lag stays under 2 x ``reconciler.loop_interval_s`` (20 s) throughout, also
while a full audit runs.

    .venv/bin/python -m bench.steady_lag                       # 5,000/s, 40 writers, 5 min
    .venv/bin/python -m bench.steady_lag --rate 500 --duration-s 60 --audit-interval-s 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp

from bench import _common as c
from bench.proc_exit import stop_exit_cpu, uptime, wait_exit_cpu
from bench.steady_lag_report import Run, Sample, catalog_check, render
from bench.steady_lag_watch import (
    Ledger,
    audits_in,
    children_cpu_seconds,
    daemon_events,
    gauge,
    read_checkpoint_file,
    writer_totals,
)
from chaos.s3_server import child_env
from config import Settings
from protocol import keys
from reconciler.audit.records import latest_audit, latest_completed_audit
from store.fs import FileSystemStore

NS = 1_000_000_000


def make_blob_dirs(root: Path) -> None:
    """``raw-blobs/v1/sha256/xx/yy/`` for every xx, yy: ~20 s of mkdir, before the clock."""
    base = root / keys.RAW_BLOBS_PREFIX

    def one_top(top: int) -> None:
        for second in range(256):
            (base / f"{top:02x}" / f"{second:02x}").mkdir(parents=True, exist_ok=True)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one_top, range(256)))


def spawn(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, *command],
            env=env,
            cwd=c.REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: scheduled like a separate service
        )


async def measure(args: argparse.Namespace, work: Path) -> Run:
    defaults = Settings()
    run = Run(
        args={k: v for k, v in vars(args).items() if k not in ("work_dir", "json", "markdown")},
        settings={
            "reconciler.loop_interval_s": defaults.reconciler.loop_interval_s,
            "reconciler.lookback_s": defaults.reconciler.lookback_s,
            "reconciler.max_audit_interval_s": args.audit_interval_s,
            "reconciler.concurrency": defaults.reconciler.concurrency,
            "reconciler.verify_sample_rate": defaults.reconciler.verify_sample_rate,
            "reconciler.verify_rate_per_s": defaults.reconciler.verify_rate_per_s,
            "writer flush_max_age_s": 1.0,
        },
    )
    root, logs = work / "store", work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    store = FileSystemStore(root)
    print("making blob directories ...", flush=True)
    await asyncio.to_thread(make_blob_dirs, root)
    port = c.free_ports(1)[0]
    env = child_env(
        {
            "LM_STORE__URL": f"file://{root}",
            "LM_METRICS__ENABLED": "true",
            "LM_METRICS__HOST": "127.0.0.1",
            "LM_METRICS__PORT": str(port),
            "LM_LOGGING__FORMAT": "json",
            "LM_LOGGING__LEVEL": "info",
            "LM_RECONCILER__MAX_AUDIT_INTERVAL_S": str(args.audit_interval_s),
        }
    )
    run.uptime["start"] = uptime()
    reconciler = spawn(["-m", "reconciler", "run"], env, logs / "reconciler.log")
    writers: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.monotonic() + 300
        while await latest_completed_audit(store) is None:
            if reconciler.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the daemon's first audit did not complete; see reconciler.log")
            await asyncio.sleep(0.5)  # polling the store, bounded by the deadline
        ledger = Ledger(work / "ledger")  # the writers append to it
        per_proc = args.writers // args.writer_procs
        for p in range(args.writer_procs):
            count = per_proc if p < args.writer_procs - 1 else args.writers - per_proc * p
            command = [
                "-m", "bench.steady_lag_writer", "--root", str(root), "--ledger", str(work / "ledger"),
                "--rate", str(args.rate), "--writers", str(count), "--total-writers",
                str(args.writers), "--first-writer", str(per_proc * p), "--duration-s",
                str(args.duration_s), "--read-fraction", str(args.read_fraction),
            ]  # fmt: skip
            writers.append(spawn(command, child_env(), logs / f"writer-{p}.log"))
        await sample_until_caught_up(args, run, ledger, store, reconciler, writers, port, logs)
        exited = await asyncio.to_thread(stop_exit_cpu, reconciler)
        run.reconciler_cpu_s = exited.cpu_s
        run.uptime["end"] = uptime()
        run.catalog = await asyncio.to_thread(catalog_check, root)
        run.catalog["expected"] = sum(int(w.get("batches", 0)) for w in run.writers)
    finally:
        for process in [reconciler, *writers]:
            if process.returncode is None:
                c.stop_pid_process(process)
    return run


async def sample_until_caught_up(
    args: argparse.Namespace,
    run: Run,
    ledger: Ledger,
    store: FileSystemStore,
    reconciler: subprocess.Popen[bytes],
    writers: list[subprocess.Popen[bytes]],
    port: int,
    logs: Path,
) -> None:
    started = time.monotonic()
    started_unix = time.time()
    writer_pids = [w.pid for w in writers]
    last = {"reconciler": 0.0, "writers": 0.0, "machine": c.busy_cpu_seconds(), "t": started}
    last["reconciler"] = c.cpu_seconds(reconciler.pid)
    last["worker"] = children_cpu_seconds(reconciler.pid)[0]
    last["writers"] = sum(c.cpu_seconds(pid) for pid in writer_pids)
    writer_cpu_done = 0.0
    running = list(writers)
    run.uptime["writers start"] = uptime()
    url = f"http://127.0.0.1:{port}/metrics"
    async with aiohttp.ClientSession() as http:
        while True:
            await asyncio.sleep(args.sample_s)  # the sampling period
            for process in [p for p in running if _exited(p)]:  # reaped by wait_exit_cpu only
                exited = await asyncio.to_thread(wait_exit_cpu, process, 60.0)
                writer_cpu_done += exited.cpu_s
                running.remove(process)
                run.writers = await asyncio.to_thread(writer_totals, logs)
                if not running:
                    run.uptime["writers end"] = uptime()
            now = time.monotonic()
            ledger.read()
            checkpoint = await asyncio.to_thread(read_checkpoint_file, store.root)
            ledger.note(checkpoint)
            lag, lag_written = ledger.lag(time.time_ns())
            audit = await latest_audit(store, catalog_only=True)
            rec = c.cpu_seconds(reconciler.pid)
            worker, worker_rss = children_cpu_seconds(reconciler.pid)
            wri = writer_cpu_done + sum(c.cpu_seconds(p.pid) for p in running)
            machine = c.busy_cpu_seconds()
            dt = now - last["t"]
            sample = Sample(
                t_s=round(now - started, 1),
                lag_s=round(lag, 2),
                lag_written_s=round(lag_written, 2),
                gauge_s=await gauge(http, url),
                checkpoint_age_s=None
                if checkpoint is None
                else round((time.time_ns() - checkpoint.updated_at_unix_ns) / NS, 1),
                waiting=len(ledger.pending),
                written=len(ledger.written),
                audit=audit.status if audit else None,
                reconciler_cores=round((rec - last["reconciler"]) / dt, 2),
                audit_worker_cores=round((worker - last["worker"]) / dt, 2),
                writer_cores=round((wri - last["writers"]) / dt, 2),
                others_cores=round(
                    max(
                        0.0,
                        (machine - last["machine"])
                        - (rec - last["reconciler"])
                        - (worker - last["worker"])
                        - (wri - last["writers"]),
                    )
                    / dt,
                    2,
                ),
                reconciler_rss_mib=round(c.rss_bytes(reconciler.pid) / c.MiB, 1),
                audit_worker_rss_mib=round(worker_rss / c.MiB, 1),
            )
            run.samples.append(sample)
            run.audit_worker_cpu_s = worker
            run.audit_worker_peak_rss_mib = max(
                run.audit_worker_peak_rss_mib, sample.audit_worker_rss_mib
            )
            last.update(reconciler=rec, worker=worker, writers=wri, machine=machine, t=now)
            print(
                f"t={sample.t_s:6.1f}s lag {sample.lag_s:5.1f}s (written {sample.lag_written_s:5.1f}s,"
                f" gauge {sample.gauge_s}) waiting {sample.waiting:4d}/{sample.written} "
                f"audit {sample.audit} cores rec {sample.reconciler_cores} "
                f"audit worker {sample.audit_worker_cores} "
                f"writers {sample.writer_cores} others {sample.others_cores} "
                f"rss {sample.reconciler_rss_mib} MiB",
                flush=True,
            )
            if reconciler.poll() is not None:
                raise RuntimeError("the daemon exited during the run; see reconciler.log")
            if not running and not ledger.pending:
                run.catch_up_s = now - started - args.duration_s
                break
            if not running and now - started > args.duration_s + args.catch_up_max_s:
                break
    run.writer_cpu_s = writer_cpu_done
    run.reconciler_peak_rss_mib = c.peak_rss_bytes(reconciler.pid) / c.MiB
    run.never_consumed = len(ledger.pending)
    run.audits = await audits_in(store)
    run.events = await asyncio.to_thread(daemon_events, logs / "reconciler.log", started_unix)


def _exited(process: subprocess.Popen[bytes]) -> bool:
    return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.steady_lag", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rate", type=float, default=5_000.0, help="batches/s, all writers")
    parser.add_argument("--writers", type=int, default=40)
    parser.add_argument("--writer-procs", type=int, default=2)
    parser.add_argument("--duration-s", type=float, default=300.0)
    parser.add_argument("--read-fraction", type=float, default=0.01)
    parser.add_argument("--audit-interval-s", type=float, default=120.0)
    parser.add_argument("--sample-s", type=float, default=2.0)
    parser.add_argument("--catch-up-max-s", type=float, default=600.0)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--keep-work-dir", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    return parser.parse_args(argv)


TMPFS = Path("/dev/shm")
FILE_BYTES = 4_600  # a small file on tmpfs: one page, plus its inode and dentry


def memory_check(args: argparse.Namespace) -> str | None:
    """Blobs and manifests are two files per batch; on tmpfs each holds a page of memory.
    Refuse a run that would take more than half the available memory (a shared machine)."""
    needed = 2 * args.rate * args.duration_s * FILE_BYTES
    available = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) * 1024
    if needed > available / 2:
        return (
            f"the store would hold ~{needed / 2**30:.1f} GiB of files in memory (tmpfs), more "
            f"than half of the {available / 2**30:.1f} GiB available: lower --rate or "
            "--duration-s, or give --work-dir on a disk"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM ends the run like Ctrl-C: the finally blocks stop every child by its PID.
    signal.signal(signal.SIGTERM, c.exit_on_sigterm)
    on_tmpfs = args.work_dir is None and TMPFS.is_dir()
    if on_tmpfs and (problem := memory_check(args)):
        print(f"bench.steady_lag: {problem}", file=sys.stderr)
        return 2
    work = args.work_dir or Path(
        tempfile.mkdtemp(prefix="bench-steady-lag-", dir=TMPFS if on_tmpfs else None)
    )
    try:
        run = asyncio.run(measure(args, work))
    finally:
        if not args.keep_work_dir:
            shutil.rmtree(work, ignore_errors=True)
    text, summary = render(run)
    c.publish(text, summary, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
