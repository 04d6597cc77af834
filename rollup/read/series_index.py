"""Reading the series index (PROTOCOL §4 ``series``/``series_day``, §5 "Names"): which
series have points in a time range, with their presented names, for the names endpoints
(``/api/v1/labels``, ``label/<name>/values``, ``series``) and for resolving matchers.

`read_series_rows` reads ``series_day`` for the whole UTC days inside ``[start, end)``
that are written, and ``series`` for every other hour the range touches (the partial
days at its ends, and days not yet written), then combines the rows per series: counts
add, first/last widen. An hour or day is listed whole: a series with points in the
range's first hour but before ``start`` is listed too (a listing may name more, never
omit a live series).

No tombstone masking: PROTOCOL §5 lets a listing name a series whose points a
not-yet-compacted delete masks (compaction recomputes the rows, `rollup.lifecycle.
series_files`), never omit a live one.

Cost: files are chosen from the snapshot by partition alone (no listing): one GET per
``series_day`` file of each whole day (about one file a day after compaction) plus one
per ``series`` file of each edge hour: requests grow with the days and edge hours of the
range, never with the history before or after it. Blocking pyarrow I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.fs as pafs

from protocol import keys
from rollup.read import reader
from rollup.table import schemas, series_rows
from rollup.table.data_file import DataFile
from rollup.table.manifest import Snapshot

SERIES_ROWS_SCHEMA = pa.schema(list(schemas.SERIES_SCHEMA)[1:])
"""`read_series_rows`' answer: ``series`` without ``hour_start``, one row per series."""

_HOUR = timedelta(hours=1)
_DAY = timedelta(days=1)


def _floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def index_files(
    snapshot: Snapshot, start: datetime, end: datetime
) -> tuple[list[DataFile], list[DataFile]]:
    """``(series_day files, series files)`` that `read_series_rows` reads for ``[start,
    end)``. Pure: from the snapshot's partitions alone."""
    if end <= start:
        return [], []
    written = {f.partition for f in snapshot.data_files("series_day")}
    day_files: list[DataFile] = []
    hours: set[keys.UtcHour] = set()
    moment = _floor_hour(start)
    while moment < end:
        day_start = moment.replace(hour=0)
        last_hour = keys.UtcHour.from_unix_ns(
            int((day_start + timedelta(hours=23)).timestamp()) * 10**9
        )
        whole_day = moment == day_start and day_start >= start and day_start + _DAY <= end
        if whole_day and last_hour in written:
            day_files += [f for f in snapshot.data_files("series_day") if f.partition == last_hour]
            moment = day_start + _DAY
            continue
        hours.add(keys.UtcHour.from_unix_ns(int(moment.timestamp()) * 10**9))
        moment += _HOUR
    hour_files = [f for f in snapshot.data_files("series") if f.partition in hours]
    return day_files, hour_files


def read_series_rows(
    snapshot: Snapshot,
    filesystem: pafs.FileSystem,
    root: str,
    start: datetime,
    end: datetime,
    *,
    columns: Sequence[str] | None = None,
    read_file: Callable[[DataFile, list[str]], pa.Table] | None = None,
) -> pa.Table:
    """One row per series with points in the hours and days ``[start, end)`` touches
    (`SERIES_ROWS_SCHEMA`, sorted by series; module doc), projected to ``columns`` (the
    row's order; ``series`` is always read). Blocking; a file vacuum removed raises
    `FileNotFoundError` (pin the snapshot with a reader lease for long reads).
    ``read_file(data_file, columns)``: reads one whole index file's columns instead of
    `reader.read_files` (a reader's cache of immutable files, `collector.query.file_cache`).

    The walk over the range is one step per hour of it (pure Python, no I/O): a year
    is ~9,000 steps."""
    day_files, hour_files = index_files(snapshot, start, end)
    wanted = list(columns) if columns is not None else SERIES_ROWS_SCHEMA.names
    needed = list(dict.fromkeys(["series", *wanted, "count", "first_ts", "last_ts"]))
    for name in needed:
        if name not in SERIES_ROWS_SCHEMA.names:
            raise ValueError(f"series rows have no column {name!r} ({SERIES_ROWS_SCHEMA.names})")
    parts: list[pa.Table] = []
    for table, files in (("series_day", day_files), ("series", hour_files)):
        if files and read_file is not None:
            parts += [read_file(f, needed).select(needed) for f in files]
        elif files:
            rows = reader.read_files(files, table, filesystem, root, columns=needed)
            parts.append(rows.select(needed))
    target = pa.schema([SERIES_ROWS_SCHEMA.field(name) for name in needed])
    if not parts:
        return target.empty_table().select(wanted)
    rows = pa.concat_tables([p.cast(target) for p in parts])
    time = pa.repeat(pa.scalar(0, pa.int64()), rows.num_rows)
    combined = series_rows.combine(rows.append_column("_range", time), "_range")
    return combined.drop_columns(["_range"]).select(wanted)
