"""Rollup job benchmark: the Spark job against a single-process pyarrow baseline.

    .venv/bin/python -m bench.rollup                                  # 1M and 10M points
    .venv/bin/python -m bench.rollup --points 1000000 --rounds 1      # quick

Per size, a temp fs store is seeded with accepted batches as collectors leave them (raw
blob and accepted manifest, then cataloged by ``lm-reconciler run --once``): ``--agents`` agents x 15
series (like `agent.load`), ``--points-per-frame`` points per zstd frame, timestamps over
``--data-hours`` hours. One child process then runs ``lm-rollup run``'s code path:

1. **job end to end**: `local_spark` (``local[*]``) + `run_rollup` (plan, Spark stages,
   commit), timed from before the session starts to the commit (a cold JVM);
2. ``--rounds`` times, alternated so both see the same load from other users:
   - **baseline**: a fresh child process, no Spark, doing the job's executor work by
     calling `rollup.job.frame_stage` and `rollup.job.hour_stage` in sequence: fetch each frame,
     verify its sha256, decode, write ``points`` Parquet, pre-aggregate, merge per hour,
     write ``rollup_1m`` and ledger Parquet. Work items come from the job's planner (not
     timed); nothing is committed;
   - **job, steady state**: ``rollup/v1/`` is deleted (everything is pending again) and
     the job runs on the warm session: plan + stages + commit, all timed.

Reported: seconds, rows/s (points / seconds), CPU seconds of the timed part (baseline:
`time.process_time`; job: driver, JVM and Python workers from /proc), peak memory
(baseline: the child's ``ru_maxrss``; job: the highest summed RSS of driver, JVM and
workers, sampled every 100 ms, shared pages counted per process) and ``others``: cores
the rest of the machine used meanwhile. Two load-insensitive ratios go with the wall one:
CPU-bound with all cores free (baseline CPU / (job CPU / cores)), and baseline CPU / job
CPU, which is what the wall ratio tends to when other sessions are busy: with
``sched_autogroup`` on, the kernel shares CPU per session, so the job's Python workers
together get the share the baseline's one process gets. Target: steady state >= 1.8x
the baseline at 10M points. Benchmarks are not tests: nothing in ``tests/`` imports this.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bench._common import busy_cpu_seconds, wait_for_quiet
from bench.proc_tree import PeakSampler, TreeMeter
from bench.rollup_seed import restore_markers, seed_store

NS_PER_S = 1_000_000_000
TARGET_RATIO = 1.8  # issue 15 (was 1.5)


def baseline_main(store_dir: Path) -> dict[str, Any]:
    """Single-process: the executors' work, in sequence, with pyarrow only."""
    from config.settings import RollupSettings
    from rollup.job.frame_stage import FrameStage
    from rollup.job.hour_stage import write_hour
    from rollup.job.plan import make_plan
    from rollup.job.tasks import STAGE1_SCHEMA, WORK_SCHEMA, HourInputs, WriteOptions
    from rollup.table.storage import StoreAccess
    from store.fs import FileSystemStore

    store = FileSystemStore(store_dir)
    plan = asyncio.run(make_plan(store, None))
    settings = RollupSettings()
    options = WriteOptions(
        access=StoreAccess(store.url),
        compression=settings.compression,
        row_group_size=settings.parquet_row_group_size,
    )
    work = plan.items.cast(WORK_SCHEMA)
    started, cpu_started = time.monotonic(), time.process_time()  # all threads
    stage1 = pa.Table.from_batches(FrameStage(options).run(iter(work.to_batches())), STAGE1_SCHEMA)
    results = [
        write_hour(options, HourInputs(), hour, stage1.filter(pc.equal(stage1["hour"], hour)))
        for hour in sorted(set(stage1["hour"].to_pylist()))
    ]
    seconds, cpu_s = time.monotonic() - started, time.process_time() - cpu_started
    paths = [
        json.loads(body)["path"]
        for r in results
        for kind, body in zip(r["kind"].to_pylist(), r["body"].to_pylist(), strict=True)
        if kind in ("points_file", "rollup_file", "ledger_file")
    ]
    for path in paths:
        (store_dir / path).unlink()
    return {"seconds": seconds, "cpu_s": cpu_s, "points": plan.records, "files": len(paths)}


