"""`lm-rollup verify`'s search for keys cataloged in more than one checked hour: peak RSS.

``python -m bench.moved_rows [--rows 3600000] [--hours 2]`` writes ``--hours`` hours'
batch files (`index.catalog_tables.BATCH_COLUMNS`, what `read_hour_totals` writes for
verify: 1k batches/s for an hour each), a few keys in two hours, then runs, each in a
child process of its own (peak RSS from ``/proc/self/status`` VmHWM, less the RSS after
the imports), at DuckDB's default 256 MB limit:

- **moved**: `rollup.read.verify_ledger.moved_rows` (each key's newest row by the order of
  its ``catalog_file`` among the few names: an integer aggregate state);
- **baseline** (same run): the query before, ``max(catalog_file)`` over every key (a
  string state, which DuckDB does not spill).

Both must name the same moved rows. Benchmarks are not tests: nothing asserts; the
numbers go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench import child_process
from index.catalog_local import MergeLimits
from rollup.read import verify_ledger

MOVED = 1000  # keys of hour 0 cataloged again in the last hour
BASELINE_SQL = (
    """
WITH rows AS (SELECT * FROM read_parquet({files})),
multi AS (SELECT key, max(catalog_file) AS newest FROM rows GROUP BY key HAVING count(*) > 1)
"""
    + verify_ledger.MOVED_ROWS_SELECT
)
"""`verify_ledger._MOVED_SQL` before its aggregate state was an integer."""


def batch_file(path: str, hour: int, rows: int) -> None:
    """One hour's batches; the first `MOVED` keys of hour 0 are also in the last hour."""
    seq = np.arange(rows, dtype=np.int64) + (hour * rows if hour else 0)
    if hour:
        seq[:MOVED] = np.arange(MOVED)
    text = pc.cast(pa.array(seq), pa.string())
    iso = f"2025-10-09T{hour:02d}"
    table = pa.table(
        {
            "key": pc.binary_join_element_wise("index/v1/accepted/agent=61/boot=5f/", text, ""),
            "manifest_id": pc.binary_join_element_wise("agent=61.boot=5f.", text, ""),
            "frame_sha256": pa.repeat(pa.scalar("ab" * 32), rows),
            "record_count": pa.repeat(pa.scalar(100, pa.int64()), rows),
            "time_unix_ns": pa.array(seq * 1000 + hour * 3_600_000_000_000),
            "catalog_file": pa.repeat(
                pa.scalar(f"index/v1/catalog/date=2025-10-09/hour={hour:02d}/0000000002-1.parquet"),
                rows,
            ),
            "accepted_hour": pa.repeat(pa.scalar(iso), rows),
        }
    )
    pq.write_table(table, path)


def child(argv: list[str]) -> None:
    what, work, files = argv[0], argv[1], argv[2:]
    if what == "baseline":
        setattr(verify_ledger, "_MOVED_SQL", BASELINE_SQL)  # noqa: B010

    def phase() -> dict[str, object]:
        moved = verify_ledger.moved_rows(files, MergeLimits(spill_dir=work), work)
        return {"moved": moved.num_rows, "keys": sorted(moved.column("key").to_pylist())[:1]}

    print(json.dumps(child_process.measure(phase)))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_600_000, help="batches an hour")
    parser.add_argument("--hours", type=int, default=2)
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="lm-bench-moved-") as tmp:
        files = [str(Path(tmp, f"hour-{h:02d}.parquet")) for h in range(args.hours)]
        for hour, path in enumerate(files):
            batch_file(path, hour, args.rows)
        results = {
            what: child_process.run_child("bench.moved_rows", what, tmp, *files)
            for what in ("moved", "baseline")
        }
    work = child_process.above_imports
    for what, result in results.items():
        print(
            f"{what}: {result['moved']} moved rows, peak RSS "
            f"{float(str(result['peak_rss'])) / 2**20:.0f} MiB "
            f"({work(result) / 2**20:.0f} MiB above the imports), "
            f"{float(str(result['seconds'])):.1f} s"
        )
    new, old = results["moved"], results["baseline"]
    print(
        f"moved_rows over {args.hours} x {args.rows:,} batches: "
        f"{(work(old) - work(new)) / 2**20:.0f} MiB less above the imports, "
        f"{float(str(old['seconds'])) / float(str(new['seconds'])):.2f}x sooner, "
        f"same rows: {new['moved'] == old['moved'] and new['keys'] == old['keys']}"
    )
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
