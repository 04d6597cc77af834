"""`bench.join`: the full audit's joins out of core (DuckDB) at 10M and 50M manifests.

The audit's code does the work (`reconciler.audit.engines.duckdb_joins`): `fetch_catalog` copies the
pinned catalog files (served from local disk by a store, one GET each) into the spill
directory, and `AuditJoins.run` joins them with the listing parts under
``reconciler.audit_memory_limit_mb`` (``--memory-limit-mb``), spilling to disk beyond it.
The inputs are synthetic and local (`bench.join_parts`), so the numbers are the joins'
own CPU, disk and memory (on S3 the catalog's GETs and the listing come on top).

The joins run in a fresh child process; its peak RSS (``VmHWM``: DuckDB's buffers, the
Python process, the result files' reads) is the figure checked against the target (1 GiB
at 50M manifests). The run also checks the answers against every planted difference:
exactly the missing records, the ETag differences, the keys in two hours or with two
hashes, the phantom candidates, the old orphans (not the young ones), the missing blobs,
and none of the young records.

    .venv/bin/python -m bench.join --manifests 10000000 --work-dir /tmp/jw --keep
    .venv/bin/python -m bench.join --manifests 1000000   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from bench._common import MiB, cpu_seconds, peak_rss_bytes, rss_bytes
from bench.child_process import run_child
from bench.join_parts import Plan, generate
from config import Settings
from protocol import keys
from reconciler.audit.audit_inputs import fetch_catalog
from reconciler.audit.engines.duckdb_joins import AuditJoins, JoinLimits, JoinResults, iter_batches
from store.base import ObjectInfo
from store.errors import NotFound
from store.memory import MemoryStore

TARGET_RSS = 1024 * MiB
MODULE = "bench.join"


class DiskCatalogStore(MemoryStore):
    """Serves the catalog files from ``catalog/`` on disk (LIST and GET)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self._root = root

    async def get(self, key: str) -> tuple[bytes, str]:
        try:
            return (self._root / key).read_bytes(), "etag"
        except FileNotFoundError:
            raise NotFound("get", key) from None

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        for path in sorted((self._root / keys.INDEX_CATALOG_PREFIX).rglob("*.parquet")):
            key = str(path.relative_to(self._root))
            if key.startswith(prefix) and (start_after is None or key > start_after):
                yield ObjectInfo(key, path.stat().st_size, "etag", path.stat().st_mtime_ns)


def _sorted_column(path: str, column: str, where: str, equal: set[str]) -> list[str]:
    values: list[str] = []
    for batch in iter_batches(path, columns=[column, where]):
        data = batch.to_pydict()
        values.extend(v for v, w in zip(data[column], data[where], strict=True) if w in equal)
    return sorted(values)


def check_results(
    result: JoinResults, unreadable: Sequence[object], expected: dict[str, list[str]]
) -> dict[str, bool]:
    """Either engine's results against every planted difference (`bench.join_parts`)."""
    records, blobs = result.records, result.blobs
    got = {
        "missing": _sorted_column(records, "key", "reason", {"missing"}),
        "etag": _sorted_column(records, "key", "reason", {"etag"}),
        "conflict": _sorted_column(records, "key", "reason", {"conflict"}),
        "phantom": _sorted_column(records, "key", "reason", {"phantom"}),
        "junk": _sorted_column(records, "key", "reason", {"junk"}),
        "orphan": _sorted_column(blobs, "frame_sha256", "reason", {"orphan"}),
        "missing_blob": _sorted_column(blobs, "frame_sha256", "reason", {"missing"}),
    }
    return {
        "no unreadable catalog file": not unreadable,
        "missing records = the planted ones": got["missing"] == expected["missing"],
        "ETag differences = the planted ones": got["etag"] == expected["etag"],
        "two hours or two hashes = the planted ones": got["conflict"]
        == sorted(expected["two_hours"] + expected["two_hashes"]),
        "phantom candidates = the planted ones": got["phantom"] == expected["phantom"],
        "no junk": got["junk"] == [],
        "orphans = the old unreferenced blobs": got["orphan"] == expected["orphan"],
        "missing blobs = the planted ones": got["missing_blob"] == expected["missing_blob_sha"],
    }


