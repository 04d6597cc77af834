"""`bench.join_spark`: the full audit's joins on the Spark engine, on a local session.

What it measures (issue 23 item 5, "what an audit costs on each engine"): the audit's code
(`reconciler.audit.engines.spark_joins.SparkAuditJoins`, the same SQL as the local engine that
`bench.join` measures) over the same synthetic data (`bench.join_parts.generate`: listing
parts, pinned catalog files, ``expected.json``), in a fresh child process that is the Spark
driver of a ``local[2]`` session (`rollup.job.spark_session.local_spark` with the audit's
`reconciler.audit.engines.spark_run.SPARK_CONF`).

The inputs are store keys under one ``file://`` store root (`StoreAccess`), laid out by
symbolic links into the data directory: ``index/`` (the catalog files,
``index/v1/catalog/…``) and ``listing/`` (the listing parts). The constructor reads the
listing and the catalog on the executors (as `fetch_catalog` does for the local engine),
`SparkAuditJoins.run` runs both joins and brings their results to local files; the run
then checks them exactly as `bench.join.run_join` does (missing, ETag, conflict, phantom,
junk, orphan, missing blob).

Reported, per phase (session start, read listing + catalog, record join, blob join) and
for the whole audit (everything after the session started): wall seconds; CPU seconds of
the driver (the child Python process, less the RSS sampler's thread) and of the Spark JVM
(the ``java`` process and the Python workers it forks, which are the executors' tasks in
local mode; reaped workers count through ``cutime``); peak RSS of the driver (``VmHWM``),
of the JVM alone (``VmHWM``) and of the JVM with its Python workers (sampled every 100 ms).
A run longer than ``--timeout-s`` is stopped (the phases done so far are on stderr).

    .venv/bin/python -m bench.join_spark --manifests 1000000 --work-dir /tmp/jsb --keep
    .venv/bin/python -m bench.join --manifests 1000000 --work-dir /tmp/jsb --keep --threads 2
    .venv/bin/python -m bench.join_spark --manifests 10000000 --work-dir /tmp/jsb --keep \
        --driver-memory 8g   # 1g and 4g ran out of heap at 10M (bench/RESULTS.md)

(the second, the local engine on the same data, for the ratio). Data are generated as
`bench.join` generates them, in the same directory, and reused when present.
``--driver-memory`` is the local session's heap (driver and executors are one JVM in
local mode); ``--conf KEY=VALUE`` adds Spark settings (e.g. ``spark.default.parallelism``,
which sets how many partitions the engine splits its inputs into: 4 a core by default).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench._common import REPO_ROOT, MiB, cpu_seconds, peak_rss_bytes
from bench.join import check_results
from bench.join_parts import Plan, generate
from bench.proc_tree import PeakSampler, tree_cpu, tree_pids
from config import Settings
from protocol import keys

MODULE = "bench.join_spark"
MASTER = "local[2]"


def store_root(work: Path, data_dir: Path) -> Path:
    """A store root whose keys ``index/…`` and ``listing/…`` are the data's files."""
    root = work / f"store-{data_dir.name}"
    root.mkdir(parents=True, exist_ok=True)
    for name, target in (
        ("index", data_dir / "catalog" / "index"),
        ("listing", data_dir / "listing"),
    ):
        link = root / name
        if not link.is_symlink():
            link.symlink_to(target.resolve(), target_is_directory=True)
    return root


def input_keys(data_dir: Path, meta: dict[str, Any]) -> tuple[dict[str, list[str]], list[str]]:
    """The listing parts (per kind) and catalog files as store keys of `store_root`."""
    listing = {
        kind: [str(Path(p).resolve().relative_to(data_dir.resolve())) for p in paths]
        for kind, paths in meta["listing"].items()
    }
    catalog_dir = data_dir / "catalog"
    names = sorted(
        str(p.relative_to(catalog_dir))
        for p in (catalog_dir / keys.INDEX_CATALOG_PREFIX).rglob("*.parquet")
    )
    for name in names[:1]:
        keys.parse_index_catalog_key(name)  # the engine ranks them by it
    return listing, names


def jvm_pid(driver: int) -> int:
    """The ``java`` process the driver started (py4j's gateway: Spark's driver JVM)."""
    for pid in tree_pids(driver)[1:]:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                return pid
        except OSError:
            continue
    raise RuntimeError("no Spark JVM under this process")


