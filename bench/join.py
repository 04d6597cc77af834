"""`bench.join`: the full audit's two joins at 10M manifests, in bounded memory.

The audit's code does the work (`reconciler.audit_join`): `CatalogScan.load` reads every
catalog file's digests and hashes, the record listing is asked `CatalogScan.missing` in the
walk's chunks (`reconciler.audit_walks.CHUNK` keys), the records the catalog lacked are
handed back as cataloged (as the cataloger would), and `join_blobs` merges the
``raw-blobs/v1/`` listing with the references. The inputs are synthetic and local
(`bench.join_data`): the catalog files are real Parquet files served from disk, the two
listings are Parquet files streamed page by page; nothing goes through an S3 server, so
the numbers are the join's own CPU and memory (on S3 the listings add ~10,000 LIST pages
per 10M keys, fetched in parallel by the walk).

The join runs in a fresh child process; its peak RSS (``VmHWM``) is the figure checked
against the target (1 GiB at 10M manifests). The run also checks the join's answers:
exactly the lost records, exactly the old orphans, exactly the missing blobs.

    .venv/bin/python -m bench.join                      # 10M manifests (~10 min to generate)
    .venv/bin/python -m bench.join --manifests 1000000  # quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow.parquet as pq

from bench._common import REPO_ROOT, MiB, cpu_seconds, peak_rss_bytes, rss_bytes
from bench.join_data import Plan, generate
from config import Settings
from index.rows import IndexRow
from protocol import keys
from protocol.clock import SystemClock
from reconciler.audit_join import CatalogScan, join_blobs
from reconciler.audit_walks import CHUNK
from reconciler.context import open_context
from reconciler.problems import ProblemBook
from store.base import ObjectInfo
from store.errors import NotFound
from store.memory import MemoryStore

TARGET_RSS = 1024 * MiB
PAGE = 1_000  # keys per listing page, as S3 returns them


class LocalJoinStore(MemoryStore):
    """A memory store (lease, problems, audit files) that serves the catalog files from
    disk and the ``raw-blobs/v1/`` listing from ``blobs.parquet``."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        self._catalog = data_dir / "catalog"
        self._blobs = data_dir / "blobs.parquet"

    async def get(self, key: str) -> tuple[bytes, str]:
        if key.startswith(keys.INDEX_CATALOG_PREFIX):
            try:
                return (self._catalog / key).read_bytes(), "etag"
            except FileNotFoundError:
                raise NotFound("get", key) from None
        return await super().get(key)

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        if prefix.startswith(keys.INDEX_CATALOG_PREFIX):
            for path in sorted((self._catalog / keys.INDEX_CATALOG_PREFIX).rglob("*.parquet")):
                key = str(path.relative_to(self._catalog))
                if key.startswith(prefix) and (start_after is None or key > start_after):
                    yield ObjectInfo(key, path.stat().st_size, "etag", path.stat().st_mtime_ns)
            return
        if keys.RAW_BLOBS_PREFIX.startswith(prefix) or prefix.startswith(keys.RAW_BLOBS_PREFIX):
            for batch in pq.ParquetFile(self._blobs).iter_batches(batch_size=PAGE):
                data = batch.to_pydict()
                for sha, size, modified in zip(
                    data["frame_sha256"], data["size"], data["last_modified_ns"], strict=True
                ):
                    yield ObjectInfo(keys.raw_blob_key(sha), size, "etag", modified)
            return
        async for info in super().list(prefix, start_after):
            yield info


