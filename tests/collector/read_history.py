"""Committed ``points`` histories for the read-layout tests (a helper, not tests): hourly
``points`` files sorted by series then time in small row groups, written straight into a
filesystem store's directory (no fsync per file: thousands of files in a second or two),
optionally with each hour's ``series`` file and each day's ``series_day`` file as the
rollup writes them (`rollup.table.series_rows`), all committed in one snapshot through
`rollup.table.commit` (no Spark)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from protocol import keys
from protocol.clock import ManualClock
from rollup.table.commit import commit as commit_snapshot
from rollup.table.commit import load_latest
from rollup.table.data_file import DataFile, describe_file
from rollup.table.manifest import Changes
from rollup.table.owner import OwnerLease
from rollup.table.schemas import POINTS_SCHEMA, TS_TYPE, partition_of_day
from rollup.table.series import series_array
from rollup.table.series_rows import US_PER_DAY, day_table, hour_counts, series_table
from store.fs import FileSystemStore

NS = 1_000_000_000
_MADE: set[Path] = set()  # directories made (a mkdir per file is a third of the time)


def hour_points(
    hour: keys.UtcHour, hosts: Sequence[str], per_series: int, *, metric: str = "m"
) -> pa.Table:
    """``points`` rows of ``metric{host=...}`` for each of ``hosts``, ``per_series``
    evenly spaced points in ``hour``, value = the point's index; sorted by series, ts."""
    count = len(hosts)
    ids = pa.array(np.repeat(np.arange(count), per_series))
    step_us = 3_600_000_000 // per_series
    ts = hour.start_ns // 1000 + np.tile(np.arange(per_series, dtype=np.int64), count) * step_us
    metrics = pa.array([metric] * count)
    labels = pa.MapArray.from_arrays(
        pa.array(np.arange(count + 1, dtype=np.int32)), pa.array(["host"] * count), pa.array(hosts)
    )
    rows = count * per_series
    table = pa.Table.from_arrays(
        [
            pa.array(ts).cast(TS_TYPE),
            metrics.take(ids),
            labels.take(ids),
            pa.array(np.arange(rows, dtype=np.float64)),
            series_array(metrics, labels).take(ids),
            pa.repeat(pa.scalar("agent-a"), rows),
            pa.repeat(pa.scalar("boot"), rows),
            pa.array(np.arange(rows, dtype=np.int64)),
        ],
        schema=POINTS_SCHEMA,
    )
    return table.sort_by([("series", "ascending"), ("ts", "ascending")])


def shifted(table: pa.Table, by_us: int) -> pa.Table:
    """``table`` with every timestamp column moved by ``by_us`` (an hour's rows made
    from another hour's: the same series, the same shape)."""
    for index, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            moved = pc.add(table.column(index).cast(pa.int64()), by_us).cast(field.type)
            table = table.set_column(index, field, moved)
    return table


def write_file(
    store: FileSystemStore,
    table: str,
    hour: keys.UtcHour,
    rows: pa.Table,
    row_group_size: int | None = None,
) -> DataFile:
    key = keys.rollup_data_key(table, hour, str(uuid.uuid4()))
    path = store.root / key
    if path.parent not in _MADE:
        path.parent.mkdir(parents=True, exist_ok=True)
        _MADE.add(path.parent)
    pq.write_table(rows, path, row_group_size=row_group_size or max(1, rows.num_rows))
    return describe_file(table, key, hour, rows, size_bytes=path.stat().st_size, added_version=1)


@dataclass
class Hour:
    """One hour to commit: its ``points`` files' rows and which of them the ``series``
    index covers (None: no ``series`` file, as before the index existed)."""

    hour: keys.UtcHour
    points: list[pa.Table]
    indexed: list[pa.Table] | None = None
    series: pa.Table | None = None  # its series rows, when already made (`shifted`)


def day_partition(hour: keys.UtcHour) -> keys.UtcHour:
    day_us = (hour.start_ns // 1000) // US_PER_DAY * US_PER_DAY
    return keys.UtcHour.from_unix_ns(partition_of_day(day_us) * 3600 * NS)


async def commit_hours(
    store: FileSystemStore,
    clock: ManualClock,
    hours: Sequence[Hour],
    *,
    row_group_size: int | None = None,
    days: bool = False,
) -> None:
    """One commit adding every hour's files (``days``: and a ``series_day`` file for
    each day whose every hour is listed and indexed)."""
    files: list[DataFile] = []
    by_day: dict[keys.UtcHour, list[pa.Table]] = {}
    hours_of_day: dict[keys.UtcHour, int] = {}
    for item in hours:
        for rows in item.points:
            files.append(write_file(store, "points", item.hour, rows, row_group_size))
        day = day_partition(item.hour)
        hours_of_day[day] = hours_of_day.get(day, 0) + 1
        if item.indexed is not None:
            index = item.series
            if index is None:
                index = series_table(hour_counts(pa.concat_tables(item.indexed)))
            files.append(write_file(store, "series", item.hour, index))
            by_day.setdefault(day, []).append(index)
    if days:
        for day, parts in by_day.items():
            if len(parts) == hours_of_day[day] == 24:
                files.append(
                    write_file(store, "series_day", day, day_table(pa.concat_tables(parts)))
                )
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    base = await load_latest(store)
    changes = Changes(added_files=tuple(files))
    await commit_snapshot(store, base=base, changes=changes, owner=owner, clock=clock)
    await owner.release()
