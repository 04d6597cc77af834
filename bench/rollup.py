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
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench._common import CLOCK_TICKS, busy_cpu_seconds, rss_bytes, wait_for_quiet
from bench.rollup_cluster import catalog
from protocol import keys
from protocol.frame_encode import encode_frame
from protocol.records import AcceptedManifest

NS_PER_S = 1_000_000_000
TARGET_RATIO = 1.8  # issue 15 (was 1.5)
_LABELS = pa.map_(pa.string(), pa.string())
_POINTS_FRAME_SCHEMA = pa.schema(
    [
        pa.field("ts", pa.timestamp("ns", tz="UTC")),
        pa.field("metric", pa.string()),
        pa.field("value", pa.float64()),
        pa.field("labels", _LABELS),
    ]
)


# --- dataset --------------------------------------------------------------------------------


def _agent_series(agent: int) -> tuple[pa.Array, pa.Array, np.ndarray, np.ndarray]:
    """(metric, labels, low, high) of one agent's 15 series."""
    base = {"host": f"host-{agent:04d}", "region": ("us-east-1", "eu-west-1")[agent % 2]}
    series: list[tuple[str, dict[str, str], float, float]] = [
        ("cpu_usage_percent", {**base, "cpu": str(c)}, 0.0, 100.0) for c in range(4)
    ]
    series.append(("memory_used_bytes", dict(base), 2e8, 8e9))
    series += [
        ("http_requests_total", {**base, "method": m, "status": s}, 0.0, 50.0)
        for m in ("GET", "POST", "PUT")
        for s in ("200", "404", "500")
    ]
    series.append(("disk_written_bytes_total", {**base, "device": "sda"}, 0.0, 1e7))
    return (
        pa.array([s[0] for s in series]),
        pa.array([list(s[1].items()) for s in series], _LABELS),
        np.array([s[2] for s in series]),
        np.array([s[3] for s in series]),
    )


