"""The rollup dataset's table schemas (PROTOCOL §4): the one place they are written down.

Timestamps in tables are ``timestamp[us, tz=UTC]`` so that Spark, DuckDB and pyarrow all
read them without conversion. Each table is partitioned by the UTC hour of one timestamp
column (`PARTITION_COLUMN`).

Also here, because it is defined by the schemas: the per-file column statistics recorded
in a snapshot's data files (`file_stats`), and their JSON encoding (`stat_to_json` /
`stat_from_json`), which the reader uses to prune files.

Statistic decisions (PROTOCOL §4 shows ``min``/``max`` but leaves the encoding open):
- Only scalar columns get statistics (``labels`` maps never do).
- Timestamps are RFC 3339 strings with exactly six fractional digits and ``Z``
  (``2026-11-21T10:00:00.000000Z``), so they also compare correctly as text.
- Floats are JSON numbers; a float column holding any NaN or ±Inf gets no statistics
  (JSON cannot carry them, and dropping them would let pruning skip matching rows).
- A column with no non-null value gets no statistics. Missing statistics never prune.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

TS_TYPE = pa.timestamp("us", tz="UTC")
LABELS_TYPE = pa.map_(pa.string(), pa.string())

POINTS_SCHEMA = pa.schema(
    [
        pa.field("ts", TS_TYPE, nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("labels", LABELS_TYPE),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("series", pa.string(), nullable=False),
        pa.field("agent_id", pa.string(), nullable=False),
        pa.field("boot_id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
    ]
)

# count counts every sample; sum/min/max use finite values only (null when none is
# finite); first/last by ts, ties broken by (agent_id, boot_id, seq).
ROLLUP_1M_SCHEMA = pa.schema(
    [
        pa.field("window_start", TS_TYPE, nullable=False),
        pa.field("series", pa.string(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("labels", LABELS_TYPE),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("sum", pa.float64()),
        pa.field("min", pa.float64()),
        pa.field("max", pa.float64()),
        pa.field("first_ts", TS_TYPE, nullable=False),
        pa.field("first", pa.float64(), nullable=False),
        pa.field("last_ts", TS_TYPE, nullable=False),
        pa.field("last", pa.float64(), nullable=False),
    ]
)

# One row per accepted batch included in a snapshot; accepted_hour is "YYYY-MM-DDTHH";
# min_ts/max_ts the batch's point range (null in rows written before them, PROTOCOL §4).
LEDGER_SCHEMA = pa.schema(
    [
        pa.field("manifest_id", pa.string(), nullable=False),
        pa.field("frame_sha256", pa.string(), nullable=False),
        pa.field("record_count", pa.int64(), nullable=False),
        pa.field("accepted_hour", pa.string(), nullable=False),
        pa.field("min_ts", TS_TYPE),
        pa.field("max_ts", TS_TYPE),
    ]
)
LEDGER_OPTIONAL = ("min_ts", "max_ts")
"""Ledger columns that files written before them lack (read as null)."""

# The series index (PROTOCOL §4, §5): per (hour, series) with points in that hour, its
# metric, labels, presented name and labels (`protocol.prom_names`), point count and time
# range. A file holds at most one row per (hour, series); readers combine rows of several
# files (counts add, first/last widen).
SERIES_SCHEMA = pa.schema(
    [
        pa.field("hour_start", TS_TYPE, nullable=False),
        pa.field("series", pa.string(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("labels", LABELS_TYPE),
        pa.field("presented_name", pa.string(), nullable=False),
        pa.field("presented_labels", LABELS_TYPE),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("first_ts", TS_TYPE, nullable=False),
        pa.field("last_ts", TS_TYPE, nullable=False),
    ]
)

# The same per settled UTC day; a day's files are partitioned with its last hour (23).
SERIES_DAY_SCHEMA = pa.schema(
    [pa.field("day_start", TS_TYPE, nullable=False), *list(SERIES_SCHEMA)[1:]]
)

TABLES: dict[str, pa.Schema] = {
    "points": POINTS_SCHEMA,
    "rollup_1m": ROLLUP_1M_SCHEMA,
    "series": SERIES_SCHEMA,
    "series_day": SERIES_DAY_SCHEMA,
}

# The timestamp column whose UTC date/hour names each table's partitions (series_day:
# its date; the hour is always 23, `partition_of_day`).
PARTITION_COLUMN: dict[str, str] = {
    "points": "ts",
    "rollup_1m": "window_start",
    "series": "hour_start",
    "series_day": "day_start",
}

SERIES_TABLES = ("series", "series_day")
"""Tables derived from ``points`` alone (the series index): their retention is that of
``points``, deletes never name them (a tombstone masks points; the compaction or
retraction that removes the points recomputes these rows), and a rewrite combines rows."""

DELETABLE_TABLES = ("points", "rollup_1m")
"""The tables a tombstone (`rollup.table.tombstones`) may name."""

POINTS_ROW_GROUP_ROWS = 65_536
"""Rows per ``points`` row group (PROTOCOL §5 "Matchers"): files are sorted by ``series``
then ``ts``, so a selector of one series reads the row groups whose ``series``
statistics hold it — usually one. At ~10-20 bytes a point compressed, a group is ~1 MB:
large enough that a full scan is not dominated by per-group overhead, small enough that
a single-series read fetches about a megabyte, not the file."""


def partition_of_day(day_start_us: int) -> int:
    """The partition hour (hours since the epoch) of the ``series_day`` rows of the UTC
    day starting at ``day_start_us``: the day's last hour, so that ``points`` retention
    drops the day only after it dropped every hour of it."""
    return day_start_us // 3_600_000_000 + 23


def partition_span_hours(table: str) -> int:
    """How many hours of ``PARTITION_COLUMN`` values a partition covers, counted back from
    the partition's hour + 1 (``series_day``: the whole day, 24; every other table: 1)."""
    return 24 if table == "series_day" else 1


