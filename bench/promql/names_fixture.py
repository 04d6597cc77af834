"""The names fixture: 100,000 series in the series index only (no ``points``): 1,000
metric names x 100 label sets (``job``: 10, ``instance``: 100, ``shard``: 4). The day
before `T_END_S` has a ``series`` file per hour (every series in every hour) and every one
of the 30 days a ``series_day`` file, committed as version 1 (cached like `fixture`)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.promql.fixture import data_dir, hour_of, put_file
from bench.promql.fleet import DAY_S, MONTH0_S, T_END_S
from protocol.clock import ManualClock
from rollup.table import series_rows
from rollup.table.commit import commit, load_latest
from rollup.table.data_file import DataFile
from rollup.table.manifest import Changes
from rollup.table.owner import OwnerLease
from rollup.table.schemas import SERIES_DAY_SCHEMA, TS_TYPE
from rollup.table.series import series_array
from store.fs import FileSystemStore

SERIES = 100_000
METRICS = 1_000
US = 1_000_000


def base_rows() -> pa.Table:
    """``series`` rows of one hour (hour 0 of the epoch; shifted per file)."""
    n = np.arange(SERIES)
    metric = pa.array([f"bench_metric_{m:04d}" for m in range(METRICS)]).take(
        pa.array(n // (SERIES // METRICS))
    )
    within = n % (SERIES // METRICS)
    keys = pa.array(["instance", "job", "shard"] * SERIES)
    values = pa.array(
        np.stack(
            [
                np.char.add("host-", (within % 100).astype(str)),
                np.char.add("job-", (n % 10).astype(str)),
                np.char.add("s", (n % 4).astype(str)),
            ],
            axis=1,
        ).reshape(-1)
    )
    labels = pa.MapArray.from_arrays(pa.array(np.arange(SERIES + 1) * 3, pa.int32()), keys, values)
    counts = pa.table(
        {
            "hour_start": pa.array(np.zeros(SERIES, np.int64)).cast(TS_TYPE),
            "series": series_array(metric, labels),
            "metric": metric,
            "labels": labels,
            "count": pa.array(np.full(SERIES, 240, np.int64)),
            "first_ts": pa.array(np.zeros(SERIES, np.int64)).cast(TS_TYPE),
            "last_ts": pa.array(np.full(SERIES, 3_599 * US, np.int64)).cast(TS_TYPE),
        }
    )
    return series_rows.series_table(counts)


def shifted(rows: pa.Table, start_s: int, span_s: int, count: int) -> pa.Table:
    def ts(us: int) -> pa.Array:
        return pa.array(np.full(rows.num_rows, us, np.int64)).cast(TS_TYPE)

    rows = rows.set_column(0, rows.schema.field(0), ts(start_s * US))
    rows = rows.set_column(6, "count", pa.array(np.full(rows.num_rows, count, np.int64)))
    rows = rows.set_column(7, "first_ts", ts(start_s * US))
    return rows.set_column(8, "last_ts", ts((start_s + span_s - 1) * US))


async def write_names(root: Path) -> dict[str, int]:
    clock = ManualClock(T_END_S * 1_000_000_000)
    store = FileSystemStore(root, clock=clock)
    hour = base_rows()
    day = hour.rename_columns(["day_start", *hour.column_names[1:]]).cast(SERIES_DAY_SCHEMA)
    files: list[DataFile] = []
    for hour_s in range(T_END_S - DAY_S, T_END_S, 3600):
        rows = shifted(hour, hour_s, 3600, 240)
        files.append(await put_file(store, "series", hour_of(hour_s), rows, 65_536))
    for day_s in range(MONTH0_S, T_END_S, DAY_S):
        rows = shifted(day, day_s, DAY_S, 5760)
        last_hour = hour_of(day_s + DAY_S - 3600)
        files.append(await put_file(store, "series_day", last_hour, rows, 65_536))
    owner = await OwnerLease.acquire(store, "bench-promql", 600, clock)
    changes = Changes(added_files=tuple(files))
    await commit(store, base=await load_latest(store), changes=changes, owner=owner, clock=clock)
    await owner.release()
    return {"series": SERIES, "files": len(files)}


def ensure_names() -> dict[str, object]:
    base = data_dir() / "names-v1"
    done = base / "done.json"
    if done.exists():
        return dict(json.loads(done.read_text()))
    shutil.rmtree(base, ignore_errors=True)
    started = time.monotonic()
    record: dict[str, object] = dict(asyncio.run(write_names(base / "store")))
    record["seconds"] = time.monotonic() - started
    record["dir"] = str(base)
    done.write_text(json.dumps(record))
    return record
