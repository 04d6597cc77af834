"""The series index's files on the driver (PROTOCOL §4 ``series``/``series_day``): which a
commit adds and removes besides the hour files stage 2 writes. Blocking pyarrow I/O.

- `run_days` (a rollup run, after its stages): a day already written gets this run's
  new ``series`` rows of the day as a new ``series_day`` file (a late batch adds its rows
  to the day in the same commit); a day not yet written that has settled — store time
  past its end plus ``[rollup] series_day_settle_s`` — gets one file combining every
  ``series`` row of the day.
- `recompute_hours` (compaction applying a tombstone, retraction removing points): the
  hours' ``series`` rows recomputed from their ``points`` after the commit (masked as a
  reader sees them), replacing every ``series`` file of the hour; each written day among
  them is rewritten from its ``series`` rows.

A ``series_day`` file goes in its day's last hour (`rollup.table.schemas.partition_of_day`).
"Written" means the snapshot holds a ``series_day`` file of the day. Cost: a run reads
the ``series`` files of the days it writes (a day once, when it settles; a late day only
its new rows), never history; a recompute reads the hours' points and their days' ``series``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

import pyarrow as pa

from protocol import keys
from rollup.read import reader
from rollup.table import schemas, series_rows
from rollup.table.data_file import DataFile, describe_file
from rollup.table.manifest import Changes, Snapshot
from rollup.table.storage import StoreAccess, open_parquet_writer
from rollup.table.tombstones import pending_on

US_PER_HOUR = 3_600_000_000
_POINTS_COLUMNS = ("ts", "series", "metric", "labels")


@dataclass(slots=True)
class SeriesChanges:
    """Files of ``series``/``series_day`` a commit adds and removes."""

    added: list[DataFile] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def day_hour(partition: keys.UtcHour) -> keys.UtcHour:
    """The partition of the ``series_day`` rows of the day holding ``partition``."""
    day_us = series_rows.day_of(partition.start_ns // 1000)
    return _hour(schemas.partition_of_day(day_us))


def _hour(hours_since_epoch: int) -> keys.UtcHour:
    return keys.UtcHour.from_unix_ns(hours_since_epoch * 3600 * keys.NS_PER_S)


def _day_end_us(day: keys.UtcHour) -> int:
    return (day.start_ns // 1000) + US_PER_HOUR  # the day's partition is its last hour


def run_days(
    snapshot: Snapshot | None,
    new_series: Sequence[DataFile],
    *,
    removed: Iterable[str],
    first_kept: str | None,
    now_us: int,
    settle_us: int,
    access: StoreAccess,
    version: int,
    compression: str,
) -> list[DataFile]:
    """The ``series_day`` files a run adds (module doc). ``removed``: paths the commit
    drops (retention); ``first_kept``: ``series_day``'s retention cutoff hour, if any."""
    gone = set(removed)
    base_series = [
        f for f in (snapshot.data_files("series") if snapshot else ()) if f.path not in gone
    ]
    written = {f.partition for f in (snapshot.data_files("series_day") if snapshot else ())}
    added: list[DataFile] = []
    late: dict[keys.UtcHour, list[DataFile]] = {}
    for data_file in new_series:
        late.setdefault(day_hour(data_file.partition), []).append(data_file)
    for day, files in sorted(late.items()):
        if day in written:
            added += _write_day(files, day, access, version, compression)
    all_series = [*base_series, *new_series]
    for day in settled_days(all_series, written, first_kept, now_us, settle_us):
        files = [f for f in all_series if day_hour(f.partition) == day]
        added += _write_day(files, day, access, version, compression)
    return added


def settled_days(
    series: Iterable[DataFile],
    written: set[keys.UtcHour],
    first_kept: str | None,
    now_us: int,
    settle_us: int,
) -> list[keys.UtcHour]:
    """The days (as their partition hour) of ``series`` files that are not ``written``,
    not before ``first_kept`` and ended at least ``settle_us`` before ``now_us``. Pure."""
    candidates = {day_hour(f.partition) for f in series} - written
    return [
        day
        for day in sorted(candidates)
        if (first_kept is None or day.iso >= first_kept) and _day_end_us(day) + settle_us <= now_us
    ]


def days_due(
    snapshot: Snapshot | None, first_kept: str | None, now_us: int, settle_us: int
) -> bool:
    """Whether ``snapshot`` has a settled day without ``series_day`` rows: a run with
    nothing else to do commits it (else a day whose data stopped would never be written)."""
    if snapshot is None:
        return False
    written = {f.partition for f in snapshot.data_files("series_day")}
    days = settled_days(snapshot.data_files("series"), written, first_kept, now_us, settle_us)
    return bool(days)