def columns_json(schema: pa.Schema) -> list[dict[str, str]]:
    """The snapshot's ``columns`` list: ``[{"name": ..., "type": ...}]`` in schema order,
    types spelled as pyarrow prints them (``timestamp[us, tz=UTC]``, ``map<string, string>``)."""
    return [{"name": field.name, "type": str(field.type)} for field in schema]


def table_schema(table: str) -> pa.Schema:
    """The schema of ``table``; `KeyError` naming the known tables if there is none."""
    try:
        return TABLES[table]
    except KeyError:
        raise KeyError(f"unknown table {table!r}; tables are {sorted(TABLES)}") from None


# --- per-file statistics --------------------------------------------------------------


def has_stats(data_type: pa.DataType) -> bool:
    """Whether a column of this type gets min/max statistics."""
    return bool(
        pa.types.is_timestamp(data_type)
        or pa.types.is_integer(data_type)
        or pa.types.is_floating(data_type)
        or pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
    )


def stat_to_json(value: Any) -> Any:
    """A Python value from a pyarrow scalar (``as_py()``) → its JSON statistic form."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"timestamp statistic {value!r} has no time zone")
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value


def stat_from_json(data_type: pa.DataType, value: Any) -> Any:
    """The JSON statistic → a Python value comparable with column values of ``data_type``.
    Raises `ValueError` if it does not fit the type."""
    if pa.types.is_timestamp(data_type):
        if not isinstance(value, str):
            raise ValueError(f"timestamp statistic must be a string, got {value!r}")
        return parse_timestamp(value)
    if pa.types.is_integer(data_type):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"integer statistic must be an integer, got {value!r}")
        return value
    if pa.types.is_floating(data_type):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"float statistic must be a number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"string statistic must be a string, got {value!r}")
    return value


def parse_timestamp(text: str) -> datetime:
    """Parse an RFC 3339 UTC time (``...Z`` or ``+00:00``; date alone = midnight UTC).
    Raises `ValueError` saying what is wrong."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise ValueError(f"not an RFC 3339 time: {text!r}") from None
    if moment.tzinfo is None:
        # A bare date or naive time is read as UTC: every time in the dataset is UTC.
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def file_stats(table: pa.Table) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per-column ``(min, max)`` statistics of a file's rows, in JSON form (see module doc)."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    for field in table.schema:
        if not has_stats(field.type):
            continue
        column = table.column(field.name)
        if pa.types.is_floating(field.type):
            finite = pc.is_finite(column)
            # is_finite is null for null values; any False means a NaN or ±Inf is present.
            if pc.any(pc.invert(finite)).as_py():
                continue
        result = pc.min_max(column)
        low, high = result["min"].as_py(), result["max"].as_py()
        if low is None or high is None:
            continue
        if isinstance(low, float) and not (math.isfinite(low) and math.isfinite(high)):
            continue
        mins[field.name] = stat_to_json(low)
        maxs[field.name] = stat_to_json(high)
    return mins, maxs


def merged_stats(
    parts: list[tuple[dict[str, Any], dict[str, Any]]],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Statistics of a file written in chunks: a column keeps them only if every chunk
    had them (missing statistics never prune, so dropping is always safe)."""
    if not parts:
        return {}, {}
    names = set.intersection(*(set(low) for low, _ in parts))
    low = {name: min(p[0][name] for p in parts) for name in sorted(names)}
    high = {name: max(p[1][name] for p in parts) for name in sorted(names)}
    return low, high
