"""Matchers resolved against the series index first (PROTOCOL §5 "Matchers": a read
resolves its matchers against ``series`` rows, then reads only the ``points`` row groups
of those stored series; files are sorted by stored ``series``, then time).

`resolve_stored_series` reads the index rows of a read's range as
`rollup.read.series_index` chooses its files (``series_day`` for whole days written,
``series`` for the other hours: requests grow with the days and edge hours of the range,
never with history), through the collector's `FileCache`; applies the matchers to their
``presented_name``/``presented_labels`` column-wise (`select_label_sets`, once per index
row, never per sample); and returns the sorted stored ``series`` strings selected, as a
`StoredSeries`. `collector.query.points_scan` then skips a ``points`` file or row group
whose ``series`` statistics hold none of them and keeps only their rows (``is_in``).

Which hours the answer is complete for (`StoredSeries.covers`): an hour's (or a whole
day's) index rows count the points they stand for (``count``), and the snapshot's
manifest says how many rows the hour's ``points`` files hold (``row_count``). Where the
two agree, every stored series of the hour is in the index; where they do not — an hour
committed before the rollup wrote the index (no ``series`` file at all, or one a later
batch added beside older ``points``), or rows a tombstone recompute already left out of
the index while the ``points`` file still holds them — the hour is read as before the
index (metric bounds and row-group statistics alone). That costs speed, never rows:
no request is made to decide it.

Blocking pyarrow I/O: run on a thread.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from protocol import keys
from rollup.read import reader
from rollup.read.series_index import index_files
from rollup.table.data_file import DataFile
from rollup.table.manifest import Snapshot

from ..promql.matchers import LabelMatcher, select_label_sets
from .file_cache import FileCache

US_PER_DAY = 86_400_000_000
INDEX_COLUMNS = ["series", "presented_name", "presented_labels", "count"]


@dataclass(frozen=True, slots=True)
class StoredSeries:
    """The stored series a read selects (``wanted``: sorted, unique) in the ``points``
    hours the index answers for (``indexed``: partition hours)."""

    wanted: tuple[str, ...]
    indexed: frozenset[keys.UtcHour]
    index_files: int = 0
    """Index files read to resolve it (`series_day` and `series`)."""

    def covers(self, data_file: DataFile) -> bool:
        return data_file.partition in self.indexed

    def may_hold(self, low: Any, high: Any) -> bool:
        """Whether ``series`` statistics ``[low, high]`` may hold a wanted series
        (statistics that are not strings, e.g. truncated bytes, never exclude)."""
        if not isinstance(low, str) or not isinstance(high, str):
            return True
        at = bisect.bisect_left(self.wanted, low)
        return at < len(self.wanted) and self.wanted[at] <= high

    def mask(self, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Per row, whether its ``series`` is wanted (a dictionary column is looked up
        once per distinct value)."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks() if column.num_chunks else pa.array([], pa.string())
        value_set = pa.array(self.wanted, pa.string())
        if pa.types.is_dictionary(column.type):
            found = _bools(pc.is_in(column.dictionary, value_set=value_set))
            indices = np.asarray(column.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
            result: np.ndarray = found[indices]
            return result
        return _bools(pc.is_in(column, value_set=value_set))


def _bools(mask: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=bool)


def _day(partition: keys.UtcHour) -> Any:
    return partition.day


def resolve_stored_series(
    snapshot: Snapshot | None,
    filesystem: pafs.FileSystem,
    root: str,
    *,
    low_us: int,
    high_us: int,
    matchers: Sequence[LabelMatcher],
    cache: FileCache,
    check: Callable[[], None] = lambda: None,
) -> StoredSeries | None:
    """The stored series ``matchers`` select among the index rows of ``[low_us,
    high_us)``, and the hours that answer is complete for (module doc); None when the
    snapshot has no ``points`` file in the range (nothing to resolve)."""
    if snapshot is None or low_us >= high_us:
        return None
    start = datetime.fromtimestamp(low_us // 1_000_000, tz=UTC)
    end = datetime.fromtimestamp(-(-high_us // 1_000_000), tz=UTC)
    points = reader.plan_files(snapshot, "points", start=start, end=end)
    if not points:
        return None
    # Every points file of the range's hours counts (also one its ts statistics prune
    # from this read): the index rows of an hour count all of them.
    touched = {data_file.partition for data_file in points}
    rows_per_hour: dict[keys.UtcHour, int] = {}
    for data_file in snapshot.data_files("points"):
        if data_file.partition in touched:
            rows_per_hour[data_file.partition] = (
                rows_per_hour.get(data_file.partition, 0) + data_file.row_count
            )
    # The index is walked an hour at a time: only over the days holding points (a read's
    # range may be Prometheus' whole int64 span); whole days stay whole (series_day).
    first = min(rows_per_hour).start_ns // 1000 // US_PER_DAY * US_PER_DAY
    last = -(-max(rows_per_hour).next().start_ns // 1000 // US_PER_DAY) * US_PER_DAY
    start = datetime.fromtimestamp(max(low_us, first) // 1_000_000, tz=UTC)
    end = datetime.fromtimestamp(-(-min(high_us, last) // 1_000_000), tz=UTC)
    day_files, hour_files = index_files(snapshot, start, end)
    counted_hours: dict[keys.UtcHour, int] = {}
    counted_days: dict[Any, int] = {}
    parts: list[pa.Table] = []
    for data_file in [*day_files, *hour_files]:
        check()
        rows = cache.read_whole(filesystem, root, data_file, INDEX_COLUMNS)
        total = int(pc.sum(rows.column("count")).as_py() or 0)
        if data_file.table == "series_day":
            day = _day(data_file.partition)
            counted_days[day] = counted_days.get(day, 0) + total
        else:
            counted_hours[data_file.partition] = counted_hours.get(data_file.partition, 0) + total
        parts.append(rows)
    rows_per_day: dict[Any, int] = {}
    for hour, count in rows_per_hour.items():
        rows_per_day[_day(hour)] = rows_per_day.get(_day(hour), 0) + count
    indexed = frozenset(
        hour
        for hour, count in rows_per_hour.items()
        if counted_hours.get(hour) == count
        or (_day(hour) in counted_days and counted_days[_day(hour)] == rows_per_day[_day(hour)])
    )
    wanted: tuple[str, ...] = ()
    if parts and indexed:
        table = pa.concat_tables(parts)
        # A series has a row per hour or day read: match each distinct series once (its
        # presented names are a function of the series string).
        encoded = pc.dictionary_encode(table.column("series").combine_chunks())
        codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        first_row = np.zeros(len(encoded.dictionary), dtype=np.int64)
        first_row[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
        columns = table.select(["presented_name", "presented_labels"])
        distinct = columns.take(pa.array(first_row))
        keep = select_label_sets(
            distinct.column("presented_name"), distinct.column("presented_labels"), matchers
        )
        wanted = tuple(sorted(encoded.dictionary.filter(pa.array(keep)).to_pylist()))
    return StoredSeries(wanted, indexed, len(parts))