def job_main(store_dir: Path, rounds: int) -> dict[str, Any]:
    """``lm-rollup run``'s path: a local session and a cold job, then ``rounds`` times a
    baseline child followed by a warm job, so both see the same neighbours' load."""
    import logging

    from config.settings import RollupSettings
    from protocol.clock import SystemClock
    from rollup.job.run import run_rollup
    from rollup.job.spark_session import local_spark
    from rollup.table.storage import StoreAccess
    from store.fs import FileSystemStore

    logging.getLogger("py4j").setLevel(logging.WARNING)
    store = FileSystemStore(store_dir)
    access = StoreAccess(store.url)
    settings = RollupSettings()
    sampler = PeakSampler(os.getpid())

    async def once(spark: Any) -> dict[str, Any]:
        summary = await run_rollup(
            spark, store, access=access, settings=settings, clock=SystemClock()
        )
        assert summary.outcome == "committed", summary
        return {"points": summary.points, "seconds": dict(summary.seconds)}

    started = time.monotonic()
    cold_meter = TreeMeter(os.getpid(), sampler)
    with sampler, local_spark(master="local[*]") as spark:
        session_s = time.monotonic() - started
        cold = asyncio.run(once(spark))
        cold_total = time.monotonic() - started
        cold.update(cold_meter.stop())
        baseline: list[dict[str, Any]] = []
        warm: list[dict[str, Any]] = []
        for _ in range(rounds):
            restore_markers(store_dir)
            baseline.append(run_baseline(store_dir, sampler))
            restore_markers(store_dir)  # everything is pending again
            meter = TreeMeter(os.getpid(), sampler)
            result = asyncio.run(once(spark))
            result.update(meter.stop())
            warm.append(result)
    return {
        "session_start_s": session_s,
        "end_to_end_s": cold_total,
        "cold": cold,
        "warm": warm,
        "baseline": baseline,
        "job_peak_rss_bytes": sampler.peak,
        "points": cold["points"],
    }


def run_baseline(store_dir: Path, sampler: PeakSampler) -> dict[str, Any]:
    """One baseline child: its timed work, peak RSS, and the load around it."""
    out = store_dir.parent / "baseline.json"
    command = [sys.executable, "-m", "bench.rollup", "_baseline", str(store_dir), str(out)]
    busy_before = busy_cpu_seconds()
    wall_before = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    sampler.exclude(process.pid)
    # wait4: the child's own CPU and peak RSS (ru_maxrss, KiB on Linux).
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"baseline child failed with exit code {process.returncode}")
    wall = time.monotonic() - wall_before
    result: dict[str, Any] = json.loads(out.read_text())
    ours = usage.ru_utime + usage.ru_stime  # the whole child; its "cpu_s" is the timed part
    result["peak_rss_bytes"] = usage.ru_maxrss * 1024
    result["others_cores"] = max(0.0, busy_cpu_seconds() - busy_before - ours) / wall
    return result


# --- measuring a child ------------------------------------------------------------------------