class Meter:
    """Wall, driver CPU (less the sampler's) and JVM-tree CPU between `mark`s."""

    def __init__(self, jvm: int, sampler: PeakSampler) -> None:
        self.jvm, self.sampler, self.driver = jvm, sampler, os.getpid()
        self.phases: dict[str, dict[str, float]] = {}
        self._last = self._read()
        self.first = self._last

    def _read(self) -> tuple[float, float, float]:
        driver = cpu_seconds(self.driver) - self.sampler.cpu_s
        return time.monotonic(), driver, tree_cpu(self.jvm)

    def mark(self, name: str) -> None:
        now = self._read()
        self.phases[name] = diff(self._last, now)
        self._last = now
        print(f"  {name}: {self.phases[name]}", file=sys.stderr, flush=True)

    def total(self) -> dict[str, float]:
        return diff(self.first, self._last)


def diff(before: tuple[float, float, float], after: tuple[float, float, float]) -> dict[str, float]:
    return {
        "wall_s": round(after[0] - before[0], 2),
        "driver_cpu_s": round(after[1] - before[1], 2),
        "jvm_cpu_s": round(after[2] - before[2], 2),
    }


def run_spark_join(
    data_dir: Path, store: Path, master: str, driver_memory: str, extra: dict[str, str]
) -> dict[str, Any]:
    """Start a session, join, check; in this process (run it in a fresh one)."""
    import logging

    from reconciler.audit.engines.duckdb_joins import JoinLimits
    from reconciler.audit.engines.spark_joins import SparkAuditJoins
    from reconciler.audit.engines.spark_run import SPARK_CONF
    from rollup.job.spark_session import local_spark
    from rollup.table.storage import StoreAccess

    logging.getLogger("py4j").setLevel(logging.WARNING)
    meta = json.loads((data_dir / "expected.json").read_text())
    expected = meta["expected"]
    settings = Settings()
    start_ns = int(meta["start_ns"])
    margin_ns = int(settings.settle_margin_s() * keys.NS_PER_S)
    limits = JoinLimits(
        born_before_ns=start_ns + margin_ns,
        phantom_before_ns=start_ns - margin_ns,
        orphan_before_ns=start_ns - int(settings.gc.retry_horizon_s * keys.NS_PER_S),
    )
    listing, names = input_keys(data_dir, meta)
    access = StoreAccess(store.resolve().as_uri())
    prefix = f"results/{uuid.uuid4().hex}/"
    out_dir = Path(tempfile.mkdtemp(prefix="spark-out-", dir=store.parent))
    conf = {**SPARK_CONF, "spark.driver.memory": driver_memory, **extra}
    started = time.monotonic()
    driver_cpu0 = cpu_seconds(os.getpid())
    sampler = PeakSampler(os.getpid())
    sampler.exclude(os.getpid())  # the driver's own peak is its VmHWM
    try:
        with (
            sampler,
            local_spark(master=master, app_name="bench-join-spark", extra_conf=conf) as spark,
        ):
            jvm = jvm_pid(os.getpid())
            session = {
                "wall_s": round(time.monotonic() - started, 2),
                "driver_cpu_s": round(cpu_seconds(os.getpid()) - driver_cpu0, 2),
                "jvm_cpu_s": round(tree_cpu(jvm), 2),
            }
            print(f"  session start: {session}", file=sys.stderr, flush=True)
            meter = Meter(jvm, sampler)
            memory_mb = max(64, settings.reconciler.audit_memory_limit_mb // 2)  # as spark_run
            with SparkAuditJoins(
                spark,
                access,
                listing,  # type: ignore[arg-type]
                names,
                results_prefix=prefix,
                out_dir=str(out_dir),
                memory_limit_mb=memory_mb,
            ) as joins:
                meter.mark(f"read listing + {len(names)} catalog files")
                result = joins.run_records(limits)
                meter.mark("record join (records.parquet)")
                joins.run_blobs(limits, result, ())
                meter.mark("blob join (blobs, referencing)")
                unreadable = joins.unreadable
            audit = meter.total()
            jvm_tree = tree_pids(jvm)
            jvm_peak = peak_rss_bytes(jvm)
            checks = check_results(result, unreadable, expected)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
        shutil.rmtree(store / "results", ignore_errors=True)
    return {
        "session": session,
        "phases": meter.phases,
        "audit": audit,
        "catalog_files": len(names),
        "listing_parts": sum(len(v) for v in listing.values()),
        "listed": result.listed_old,
        "young": result.listed_young,
        "blobs_listed": result.blobs_listed,
        "reasons": result.reasons,
        "driver_peak_rss_bytes": peak_rss_bytes(os.getpid()),
        "jvm_peak_rss_bytes": jvm_peak,
        "jvm_tree_peak_rss_bytes": sampler.peak,
        "jvm_tree_processes_at_end": len(jvm_tree),
        "checks": checks,
    }


def ensure_data(work: Path, plan: Plan) -> tuple[Path, float | None]:
    """`bench.join`'s data directory for ``plan``, generated as it generates it if absent."""
    data_dir = work / f"parts-{plan.manifests}-{plan.rows_per_file}"
    if (data_dir / "expected.json").exists():
        return data_dir, None
    data_dir.mkdir(parents=True, exist_ok=True)
    print(f"generating {plan} in {data_dir} ...", flush=True)
    started = time.monotonic()
    generate(plan, data_dir, start_ns=time.time_ns(), horizon_s=Settings().gc.retry_horizon_s)
    seconds = round(time.monotonic() - started)
    print(f"  generated in {seconds} s", flush=True)
    return data_dir, seconds


def run_child(args: list[str], timeout_s: float) -> dict[str, Any]:
    """The child (the Spark driver), its stderr passed through; stopped by PID past the
    deadline (its JVM exits with it: py4j's gateway ends when the driver's pipe closes)."""
    process = subprocess.Popen(
        [sys.executable, "-m", MODULE, "--child", *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        out, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise SystemExit(f"stopped after {timeout_s:.0f} s (phases so far above)") from None
    if process.returncode != 0:
        raise SystemExit(f"child failed ({process.returncode}), its error above")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    parser.add_argument("--manifests", type=int, default=1_000_000)
    parser.add_argument("--rows-per-file", type=int, default=10_000)
    parser.add_argument("--master", default=MASTER)
    parser.add_argument(
        "--driver-memory", default="1g", help="spark.driver.memory (Spark's default)"
    )
    parser.add_argument("--timeout-s", type=float, default=1500.0)
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temp dir")
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the data")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="more Spark settings"
    )
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        data_dir, store, master, memory, extra = args.child
        conf = json.loads(extra)
        print(json.dumps(run_spark_join(Path(data_dir), Path(store), master, memory, conf)))
        return 0
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="lm-join-spark-"))
    try:
        plan = Plan(manifests=args.manifests, rows_per_file=args.rows_per_file)
        data_dir, generated_s = ensure_data(work, plan)
        store = store_root(work, data_dir)
        disk = sum(p.stat().st_size for p in data_dir.rglob("*") if p.is_file())
        load_before = os.getloadavg()
        print(f"data: {disk / MiB:.0f} MiB on disk; load average {load_before}", flush=True)
        started = time.monotonic()
        extra = dict(item.split("=", 1) for item in args.conf)
        child = [str(data_dir), str(store), args.master, args.driver_memory, json.dumps(extra)]
        result = run_child(child, args.timeout_s)
        result.update(
            manifests=args.manifests,
            master=args.master,
            driver_memory=args.driver_memory,
            conf=extra,
            generated_s=generated_s,
            data_mib=round(disk / MiB),
            child_wall_s=round(time.monotonic() - started, 1),
            loadavg_before=load_before,
            loadavg_after=os.getloadavg(),
        )
        report(result)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return 0 if all(result["checks"].values()) else 1
    finally:
        if not args.keep and args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