def seed_store(
    root: Path, *, points: int, agents: int, per_frame: int, data_hours: int, seed: int
) -> dict[str, Any]:
    """Write accepted batches under ``root`` (the fs store layout: object K = file root/K)."""
    rng = np.random.default_rng(seed)
    per_agent = points // agents
    frames_per_agent = max(1, per_agent // per_frame)
    interval_ns = data_hours * 3600 * NS_PER_S // per_agent
    start_ns = keys.UtcHour.parse_iso("2026-11-21T00").start_ns
    accepted_at = time.time_ns()
    total_points = 0
    total_bytes = 0
    for agent in range(agents):
        metric, labels, low, high = _agent_series(agent)
        boot = uuid.UUID(int=agent + 1, version=4)
        agent_id = f"bench-agent-{agent:04d}"
        for batch in range(frames_per_agent):
            first = batch * per_frame
            count = per_frame if batch < frames_per_agent - 1 else per_agent - first
            pick = rng.integers(0, len(low), count)
            ts = start_ns + agent * 1_000_000 + (first + np.arange(count)) * interval_ns
            values = np.round(rng.uniform(low[pick], high[pick]), 3)
            table = pa.Table.from_arrays(
                [
                    pa.array(ts, pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
                    metric.take(pick),
                    pa.array(values),
                    labels.take(pick),
                ],
                schema=_POINTS_FRAME_SCHEMA,
            )
            frame = encode_frame(agent_id=agent_id, boot_id=boot, seq_start=first, points=table)
            manifest = AcceptedManifest.of_frame(
                frame, accepted_at_unix_ns=accepted_at, collector_id="bench"
            )
            objects = [(manifest.raw_blob_key, frame), (manifest.manifest_key, manifest.to_json())]
            for key, body in objects:
                path = root / key
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(body)
            total_points += count
            total_bytes += len(frame)
    _catalog(root)
    return {
        "points": total_points,
        "frames": agents * frames_per_agent,
        "frame_bytes": total_bytes,
        "series": agents * 15,
    }


def _catalog(root: Path) -> None:
    """Catalog the batches as production does: ``lm-reconciler run --once`` (its first
    pass audits the store: catalog files and the rollup's work markers), then keep a copy
    of the markers, which every timed run consumes (`restore_markers`)."""
    config = root.parent / f"{root.name}-reconciler.toml"
    config.write_text(
        f'[store]\nurl = "file://{root}"\n[gc]\nenabled = false\n[logging]\nlevel = "warning"\n'
    )
    catalog(config)
    saved = root.parent / f"{root.name}-markers"
    shutil.copytree(root / keys.ROLLUP_WORK_PREFIX, saved / keys.ROLLUP_WORK_PREFIX)


def restore_markers(store_dir: Path) -> None:
    """Nothing rolled up, every batch pending again: no ``rollup/``, the work markers back."""
    shutil.rmtree(store_dir / "rollup", ignore_errors=True)
    saved = store_dir.parent / f"{store_dir.name}-markers" / keys.ROLLUP_WORK_PREFIX
    shutil.rmtree(store_dir / keys.ROLLUP_WORK_PREFIX, ignore_errors=True)
    shutil.copytree(saved, store_dir / keys.ROLLUP_WORK_PREFIX)


# --- the two contestants (each runs in a child process) ------------------------------------


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
    sampler = _PeakSampler(os.getpid())

    async def once(spark: Any) -> dict[str, Any]:
        summary = await run_rollup(
            spark, store, access=access, settings=settings, clock=SystemClock()
        )
        assert summary.outcome == "committed", summary
        return {"points": summary.points, "seconds": dict(summary.seconds)}

    started = time.monotonic()
    cold_meter = _Meter(os.getpid(), sampler)
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
            meter = _Meter(os.getpid(), sampler)
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


def run_baseline(store_dir: Path, sampler: _PeakSampler) -> dict[str, Any]:
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


def _tree(pid: int) -> list[int]:
    found = [pid]
    for member in found:
        # A child is listed under the thread that forked it (the JVM forks from many).
        for task in Path(f"/proc/{member}/task").glob("*"):
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return found


def _rss(pid: int) -> int:
    try:
        return rss_bytes(pid)
    except (OSError, KeyError):  # gone, or a zombie
        return 0


def _tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid``'s process tree, including children they reaped."""
    total = 0.0
    for member in _tree(pid):
        try:
            stat = Path(f"/proc/{member}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += sum(int(v) for v in fields[11:15]) / CLOCK_TICKS  # utime stime cutime cstime
    return total


class _Meter:
    """Wall seconds, the tree's CPU (less the sampler's: it measures, it is not the job),
    the cores the rest of the machine used, and the tree's new processes (Python workers
    forked afresh), from creation to `stop`."""

    def __init__(self, pid: int, sampler: _PeakSampler) -> None:
        self._pid, self._sampler = pid, sampler
        self._members = set(_tree(pid))
        self._wall, self._busy = time.monotonic(), busy_cpu_seconds()
        self._ours, self._sampler_cpu = _tree_cpu(pid), sampler.cpu_s

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self._wall
        ours = _tree_cpu(self._pid) - self._ours
        others = max(0.0, busy_cpu_seconds() - self._busy - ours)
        sampler = self._sampler.cpu_s - self._sampler_cpu
        return {
            "wall": wall,
            "cpu_s": ours - sampler,
            "sampler_cpu_s": sampler,
            "others_cores": others / wall,
            "new_processes": len(set(_tree(self._pid)) - self._members),
        }


class _PeakSampler:
    """Samples the summed RSS of a process tree (minus excluded children) every 100 ms;
    the tree (walking every JVM thread's children) is listed again once a second."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._excluded: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.peak = 0
        self.cpu_s = 0.0  # this thread's own CPU

    def exclude(self, pid: int) -> None:
        self._excluded.add(pid)

    def _run(self) -> None:
        started = time.thread_time()
        members: list[int] = []
        for tick in itertools.count():
            if self._stop.is_set():
                break
            if tick % 10 == 0:
                members = _tree(self._pid)
            self.peak = max(self.peak, sum(_rss(p) for p in members if p not in self._excluded))
            self.cpu_s = time.thread_time() - started
            time.sleep(0.1)

    def __enter__(self) -> _PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- report ---------------------------------------------------------------------------------


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