def recompute_hours(
    snapshot: Snapshot,
    hours: Iterable[keys.UtcHour],
    *,
    added: Sequence[DataFile],
    removed: Iterable[str],
    access: StoreAccess,
    version: int,
    compression: str,
) -> SeriesChanges:
    """Replace the ``series`` files of ``hours`` with rows recomputed from their
    ``points`` as the commit leaves them (the snapshot's minus ``removed``, plus
    ``added``), and rewrite the written days among them (module doc)."""
    gone = set(removed)
    filesystem, root = access.filesystem()
    result = SeriesChanges()
    wanted = sorted(set(hours))
    new_series: list[DataFile] = []
    for hour in wanted:
        points = [
            f
            for f in [*snapshot.data_files("points"), *added]
            if f.table == "points" and f.partition == hour and f.path not in gone
        ]
        rows = reader.read_files(
            points,
            "points",
            filesystem,
            root,
            columns=_POINTS_COLUMNS,
            tombstones=snapshot.tombstones,
        )
        result.removed += [f.path for f in snapshot.data_files("series") if f.partition == hour]
        table = series_rows.series_table(series_rows.hour_counts(rows))
        if table.num_rows:
            new_series.append(write_file(access, "series", hour, table, version, compression))
    result.added += new_series
    written = {f.partition for f in snapshot.data_files("series_day")}
    replaced = set(result.removed)
    for day in sorted({day_hour(h) for h in wanted} & written):
        result.removed += [f.path for f in snapshot.data_files("series_day") if f.partition == day]
        # The day's series files as the commit leaves them (a compaction in the same
        # commit may have merged other hours' files: ``added``).
        files = [
            f
            for f in [*snapshot.data_files("series"), *added, *new_series]
            if f.table == "series"
            and day_hour(f.partition) == day
            and f.path not in replaced
            and f.path not in gone
        ]
        result.added += _write_day(files, day, access, version, compression)
    return result


class _HourWork(Protocol):
    @property
    def table(self) -> str: ...
    @property
    def hour(self) -> keys.UtcHour: ...
    @property
    def files(self) -> tuple[DataFile, ...]: ...


Work = TypeVar("Work", bound=_HourWork)


def recomputed_by_compaction(
    snapshot: Snapshot, chosen: list[Work]
) -> tuple[list[Work], list[keys.UtcHour]]:
    """``(chosen without the series-index work a recompute replaces, the points hours
    whose rewrite applies a delete or that have no ``series`` rows)``: those hours'
    ``series`` rows are recomputed from the new files (`with_recomputed`); the second
    kind is an hour written before the index existed, so compaction backfills it.
    ``chosen``: compaction's (table, hour, files)."""
    indexed = {f.partition for f in snapshot.data_files("series")}
    hours = sorted(
        {
            work.hour
            for work in chosen
            if work.table == "points"
            and (
                work.hour not in indexed
                or any(pending_on(snapshot.tombstones, f) for f in work.files)
            )
        }
    )
    days = {day_hour(hour) for hour in hours}
    kept = [
        work
        for work in chosen
        if not (work.table == "series" and work.hour in hours)
        and not (work.table == "series_day" and work.hour in days)
    ]
    return kept, hours


def with_recomputed(
    snapshot: Snapshot,
    changes: Changes,
    hours: Sequence[keys.UtcHour],
    *,
    access: StoreAccess,
    compression: str,
) -> Changes:
    """``changes`` plus `recompute_hours` of ``hours`` on the points they leave."""
    extra = recompute_hours(
        snapshot,
        hours,
        added=changes.added_files,
        removed=changes.removed_files,
        access=access,
        version=snapshot.version + 1,
        compression=compression,
    )
    return replace(
        changes,
        added_files=(*changes.added_files, *extra.added),
        removed_files=tuple(sorted({*changes.removed_files, *extra.removed})),
    )


def _write_day(
    files: Sequence[DataFile],
    day: keys.UtcHour,
    access: StoreAccess,
    version: int,
    compression: str,
) -> list[DataFile]:
    filesystem, root = access.filesystem()
    rows = reader.read_files(files, "series", filesystem, root)
    table = series_rows.day_table(rows)
    if not table.num_rows:
        return []
    return [write_file(access, "series_day", day, table, version, compression)]


def write_file(
    access: StoreAccess,
    table: str,
    hour: keys.UtcHour,
    rows: pa.Table,
    version: int,
    compression: str,
) -> DataFile:
    """Write ``rows`` as one new file of ``table`` in ``hour``; its `DataFile`."""
    schema = schemas.table_schema(table)
    path = keys.rollup_data_key(table, hour, str(uuid.uuid4()))
    rows = rows.cast(schema)
    writer, stream = open_parquet_writer(access, path, schema, compression=compression)
    try:
        writer.write_table(rows)
    finally:
        writer.close()
    size = int(stream.tell())
    stream.close()
    return describe_file(table, path, hour, rows, size_bytes=size, added_version=version)