def report(result: dict[str, Any]) -> None:
    audit = result["audit"]
    cpu = audit["driver_cpu_s"] + audit["jvm_cpu_s"]
    print(
        f"\nSpark joins of {result['manifests']:,} manifests on {result['master']} "
        f"(driver memory {result['driver_memory']}, more conf {result['conf']})"
    )
    print("| phase | wall s | CPU s driver | CPU s JVM |\n|---|---:|---:|---:|")
    for name, p in {"session start": result["session"], **result["phases"]}.items():
        print(f"| {name} | {p['wall_s']} | {p['driver_cpu_s']} | {p['jvm_cpu_s']} |")
    print(
        f"| audit (after session start) | {audit['wall_s']} | {audit['driver_cpu_s']} | {audit['jvm_cpu_s']} |"
    )
    rate = result["manifests"] / cpu if cpu else float("nan")
    print(f"{rate:,.0f} manifests per CPU-second (driver + JVM, session start excluded)")
    print(
        f"peak RSS: driver {result['driver_peak_rss_bytes'] / MiB:.0f} MiB, JVM "
        f"{result['jvm_peak_rss_bytes'] / MiB:.0f} MiB, JVM + Python workers "
        f"{result['jvm_tree_peak_rss_bytes'] / MiB:.0f} MiB"
    )
    print(f"listed {result['listed']}, young {result['young']}, reasons {result['reasons']}")
    for name, ok in result["checks"].items():
        print(f"  check {name}: {'ok' if ok else 'FAILED'}")
    print(f"load average before {result['loadavg_before']}, after {result['loadavg_after']}")


if __name__ == "__main__":
    raise SystemExit(main())
