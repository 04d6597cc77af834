"""Reading rollup tables without Spark: a snapshot's files, pruned, projected and filtered.

`scan` reads one table as of the latest snapshot, a given ``version`` or the snapshot
current at a time ``as_of`` (`rollup.read.travel`): it plans which
data files can hold matching rows (`plan_files`: partition hour against the time range
and against predicates on the partition column, then each file's min/max statistics
against every predicate), reads only those with pyarrow (only the needed columns, with
row-group filtering), filters the rows exactly, and returns the projected columns cast
to the table's schema (`rollup.table.schemas`). Rows the snapshot's tombstones (deletes,
`rollup.table.tombstones`) match are masked: a deleted row is never returned.

Predicates (`Predicate`, parsed by `parse_predicate` from ``"column op value"``) compare
one scalar column with a constant: ``= == != < <= > >=``. Values are parsed by the
column's type; times are RFC 3339 (UTC when no offset is given). Null values never match.
The time range ``start``/``end`` is half-open, ``[start, end)``, on the table's partition
column (``ts`` for points, ``window_start`` for rollup_1m).

Files are opened through a ``pyarrow.fs`` filesystem and a root: object ``K`` is
``f"{root}/{K}"`` (`rollup.table.storage.arrow_filesystem` makes the pair from a store URL).
Errors: `ValueError` for a bad table, column or predicate; `VersionNotFound`;
``FileNotFoundError``/``OSError`` when a file the snapshot lists cannot be read (the
dataset is damaged or was vacuumed under the reader: never silently skipped).
Long reads pin their snapshot with a reader lease, and a file gone mid-read is retried
once against the newer snapshot or raises `rollup.read.read_guard.SnapshotFilesGone`.
"""

from __future__ import annotations

import asyncio
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rollup.read.read_guard import ReadGuard, read_consistently
from rollup.table import schemas
from rollup.table import tombstones as tombstones_mod
from rollup.table.commit import LoadedSnapshot
from rollup.table.manifest import DataFile, Snapshot
from rollup.table.tombstones import Tombstone
from store.base import ObjectStore

_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_PREDICATE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(==|!=|<=|>=|=|<|>)\s*(.*?)\s*")


@dataclass(frozen=True, slots=True)
class Predicate:
    """``column op value``; ``value`` is already of the column's Python type."""

    column: str
    op: str
    value: Any

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown operator {self.op!r}; use one of {sorted(_OPS)}")


@dataclass(slots=True)
class ScanStats:
    """What a scan did: files the snapshot lists, pruned without opening, and read."""

    files_total: int = 0
    files_pruned: int = 0
    files_read: int = 0
    rows_read: int = 0
    rows_masked: int = 0


