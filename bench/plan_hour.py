"""Rollup planning of one busy catalog hour: peak RSS and time (issue 22 item 3, PROTOCOL §3.9).

``python -m bench.plan_hour [--rows 3600000] [--files 360]`` writes one hour of ``--rows``
catalog rows (`bench.catalog_hour.synthetic_rows`: 1k batches/s for an hour) as
``--files`` files, each with its rollup work marker, into a fresh filesystem store, plus
ledger files that include every other batch of the hour. Then, each in a child process of
its own (peak RSS from ``/proc/self/status`` VmHWM, minus the RSS after imports):

- **empty**: `rollup.job.plan.make_plan` against no snapshot (every batch pending);
- **half**: `make_plan` against a snapshot whose ledger holds half of the hour's batches;
- **baseline**: what the planner did before (`chaos.catalog_rows.read_hour`, one `IndexRow`
  per key, the ledger's ids as a Python set, a tuple per work item) on ``--baseline-rows``
  rows (default a tenth), scaled per row to the whole hour.

The plan's items are counted, not read (they are memory-mapped from a local file: what
the job touches when it hands them to Spark is page cache, reclaimable). Benchmarks are
not tests: nothing asserts; the numbers go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import numpy as np
import pyarrow as pa

from bench import child_process
from bench.catalog_hour import HOUR, seed, synthetic_rows
from bench.child_process import status_bytes
from chaos.catalog_rows import read_hour
from index.catalog import list_hour_files
from index.catalog_tables import manifest_ids
from protocol import keys
from rollup.job.plan import make_plan
from rollup.table.commit import LoadedSnapshot
from rollup.table.ledger import encode_ledger
from rollup.table.schemas import LEDGER_SCHEMA, TS_TYPE
from store.open import open_store

LEDGER_FILES = 8


async def seed_plan(url: str, rows: int, files: int) -> list[str]:
    """The hour's catalog files and their work markers; ledger files holding every other
    batch. Returns the ledger file keys."""
    await seed(url, rows, files)
    store = open_store(url)
    for info in await list_hour_files(store, HOUR):
        await store.put(keys.rollup_work_marker_key(info.key), b"{}")
    rng = np.random.default_rng(7)
    per_file = rows // files
    ledger_keys = []
    parts = []
    for i in range(files):
        count = per_file if i < files - 1 else rows - per_file * i
        table = synthetic_rows(i * per_file, count, rng)  # as `seed` drew them
        table = table.filter(pa.array((np.arange(count) + i * per_file) % 2 == 0))
        parts.append(
            pa.table(
                {
                    "manifest_id": manifest_ids(table),
                    "frame_sha256": table.column("frame_sha256"),
                    "record_count": table.column("record_count"),
                    "accepted_hour": pa.repeat(pa.scalar(HOUR.iso), table.num_rows),
                    # The batches' point ranges (PROTOCOL §4); the planner does not read them.
                    "min_ts": pa.nulls(table.num_rows, TS_TYPE),
                    "max_ts": pa.nulls(table.num_rows, TS_TYPE),
                },
                schema=LEDGER_SCHEMA,
            )
        )
    ledger = pa.concat_tables(parts)
    step = -(-ledger.num_rows // LEDGER_FILES)
    for i in range(LEDGER_FILES):
        key = keys.rollup_ledger_key(HOUR, f"bench-{i}")
        await store.put(key, encode_ledger(ledger.slice(i * step, step)))
        ledger_keys.append(key)
    return ledger_keys


def _base(ledger_keys: list[str]) -> LoadedSnapshot:
    """What `make_plan` reads of a snapshot: its ledger files."""
    return cast(LoadedSnapshot, SimpleNamespace(snapshot=SimpleNamespace(ledger_files=ledger_keys)))


async def plan(url: str, ledger_keys: list[str], spill: str) -> dict[str, object]:
    from index.catalog_local import MergeLimits

    base = _base(ledger_keys) if ledger_keys else None
    made = await make_plan(open_store(url), base, limits=MergeLimits(spill_dir=spill))
    result: dict[str, object] = {"batches": made.batches, "records": made.records}
    if not ledger_keys:
        result["handoff"] = handoff(made.items)
    return result


def handoff(items: pa.Table) -> dict[str, object]:
    """What the job's driver does next (`rollup.job.stages.run_stages` before Spark): assign
    the items to tasks and encode one IPC blob per task. Peak RSS of this phase alone
    (``/proc/self/clear_refs`` resets VmHWM), time and the blobs' bytes."""
    from rollup.job.stages import assign_tasks, task_blobs, task_count

    plan_peak = status_bytes("VmHWM")
    Path("/proc/self/clear_refs").write_text("5")
    before = status_bytes("VmRSS")
    started = time.perf_counter()
    blobs = task_blobs(items, assign_tasks(items, task_count(items, 2)))
    return {
        "plan_peak_rss": plan_peak,
        "rss_before": before,
        "peak_rss": status_bytes("VmHWM"),
        "seconds": time.perf_counter() - started,
        "tasks": len(blobs),
        "blob_bytes": sum(len(b) for b in blobs),
    }


