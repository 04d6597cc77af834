"""The fixture writer: committed snapshots written directly (no ingest, no Spark) and the
same samples backfilled into a reference Prometheus TSDB, cached under
``bench/.data/promql/`` (git-ignored by its own ``.gitignore``) between runs.

- ``day``: the fleet's last 24 h, every series at 15 s (1,000 x 5,760 = 5.76M samples).
- ``month``: 30 days: the same last day, and for the 29 days before it the 10 dense-month
  series at 15 s and the other 990 every ``sparse_step_s``.
- ``reference``: the ``month`` samples (a superset of ``day``'s) as Prometheus blocks,
  from OpenMetrics text through ``promtool tsdb create-blocks-from openmetrics``.

Each hour is one ``points`` file sorted by series then time (row groups of
`POINTS_ROW_GROUP_ROWS`) with its ``series`` file; each day one ``series_day`` file; one
commit per store. A directory is complete when its ``done.json`` exists.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench._common import REPO_ROOT
from bench.promql.fleet import DAY0_S, DAY_S, MONTH0_S, T_END_S, Fleet, HourRows, hour_rows
from protocol import keys
from protocol.clock import ManualClock
from rollup.table import series_rows
from rollup.table.commit import commit, load_latest
from rollup.table.data_file import DataFile, describe_file
from rollup.table.manifest import Changes
from rollup.table.owner import OwnerLease
from rollup.table.schemas import POINTS_ROW_GROUP_ROWS, POINTS_SCHEMA, TS_TYPE
from store.fs import FileSystemStore

DATA_DIR = REPO_ROOT / "bench" / ".data" / "promql"
FIXTURE_VERSION = 1
BOOT_ID = "5f0c6a2e-0000-4000-8000-00000000be0c"
US = 1_000_000


def data_dir() -> Path:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    ignore = DATA_DIR.parent / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    return DATA_DIR


def hour_of(start_s: int) -> keys.UtcHour:
    return keys.UtcHour.from_unix_ns(start_s * 1_000_000_000)


def points_table(fleet: Fleet, rows: HourRows, labels: pa.Array) -> pa.Table:
    """``points`` rows (`POINTS_SCHEMA`) of one hour, column-wise."""
    take = pa.array(rows.index)
    return pa.Table.from_arrays(
        [
            pa.array(rows.ts_s * US, pa.int64()).cast(TS_TYPE),
            pa.array(fleet.metric).take(take),
            labels.take(take),
            pa.array(fleet.values(rows.index, rows.k), pa.float64()),
            pa.array(fleet.series).take(take),
            pa.array([f"bench-{i:04d}" for i in range(fleet.size)]).take(take),
            pa.repeat(pa.scalar(BOOT_ID), len(rows.index)),
            pa.array(rows.k, pa.int64()),
        ],
        schema=POINTS_SCHEMA,
    )


def parquet_bytes(table: pa.Table, row_group_size: int) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size, compression="zstd")
    return sink.getvalue()


async def put_file(
    store: FileSystemStore, table: str, partition: keys.UtcHour, rows: pa.Table, rg: int
) -> DataFile:
    key = keys.rollup_data_key(table, partition, str(uuid.uuid4()))
    body = parquet_bytes(rows, rg)
    await store.put(key, body)
    return describe_file(table, key, partition, rows, size_bytes=len(body), added_version=1)


async def write_store(
    root: Path, fleet: Fleet, first_s: int, *, sparse_before_s: int, sparse_step_s: int
) -> dict[str, int]:
    """A store holding the fleet's hours from ``first_s`` to `T_END_S` (sparse before
    ``sparse_before_s``), committed as version 1."""
    clock = ManualClock(T_END_S * 1_000_000_000)
    store = FileSystemStore(root, clock=clock)
    labels = fleet.labels_array()
    files: list[DataFile] = []
    samples = 0
    for day_s in range(first_s, T_END_S, DAY_S):
        day_series = []
        for hour_s in range(day_s, min(day_s + DAY_S, T_END_S), 3600):
            sparse = sparse_step_s if hour_s < sparse_before_s else None
            rows = hour_rows(fleet, hour_s, sparse_step_s=sparse)
            points = points_table(fleet, rows, labels)
            samples += points.num_rows
            hour = hour_of(hour_s)
            files.append(await put_file(store, "points", hour, points, POINTS_ROW_GROUP_ROWS))
            index = series_rows.series_table(series_rows.hour_counts(points))
            files.append(await put_file(store, "series", hour, index, 65_536))
            day_series.append(index)
        if len(day_series) == 24:  # a whole day: its series_day file
            day = series_rows.day_table(pa.concat_tables(day_series))
            day_hour = hour_of(day_s + DAY_S - 3600)
            files.append(await put_file(store, "series_day", day_hour, day, 65_536))
    owner = await OwnerLease.acquire(store, "bench-promql", 600, clock)
    changes = Changes(added_files=tuple(files))
    await commit(store, base=await load_latest(store), changes=changes, owner=owner, clock=clock)
    await owner.release()
    return {"samples": samples, "files": len(files)}


def hour_text(fleet: Fleet, prefixes: pa.Array, rows: HourRows) -> memoryview:
    """OpenMetrics lines of ``rows`` (``prefixes``: each series' text and a space):
    built column-wise, values in their shortest round-trip form, times in seconds."""
    values = pc.cast(pa.array(fleet.values(rows.index, rows.k)), pa.string())
    ts = pc.cast(pa.array(rows.ts_s), pa.string())
    lines = pc.binary_join_element_wise(
        prefixes.take(pa.array(rows.index)), values, " ", ts, "\n", ""
    )
    offsets = np.frombuffer(lines.buffers()[1], np.int32)
    data = lines.buffers()[2]
    return memoryview(data)[int(offsets[lines.offset]) : int(offsets[lines.offset + len(lines)])]


def openmetrics(fleet: Fleet, path: Path, *, sparse_step_s: int) -> int:
    """The month's samples as OpenMetrics text (series by series within each hour, so
    each series' samples are in time order); returns the sample count."""
    prefixes = pa.array([p + " " for p in fleet.prefixes()])
    samples = 0
    with path.open("wb") as out:
        for hour_s in range(MONTH0_S, T_END_S, 3600):
            sparse = sparse_step_s if hour_s < DAY0_S else None
            rows = hour_rows(fleet, hour_s, sparse_step_s=sparse)
            out.write(hour_text(fleet, prefixes, rows))
            samples += len(rows.index)
        out.write(b"# EOF\n")
    return samples


def backfill(fleet: Fleet, target: Path, *, sparse_step_s: int) -> dict[str, float]:
    text = target.with_suffix(".om")
    started = time.monotonic()
    samples = openmetrics(fleet, text, sparse_step_s=sparse_step_s)
    written = time.monotonic() - started
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    subprocess.run(
        [
            "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--quiet",
            "--max-block-duration=720h",
            str(text),
            str(target),
        ],
        check=True,
        timeout=3600,
    )
    text.unlink()
    return {"samples": samples, "text_s": written, "promtool_s": time.monotonic() - started}


def ensure(fleet: Fleet, *, sparse_step_s: int) -> dict[str, object]:
    """The cached stores and reference blocks, written when missing; their record."""
    base = data_dir() / f"v{FIXTURE_VERSION}-sparse{sparse_step_s}"
    done = base / "done.json"
    if done.exists():
        return dict(json.loads(done.read_text()))
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    record: dict[str, object] = {"sparse_step_s": sparse_step_s}
    started = time.monotonic()
    record["day"] = asyncio.run(
        write_store(
            base / "day", fleet, DAY0_S, sparse_before_s=DAY0_S, sparse_step_s=sparse_step_s
        )
    )
    record["month"] = asyncio.run(
        write_store(
            base / "month", fleet, MONTH0_S, sparse_before_s=DAY0_S, sparse_step_s=sparse_step_s
        )
    )
    record["stores_s"] = time.monotonic() - started
    record["reference"] = backfill(fleet, base / "reference", sparse_step_s=sparse_step_s)
    record["dir"] = str(base)
    done.write_text(json.dumps(record))
    return record