def measure(size: int, args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    store_dir = work_dir / f"store-{size}"
    store_dir.mkdir()
    started = time.monotonic()
    data = seed_store(
        store_dir,
        points=size,
        agents=args.agents,
        per_frame=args.points_per_frame,
        data_hours=args.data_hours,
        seed=args.seed,
    )
    print(
        f"seeded {data['points']:,} points in {data['frames']:,} frames "
        f"({data['frame_bytes'] / 2**20:.0f} MiB) in {time.monotonic() - started:.0f}s",
        file=sys.stderr,
    )
    wait_for_quiet(max_wait_s=args.quiet_wait_s)
    out = work_dir / "job.json"
    command = [sys.executable, "-m", "bench.rollup", "_job", str(store_dir), str(out)]
    # The child's log lines are not wanted here; its results come back in a file.
    subprocess.run([*command, str(args.rounds)], stdout=subprocess.DEVNULL, check=True)
    shutil.rmtree(store_dir)
    shutil.rmtree(work_dir / f"store-{size}-markers", ignore_errors=True)
    return {"size": size, "data": data, **json.loads(out.read_text())}


def _row(
    points: int,
    name: str,
    seconds: float,
    peak: int | None = None,
    others: list[float] | None = None,
    cpu: list[float] | None = None,
) -> str:
    peak_text = f"{peak / 2**20:9.0f}" if peak else f"{'':>9}"
    load = f"{max(others):7.2f}" if others else f"{'':>7}"
    cpu_text = f"{statistics.median(cpu):7.1f}" if cpu else f"{'':>7}"
    return (
        f"{points:>11,} {name:<34} {seconds:8.2f} {points / seconds:10,.0f} {peak_text} "
        f"{cpu_text} {load}"
    )


def report(results: list[dict[str, Any]]) -> str:
    head = (
        f"{'points':>11} {'phase':<34} {'seconds':>8} {'rows/s':>10} {'peak MiB':>9} "
        f"{'CPU s':>7} {'others':>7}"
    )
    lines = [head]
    for r in results:
        points = r["data"]["points"]
        base = sorted(b["seconds"] for b in r["baseline"])
        warm = sorted(w["wall"] for w in r["warm"])
        stages = sorted(w["seconds"]["stages"] for w in r["warm"])
        base_cpu = [b["cpu_s"] for b in r["baseline"]]
        job_cpu = [w["cpu_s"] for w in r["warm"]]
        lines += [
            _row(points, "baseline, median (1 process)", statistics.median(base),
                 max(b["peak_rss_bytes"] for b in r["baseline"]),
                 [b["others_cores"] for b in r["baseline"]], base_cpu),
            _row(points, "baseline, best", base[0]),
            _row(points, "job end to end (cold session)", r["end_to_end_s"],
                 others=[r["cold"]["others_cores"]], cpu=[r["cold"]["cpu_s"]]),
            _row(points, "job steady state, median", statistics.median(warm),
                 r["job_peak_rss_bytes"], [w["others_cores"] for w in r["warm"]], job_cpu),
            _row(points, "job steady state, best", warm[0]),
            _row(points, "  Spark stages only, best", stages[0]),
        ]  # fmt: skip
        ratio = statistics.median(base) / statistics.median(warm)
        best = base[0] / warm[0]
        verdict = "PASS" if ratio >= TARGET_RATIO else "MISS"
        target = verdict if points >= 10_000_000 else "n/a"
        cores = os.cpu_count() or 1
        cpu_ratio = statistics.median(base_cpu) / statistics.median(job_cpu)
        lines.append(
            f"{'':>11} steady state / baseline: median {ratio:.2f}x, best {best:.2f}x "
            f"(target {TARGET_RATIO}x at 10M points: {target}); CPU-bound with {cores} "
            f"free cores: {cpu_ratio * cores:.2f}x; baseline CPU / job CPU: {cpu_ratio:.2f}x; "
            f"new processes per warm run: {[w['new_processes'] for w in r['warm']]}"
        )
    lines.append(
        "CPU s = median CPU seconds of the timed part (job: driver, JVM, Python workers); "
        "others = the most cores other processes used during any one of those runs "
        f"(this machine has {os.cpu_count()}; sched_autogroup {_autogroup()})"
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.rollup", description=__doc__)
    parser.add_argument("--points", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--points-per-frame", type=int, default=10_000)
    parser.add_argument("--data-hours", type=int, default=2)
    parser.add_argument(
        "--rounds", type=int, default=3, help="baseline + warm job pairs, alternated"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quiet-wait-s", type=float, default=30.0)
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--keep-work-dir", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("_baseline", "_job"):
        store_dir, out = Path(argv[1]), Path(argv[2])
        if argv[0] == "_baseline":
            result = baseline_main(store_dir)
        else:
            result = job_main(store_dir, int(argv[3]))
        out.write_text(json.dumps(result))
        return 0
    args = parse_args(argv)
    work_dir = Path(tempfile.mkdtemp(prefix="lm-bench-rollup-"))
    try:
        results = [measure(size, args, work_dir) for size in args.points]
    finally:
        if not args.keep_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    print(
        f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cores, "
        f"python {platform.python_version()}, pyspark {_version('pyspark')}, "
        f"pyarrow {pa.__version__}; {args.agents} agents x 15 series, "
        f"{args.points_per_frame:,} points/frame, {args.data_hours} data hours"
    )
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _autogroup() -> str:
    try:
        return (
            "on"
            if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text()[0] == "1"
            else "off"
        )
    except OSError:
        return "unknown"


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    sys.exit(main())