async def baseline(url: str) -> dict[str, object]:
    """The old planner's work: a Python row per key, a tuple per item."""
    catalog = await read_hour(open_store(url), HOUR)
    done: set[str] = set()
    items = [
        (r.manifest_id, r.frame_sha256, r.raw_blob_key, HOUR.iso, r.record_count)
        for r in catalog.batches()
        if r.manifest_id not in done
    ]
    return {"batches": len(items)}


def child(argv: list[str]) -> None:
    what, url = argv[0], argv[1]

    def phase() -> dict[str, object]:
        if what == "baseline":
            return asyncio.run(baseline(url))
        ledger_keys = json.loads(argv[3]) if what == "half" else []
        return asyncio.run(plan(url, ledger_keys, argv[2]))

    result = child_process.measure(phase)
    handed = cast(dict[str, object] | None, result.get("handoff"))
    if handed is not None:  # the planning phase's own peak, before the handoff reset it
        result["peak_rss"] = int(str(handed["plan_peak_rss"]))
    print(json.dumps(result))


def run_child(*args: str) -> dict[str, object]:
    return child_process.run_child("bench.plan_hour", *args)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_600_000)
    parser.add_argument("--files", type=int, default=360)
    parser.add_argument("--baseline-rows", type=int, default=0)
    args = parser.parse_args()
    baseline_rows = args.baseline_rows or args.rows // 10
    print(f"load before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="lm-bench-plan-") as tmp:
        big, small, spill = f"file://{tmp}/big", f"file://{tmp}/small", f"{tmp}/spill"
        os.mkdir(spill)
        started = time.perf_counter()
        ledger_keys = asyncio.run(seed_plan(big, args.rows, args.files))
        asyncio.run(seed(small, baseline_rows, max(1, args.files // 10)))
        print(
            f"seeded {args.rows:,} + {baseline_rows:,} rows in {time.perf_counter() - started:.0f} s"
        )
        empty = run_child("empty", big, spill)
        half = run_child("half", big, spill, json.dumps(ledger_keys))
        base = run_child("baseline", small)

    work = child_process.above_imports
    per_row = work(base) / baseline_rows
    print(f"empty ledger: {empty}")
    print(f"half ledger:  {half}")
    print(
        f"baseline: {base} on {baseline_rows:,} rows -> {per_row:.0f} B/row, "
        f"{per_row * args.rows / 2**30:.2f} GiB scaled to {args.rows:,} rows"
    )
    for name, result in (("plan, empty ledger", empty), ("plan, half in the ledger", half)):
        print(
            f"{name}: {result['batches']:,} batches, peak RSS "
            f"{float(str(result['peak_rss'])) / 2**20:.0f} MiB ({work(result) / 2**20:.0f} MiB "
            f"above the imports), {float(str(result['seconds'])):.1f} s"
        )
    handed = cast(dict[str, object], empty["handoff"])
    print(
        f"handoff (assign_tasks + task_blobs, {handed['tasks']} tasks): peak RSS "
        f"{(float(str(handed['peak_rss'])) - float(str(handed['rss_before']))) / 2**20:.0f} MiB "
        f"above the RSS after planning, {float(str(handed['seconds'])):.1f} s, blobs "
        f"{float(str(handed['blob_bytes'])) / 2**20:.0f} MiB"
    )
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