async def run_join(data_dir: Path, memory_limit_mb: int, threads: int) -> dict[str, object]:
    """Fetch and join, timed by phase, in this process (run it in a fresh one)."""
    meta = json.loads((data_dir / "expected.json").read_text())
    expected = meta["expected"]
    settings = Settings()
    pid = os.getpid()
    phases: dict[str, dict[str, float]] = {}

    def phase(name: str, started: float, cpu: float) -> None:
        phases[name] = {
            "seconds": round(time.monotonic() - started, 2),
            "cpu_s": round(cpu_seconds(pid) - cpu, 2),
            "rss_mib_after": round(rss_bytes(pid) / MiB, 1),
            "peak_rss_mib_so_far": round(peak_rss_bytes(pid) / MiB, 1),
        }
        print(f"  {name}: {phases[name]}", file=sys.stderr, flush=True)

    spill = Path(tempfile.mkdtemp(prefix="spill-", dir=data_dir))
    try:
        store = DiskCatalogStore(data_dir / "catalog")
        started, cpu = time.monotonic(), cpu_seconds(pid)
        names = [info.key async for info in store.list(keys.INDEX_CATALOG_PREFIX)]
        copies, unreadable = await fetch_catalog(store, names, str(spill / "catalog"))
        phase(f"fetch {len(names)} catalog files", started, cpu)
        start_ns = int(meta["start_ns"])
        margin_ns = int(settings.settle_margin_s() * keys.NS_PER_S)
        limits = JoinLimits(
            born_before_ns=start_ns + margin_ns,
            phantom_before_ns=start_ns - margin_ns,
            orphan_before_ns=start_ns - int(settings.gc.retry_horizon_s * keys.NS_PER_S),
        )
        started, cpu = time.monotonic(), cpu_seconds(pid)
        with AuditJoins(
            meta["listing"], copies, str(spill), memory_limit_mb=memory_limit_mb, threads=threads
        ) as joins:
            result = joins.run(limits)
            phase("joins (records, blobs)", started, cpu)
        checks = check_results(result, unreadable, expected)
        return {
            "phases": phases,
            "listed": result.listed_old,
            "young": result.listed_young,
            "blobs_listed": result.blobs_listed,
            "reasons": result.reasons,
            "peak_rss_bytes": peak_rss_bytes(pid),
            "checks": checks,
        }
    finally:
        shutil.rmtree(spill, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.join", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--manifests", type=int, default=10_000_000)
    parser.add_argument("--rows-per-file", type=int, default=10_000)
    parser.add_argument(
        "--memory-limit-mb", type=int, default=Settings().reconciler.audit_memory_limit_mb
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temp dir")
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the data")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        data_dir, limit, threads = args.child
        result = asyncio.run(run_join(Path(data_dir), int(limit), int(threads)))
        print(json.dumps(result))
        return 0
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="lm-join-"))
    data_dir = work / f"parts-{args.manifests}-{args.rows_per_file}"
    try:
        plan = Plan(manifests=args.manifests, rows_per_file=args.rows_per_file)
        generated_s = None
        if not (data_dir / "expected.json").exists():
            data_dir.mkdir(parents=True, exist_ok=True)
            print(f"generating {plan} in {data_dir} ...", flush=True)
            started = time.monotonic()
            horizon = Settings().gc.retry_horizon_s
            generate(plan, data_dir, start_ns=time.time_ns(), horizon_s=horizon)
            generated_s = round(time.monotonic() - started)
            print(f"  generated in {generated_s} s", flush=True)
        disk = sum(p.stat().st_size for p in data_dir.rglob("*") if p.is_file())
        load_before = os.getloadavg()
        print(f"data: {disk / MiB:.0f} MiB on disk; load average {load_before}", flush=True)
        started = time.monotonic()
        result = run_child(MODULE, str(data_dir), str(args.memory_limit_mb), str(args.threads))
        result.update(
            manifests=args.manifests,
            memory_limit_mb=args.memory_limit_mb,
            threads=args.threads,
            generated_s=generated_s,
            data_mib=round(disk / MiB),
            child_wall_s=round(time.monotonic() - started, 1),
            loadavg_before=load_before,
            loadavg_after=os.getloadavg(),
        )
        _report(result)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return 0 if all(result["checks"].values()) else 1  # type: ignore[attr-defined]
    finally:
        if not args.keep and args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


def _report(result: dict[str, object]) -> None:
    peak = int(result["peak_rss_bytes"])  # type: ignore[call-overload]
    print(
        f"\njoins of {result['manifests']:,} manifests, memory_limit "
        f"{result['memory_limit_mb']} MB, {result['threads']} threads"
    )
    print("| phase | s | CPU s | RSS after (MiB) | peak so far (MiB) |\n|---|---:|---:|---:|---:|")
    for name, p in result["phases"].items():  # type: ignore[attr-defined]
        print(
            f"| {name} | {p['seconds']} | {p['cpu_s']} | {p['rss_mib_after']} "
            f"| {p['peak_rss_mib_so_far']} |"
        )
    print(f"listed {result['listed']}, young {result['young']}, reasons {result['reasons']}")
    verdict = "PASS" if peak <= TARGET_RSS else "MISS"
    print(f"peak RSS {peak / MiB:.0f} MiB (target <= {TARGET_RSS / MiB:.0f}): {verdict}")
    for name, ok in result["checks"].items():  # type: ignore[attr-defined]
        print(f"  check {name}: {'ok' if ok else 'FAILED'}")
    print(f"load average before {result['loadavg_before']}, after {result['loadavg_after']}")


if __name__ == "__main__":
    raise SystemExit(main())