def parse_value(data_type: pa.DataType, text: str) -> Any:
    """``text`` as a constant of ``data_type``; `ValueError` if it is not one."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    if pa.types.is_timestamp(data_type):
        return schemas.parse_timestamp(text)
    if pa.types.is_integer(data_type):
        return int(text)
    if pa.types.is_floating(data_type):
        return float(text)
    if pa.types.is_string(data_type):
        return text
    raise ValueError(f"cannot compare a {data_type} column with a constant")


def parse_predicate(text: str, schema: pa.Schema) -> Predicate:
    """Parse ``"column op value"`` against ``schema``; `ValueError` naming the problem."""
    match = _PREDICATE.fullmatch(text)
    if not match:
        raise ValueError(f"predicate {text!r} is not 'column op value'")
    column, op, raw = match.groups()
    if column not in schema.names:
        raise ValueError(f"predicate {text!r}: no column {column!r} (columns: {schema.names})")
    try:
        value = parse_value(schema.field(column).type, raw)
    except ValueError as exc:
        raise ValueError(f"predicate {text!r}: {exc}") from None
    return Predicate(column, op, value)


def _file_may_match(
    data_file: DataFile, predicate: Predicate, schema: pa.Schema, partition_column: str
) -> bool:
    # Every row of a file lies in its partition hour; statistics, when present, are
    # tighter still.
    low_json, high_json = data_file.min.get(predicate.column), data_file.max.get(predicate.column)
    bounds = _partition_bounds(data_file) if predicate.column == partition_column else None
    if low_json is not None and high_json is not None:
        data_type = schema.field(predicate.column).type
        bounds = (
            schemas.stat_from_json(data_type, low_json),
            schemas.stat_from_json(data_type, high_json),
        )
    if bounds is None:
        return True  # no statistics: the file may hold anything
    return _range_may_match(bounds[0], bounds[1], predicate.op, predicate.value)


def _partition_bounds(data_file: DataFile) -> tuple[datetime, datetime]:
    # A series_day file sits in its day's last hour and holds the whole day's rows.
    end = schemas.parse_timestamp(f"{data_file.partition.iso}:00:00Z") + timedelta(hours=1)
    span = timedelta(hours=schemas.partition_span_hours(data_file.table))
    return end - span, end - timedelta(microseconds=1)


def _range_may_match(low: Any, high: Any, op: str, value: Any) -> bool:
    """Whether some v in [low, high] satisfies ``v op value``."""
    try:
        if op in ("=", "=="):
            return bool(low <= value <= high)
        if op == "!=":
            return not (low == high == value)
        if op == "<":
            return bool(low < value)
        if op == "<=":
            return bool(low <= value)
        if op == ">":
            return bool(high > value)
        return bool(high >= value)
    except TypeError:
        return True  # incomparable statistics never prune


def plan_files(
    snapshot: Snapshot,
    table: str,
    *,
    where: Sequence[Predicate] = (),
    start: datetime | None = None,
    end: datetime | None = None,
) -> list[DataFile]:
    """The data files of ``table`` that may hold rows matching ``where`` and ``[start,
    end)``, in partition then path order. Pure."""
    schema = schemas.table_schema(table)
    partition_column = schemas.PARTITION_COLUMN[table]
    bounds = list(where)
    if start is not None:
        bounds.append(Predicate(partition_column, ">=", start))
    if end is not None:
        bounds.append(Predicate(partition_column, "<", end))
    kept = [
        f
        for f in snapshot.data_files(table)
        if all(_file_may_match(f, p, schema, partition_column) for p in bounds)
    ]
    return sorted(kept, key=lambda f: (f.partition, f.path))


def _expression(predicate: Predicate, schema: pa.Schema) -> pc.Expression:
    data_type = schema.field(predicate.column).type
    constant = pa.scalar(predicate.value, type=data_type)
    result: pc.Expression = _OPS[predicate.op](pc.field(predicate.column), constant)
    return result


def read_files(
    files: Sequence[DataFile],
    table: str,
    filesystem: pafs.FileSystem,
    root: str,
    *,
    columns: Sequence[str] | None = None,
    where: Sequence[Predicate] = (),
    start: datetime | None = None,
    end: datetime | None = None,
    stats: ScanStats | None = None,
    tombstones: Sequence[Tombstone] = (),
) -> pa.Table:
    """Rows of ``files`` matching ``where`` and ``[start, end)``, projected to ``columns``
    (default: all, in schema order) and cast to the table's schema, without the rows
    ``tombstones`` (the snapshot's deletes) mask in each file. Blocking I/O."""
    schema = schemas.table_schema(table)
    wanted = list(columns) if columns is not None else list(schema.names)
    for name in wanted:
        if name not in schema.names:
            raise ValueError(f"table {table!r} has no column {name!r} (columns: {schema.names})")
    partition_column = schemas.PARTITION_COLUMN[table]
    bounds = list(where)
    if start is not None:
        bounds.append(Predicate(partition_column, ">=", start))
    if end is not None:
        bounds.append(Predicate(partition_column, "<", end))
    masking = tombstones_mod.for_table(tombstones, table)
    needed = list(
        dict.fromkeys(
            [
                *wanted,
                *(p.column for p in bounds),
                *tombstones_mod.needed_columns(table, masking),
            ]
        )
    )
    target = pa.schema([schema.field(name) for name in needed])
    expression: pc.Expression | None = None
    for predicate in bounds:
        term = _expression(predicate, schema)
        expression = term if expression is None else expression & term
    parts: list[pa.Table] = []
    for data_file in files:
        # partitioning=None: the hive-style path must not add date/hour columns.
        part = pq.read_table(
            f"{root}/{data_file.path}",
            filesystem=filesystem,
            columns=needed,
            filters=expression,
            partitioning=None,
        )
        part = part.select(needed).cast(target)
        pending = tombstones_mod.pending_on(masking, data_file)
        part, masked = tombstones_mod.drop_masked(pending, table, part)
        parts.append(part)
        if stats is not None:
            stats.files_read += 1
            stats.rows_read += part.num_rows + masked
            stats.rows_masked += masked
    result = pa.concat_tables(parts) if parts else target.empty_table()
    return result.select(wanted)


async def scan(
    store: ObjectStore,
    table: str,
    *,
    filesystem: pafs.FileSystem,
    root: str,
    version: int | None = None,
    as_of: datetime | None = None,
    columns: Sequence[str] | None = None,
    where: Sequence[Predicate] = (),
    start: datetime | None = None,
    end: datetime | None = None,
    stats: ScanStats | None = None,
    guard: ReadGuard | None = None,
) -> pa.Table:
    """``table`` as of ``version`` or the time ``as_of`` (default: the latest; an empty
    table before the first commit), pruned, filtered and projected as the module doc
    says. ``stats``, when given, is filled in. A long read pins its snapshot with a
    reader lease, and a file vanished mid-read is retried once or reported, never
    skipped (`rollup.read.read_guard`, ``guard``). Errors as in the module doc, and
    `SnapshotFilesGone`."""
    schemas.table_schema(table)

    def files_of(snapshot: Snapshot) -> list[str]:
        return [f.path for f in plan_files(snapshot, table, where=where, start=start, end=end)]

    async def read(loaded: LoadedSnapshot | None) -> pa.Table:
        return await scan_snapshot(
            loaded,
            table,
            filesystem=filesystem,
            root=root,
            columns=columns,
            where=where,
            start=start,
            end=end,
            stats=stats,
        )

    return await read_consistently(
        store,
        version=version,
        as_of=as_of,
        files_of=files_of,
        read=read,
        guard=guard if guard is not None else ReadGuard(purpose=f"scan {table}"),
    )


async def scan_snapshot(
    loaded: LoadedSnapshot | None,
    table: str,
    *,
    filesystem: pafs.FileSystem,
    root: str,
    columns: Sequence[str] | None = None,
    where: Sequence[Predicate] = (),
    start: datetime | None = None,
    end: datetime | None = None,
    stats: ScanStats | None = None,
) -> pa.Table:
    """``table`` as of the snapshot ``loaded`` (None: nothing committed), read once."""
    snapshot = loaded.snapshot if loaded is not None else None
    files = plan_files(snapshot, table, where=where, start=start, end=end) if snapshot else []
    if stats is not None:
        stats.files_read = stats.rows_read = stats.rows_masked = 0  # a retry starts over
        if snapshot is not None:
            stats.files_total = len(snapshot.data_files(table))
            stats.files_pruned = stats.files_total - len(files)
    return await asyncio.to_thread(
        read_files,
        files,
        table,
        filesystem,
        root,
        columns=columns,
        where=where,
        start=start,
        end=end,
        stats=stats,
        tombstones=snapshot.tombstones if snapshot is not None else (),
    )


async def rollup_1m_totals(
    store: ObjectStore, *, filesystem: pafs.FileSystem, root: str, version: int | None = None
) -> tuple[int, float]:
    """``(points, value sum)`` over all of ``rollup_1m`` as of ``version``: the sum of
    ``count`` (every sample) and the exact sum of ``sum`` (finite values only)."""
    table = await scan(
        store,
        "rollup_1m",
        filesystem=filesystem,
        root=root,
        version=version,
        columns=["count", "sum"],
    )
    points = sum(v for v in table.column("count").to_pylist() if v is not None)
    value_sum = math.fsum(v for v in table.column("sum").to_pylist() if v is not None)
    return points, value_sum