async def run_join(data_dir: Path) -> dict[str, object]:
    """The join, timed by phase, in this process (run it in a fresh one)."""
    expected = json.loads((data_dir / "expected.json").read_text())
    clock = SystemClock()
    store = LocalJoinStore(data_dir)
    ctx = await open_context(store, settings=Settings(), clock=clock, rng=random.Random(1))
    problems = ProblemBook(ctx)
    pid = os.getpid()
    phases: dict[str, dict[str, float]] = {}

    def phase(name: str, started: float, cpu: float) -> None:
        phases[name] = {
            "seconds": round(time.monotonic() - started, 2),
            "cpu_s": round(cpu_seconds(pid) - cpu, 2),
            "rss_mib_after": round(rss_bytes(pid) / MiB, 1),
            "peak_rss_mib_so_far": round(peak_rss_bytes(pid) / MiB, 1),
        }
        print(f"  {name}: {phases[name]}", flush=True)

    phases["start (imports, nothing read)"] = {
        "seconds": 0.0,
        "cpu_s": round(cpu_seconds(pid), 2),
        "rss_mib_after": round(rss_bytes(pid) / MiB, 1),
        "peak_rss_mib_so_far": round(peak_rss_bytes(pid) / MiB, 1),
    }
    started, cpu = time.monotonic(), cpu_seconds(pid)
    scan = await CatalogScan.load(ctx, problems)
    phase("catalog scan", started, cpu)

    started, cpu = time.monotonic(), cpu_seconds(pid)
    missing: list[str] = []
    listed = 0
    for batch in pq.ParquetFile(data_dir / "listing.parquet").iter_batches(batch_size=PAGE):
        page = batch.column(0).to_pylist()
        listed += len(page)
        for start in range(0, len(page), CHUNK):
            missing.extend(scan.missing(page[start : start + CHUNK]))
    phase("record listing anti-join", started, cpu)

    lost = pq.read_table(data_dir / "lost.parquet").to_pylist() if expected["lost"] else []
    scan.cataloged([IndexRow("accepted", row["key"], row["sha"], row["time"]) for row in lost])
    started, cpu = time.monotonic(), cpu_seconds(pid)
    joined = await join_blobs(ctx, scan, store_now_ns=int(expected["now_ns"]))
    phase("blob join", started, cpu)

    checks = {
        "catalog files read": scan.files == expected["catalog_files"],
        "records listed": listed == expected["listed_records"],
        "blobs listed": joined.listed == expected["listed_blobs"],
        "missing records = the lost ones": sorted(missing) == expected["lost"],
        "orphans = the old unreferenced blobs": sorted(o[0] for o in joined.orphans)
        == expected["orphans"],
        "missing blobs = the planted ones": sorted(joined.missing) == expected["missing_blobs"],
    }
    return {
        "phases": phases,
        "catalog_rows": scan.rows,
        "set_bytes": {
            "record_keys": scan.record_keys.nbytes,
            "referenced": scan.referenced.nbytes,
        },
        "peak_rss_bytes": peak_rss_bytes(pid),
        "checks": checks,
    }


def _child_main(data_dir: Path, out: Path) -> None:
    result = asyncio.run(run_join(data_dir))
    out.write_text(json.dumps(result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.join", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--manifests", type=int, default=10_000_000)
    parser.add_argument("--rows-per-file", type=int, default=10_000)
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temp dir")
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the data")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--_child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        _child_main(*args._child)
        return 0
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="lm-join-"))
    data_dir = work / f"join-{args.manifests}-{args.rows_per_file}"
    try:
        plan = Plan(manifests=args.manifests, rows_per_file=args.rows_per_file)
        if not (data_dir / "expected.json").exists():
            data_dir.mkdir(parents=True, exist_ok=True)
            print(f"generating {plan} in {data_dir} ...", flush=True)
            started = time.monotonic()
            horizon = Settings().gc.retry_horizon_s
            generate(plan, data_dir, now_ns=time.time_ns(), horizon_s=horizon)
            print(f"  generated in {time.monotonic() - started:.0f} s", flush=True)
        disk = sum(p.stat().st_size for p in data_dir.rglob("*") if p.is_file())
        print(f"data: {disk / MiB:.0f} MiB on disk; load average {os.getloadavg()}", flush=True)
        out = data_dir / "result.json"
        command = [sys.executable, "-m", "bench.join", "--_child", str(data_dir), str(out)]
        started = time.monotonic()
        subprocess.run(command, check=True, cwd=REPO_ROOT)
        wall = time.monotonic() - started
        result = json.loads(out.read_text())
        result.update(
            manifests=args.manifests,
            rows_per_file=args.rows_per_file,
            data_mib=round(disk / MiB),
            child_wall_s=round(wall, 1),
            loadavg_after=os.getloadavg(),
        )
        _report(result)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return 0 if all(result["checks"].values()) else 1
    finally:
        if not args.keep and args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


def _report(result: dict[str, object]) -> None:
    peak = int(result["peak_rss_bytes"])  # type: ignore[call-overload]
    print(f"\njoin of {result['manifests']:,} manifests ({result['catalog_rows']:,} catalog rows)")
    print("| phase | s | CPU s | RSS after (MiB) | peak so far (MiB) |\n|---|---:|---:|---:|---:|")
    for name, p in result["phases"].items():  # type: ignore[attr-defined]
        print(
            f"| {name} | {p['seconds']} | {p['cpu_s']} | {p['rss_mib_after']} | {p['peak_rss_mib_so_far']} |"
        )
    sets = result["set_bytes"]
    print(f"sets: {', '.join(f'{k} {v / MiB:.0f} MiB' for k, v in sets.items())}")  # type: ignore[attr-defined]
    verdict = "PASS" if peak <= TARGET_RSS else "MISS"
    print(f"peak RSS {peak / MiB:.0f} MiB (target <= {TARGET_RSS / MiB:.0f}): {verdict}")
    for name, ok in result["checks"].items():  # type: ignore[attr-defined]
        print(f"  check {name}: {'ok' if ok else 'FAILED'}")
    print(f"load average after: {result['loadavg_after']}")


if __name__ == "__main__":
    raise SystemExit(main())
