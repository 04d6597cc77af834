"""The points table of a frame: column rules of PROTOCOL §1 and the canonical shape.

All row checks are vectorized (pyarrow.compute); the Python-level work is per column,
not per row, so a 100k-row frame costs milliseconds. Messages name the column, the
0-based row (stream order) and the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.compute as pc

from protocol._frame_error import FrameError

MAX_METRIC_BYTES = 256
MAX_LABELS_PER_ROW = 64
MAX_LABEL_KEY_BYTES = 128
MAX_LABEL_VALUE_BYTES = 1024

TS_TYPE = pa.timestamp("ns", tz="UTC")
LABELS_TYPE = pa.map_(pa.string(), pa.string())

POINTS_SCHEMA = pa.schema(
    [
        pa.field("ts", TS_TYPE, nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("labels", LABELS_TYPE),
    ]
)
"""The canonical points schema: what `decode_frame` returns and `encode_frame` writes."""

_STRING_TYPES = (pa.string(), pa.large_string())


def _type_ok(name: str, type_: Any) -> bool:
    if name == "ts":
        return bool(type_ == TS_TYPE)
    if name == "metric":
        if pa.types.is_dictionary(type_):
            return type_.value_type in _STRING_TYPES
        return type_ in _STRING_TYPES
    if name == "value":
        return bool(type_ == pa.float64())
    return bool(
        pa.types.is_map(type_) and type_.key_type == pa.string() and type_.item_type == pa.string()
    )


_RULE_TYPES = {
    "ts": "timestamp[ns, tz=UTC]",
    "metric": "utf8, large_utf8 or a dictionary of either",
    "value": "float64",
    "labels": "map<utf8, utf8>",
}


def check_points_schema(schema: pa.Schema) -> None:
    """Each of ts, metric, value, labels present exactly once with an allowed type."""
    for name, rule in _RULE_TYPES.items():
        found = schema.get_all_field_indices(name)
        if not found:
            raise FrameError(f"payload: missing column '{name}'")
        if len(found) > 1:
            raise FrameError(f"payload: column '{name}' appears {len(found)} times")
        type_ = schema.field(found[0]).type
        if not _type_ok(name, type_):
            raise FrameError(f"{name}: column type {type_} is not allowed (must be {rule})")


def _first(mask: Any) -> int | None:
    """Index of the first True in a boolean array, or None."""
    if not pc.any(mask).as_py():
        return None
    return int(pc.index(mask, True).as_py())


def _check_no_nulls(name: str, array: Any) -> None:
    if array.null_count:
        raise FrameError(f"{name}: row {_first(array.is_null())} is null")


def _first_outside(lengths: Any, low: int, high: int) -> int | None:
    """Index of the first length outside low..high, or None (one min_max when all fit)."""
    bounds = pc.min_max(lengths)
    if bounds["min"].as_py() >= low and bounds["max"].as_py() <= high:
        return None
    return _first(pc.or_(pc.less(lengths, low), pc.greater(lengths, high)))


def _check_metric(array: Any) -> None:
    """The metric rules, without materializing a dictionary's values per row.

    A dictionary column is checked on its dictionary (nulls and lengths of the distinct
    values) and mapped to rows only through bit masks, so a tiny frame of many rows that
    all point at one 256-byte value costs a few bits per row here, not 256 bytes.
    Unreferenced dictionary values are not rows: they are not checked.
    """
    if not pa.types.is_dictionary(array.type):
        _check_no_nulls("metric", array)
        lengths = pc.binary_length(array)
        row = _first_outside(lengths, 1, MAX_METRIC_BYTES)
        if row is not None:
            _metric_size_error(row, lengths[row].as_py())
        return
    indices, values = array.indices, array.dictionary
    if indices.null_count or values.null_count:
        value_is_null = pc.take(values.is_null(), indices)  # null where the index is null
        row = _first(pc.fill_null(value_is_null, True))
        if row is not None:
            raise FrameError(f"metric: row {row} is null")
    lengths = pc.binary_length(values)  # one per distinct value
    outside = pc.fill_null(
        pc.or_(pc.less(lengths, 1), pc.greater(lengths, MAX_METRIC_BYTES)), False
    )
    if pc.any(outside).as_py():
        row = _first(pc.take(outside, indices))
        if row is not None:
            _metric_size_error(row, lengths[indices[row].as_py()].as_py())


def _metric_size_error(row: int, size: int) -> NoReturn:
    raise FrameError(f"metric: row {row} is {size} bytes (must be 1..{MAX_METRIC_BYTES})")


@dataclass(frozen=True, slots=True)
class _CheckedLabels:
    """A labels column whose rules hold: the live entries and the entry count per row."""

    keys: Any
    items: Any
    counts: Any


def _check_labels(array: Any) -> _CheckedLabels:
    """Check every label rule; return what the canonical column is rebuilt from.

    A null row's entries are ignored and dropped (Arrow lets a null list slot cover a
    non-empty child segment). Parent indices come from a ListArray over the map's
    offsets: `list_parent_indices` on a MapArray aborts the process in pyarrow 26.
    """
    offsets = array.offsets
    valid = array.is_valid()
    key_lists = pa.ListArray.from_arrays(offsets, array.keys)
    parents = pc.list_parent_indices(key_lists)
    keys = key_lists.flatten()
    items = pa.ListArray.from_arrays(offsets, array.items).flatten()
    counts = pc.subtract(offsets[1:], offsets[:-1])
    if array.null_count:
        counts = pc.if_else(valid, counts, 0)
        # Null rows usually cover no entries (then nothing is dropped: one sum instead of
        # a take and three filters).
        if (pc.sum(counts).as_py() or 0) != len(keys):
            live = pc.take(valid, parents)
            keys, items, parents = keys.filter(live), items.filter(live), parents.filter(live)
    most = pc.max(counts).as_py() or 0
    if most > MAX_LABELS_PER_ROW:
        row = _first(pc.greater(counts, MAX_LABELS_PER_ROW))
        raise FrameError(
            f"labels: row {row} has {counts[row].as_py()} entries (max {MAX_LABELS_PER_ROW})"
        )
    if len(keys):
        _check_label_entries(keys, items, parents, most)
    return _CheckedLabels(keys, items, counts)


def _canonical_labels(array: Any, checked: _CheckedLabels) -> Any:
    """The labels column rebuilt with the canonical map type, after `_check_labels`."""
    new_offsets = pa.concat_arrays(
        [pa.array([0], pa.int32()), pc.cumulative_sum(checked.counts).cast(pa.int32())]
    )
    mask = pc.invert(array.is_valid()) if array.null_count else None
    return pa.MapArray.from_arrays(
        new_offsets, checked.keys, checked.items, type=LABELS_TYPE, mask=mask
    )


def _check_label_entries(keys: Any, items: Any, parents: Any, most_per_row: int) -> None:
    def row_of(entry: int) -> int:
        return int(parents[entry].as_py())

    if keys.null_count:
        raise FrameError(f"labels: row {row_of(_first(keys.is_null()) or 0)} has a null key")
    key_lengths = pc.binary_length(keys)
    bad = _first_outside(key_lengths, 1, MAX_LABEL_KEY_BYTES)
    if bad is not None:
        size = key_lengths[bad].as_py()
        problem = "an empty key" if size == 0 else f"a {size}-byte key"
        raise FrameError(
            f"labels: row {row_of(bad)} has {problem} (must be 1..{MAX_LABEL_KEY_BYTES} bytes)"
        )
    if items.null_count:
        bad = _first(items.is_null()) or 0
        raise FrameError(f"labels: row {row_of(bad)} key {keys[bad].as_py()!r} has a null value")
    item_lengths = pc.binary_length(items)
    bad = _first_outside(item_lengths, 0, MAX_LABEL_VALUE_BYTES)
    if bad is not None:
        raise FrameError(
            f"labels: row {row_of(bad)} key {keys[bad].as_py()!r} has a "
            f"{item_lengths[bad].as_py()}-byte value (max {MAX_LABEL_VALUE_BYTES})"
        )
    if most_per_row <= NEARBY_CHECK_MAX_ENTRIES and not _repeat_nearby(keys, parents, most_per_row):
        return  # no row repeats a key (the sort below finds and names a repeat)
    _check_unique_keys(keys, parents)


# Rows of at most this many entries are checked for repeated keys by comparing each entry
# with its next few neighbours (a row's entries are contiguous): (n - 1) equality passes
# over the entries, ~10x cheaper for typical rows than hashing every key (a 575-row frame
# of 2,046 entries: ~25 vs ~190 µs). Longer rows, and any repeat found, take the sort.
NEARBY_CHECK_MAX_ENTRIES = 8


def _repeat_nearby(keys: Any, parents: Any, most_per_row: int) -> bool:
    """Whether some row has two equal keys, given no row has more than
    ``most_per_row`` entries: entry i and entry i + d (d < most_per_row) with the same
    parent row and the same key. Exact: two entries of one row are closer than that."""
    for distance in range(1, min(most_per_row, len(keys))):
        same_row = pc.equal(parents[distance:], parents[:-distance])
        same_key = pc.equal(keys[distance:], keys[:-distance])
        if pc.any(pc.and_(same_row, same_key)).as_py():
            return True
    return False


def _check_unique_keys(keys: Any, parents: Any) -> None:
    """No (row, key) pair twice: code each pair as one int64, sort, compare neighbours.

    The code is row * number_of_distinct_keys + key_code, so the smallest repeated code
    is in the first offending row. (Sorting int64 is ~10x faster here than hashing with
    count_distinct or a two-column group_by.)
    """
    encoded = pc.dictionary_encode(keys)
    distinct_keys = len(encoded.dictionary)
    codes = pc.add(pc.multiply(parents, distinct_keys), encoded.indices.cast(pa.int64()))
    ordered = pc.take(codes, pc.array_sort_indices(codes))
    repeat = _first(pc.equal(ordered[1:], ordered[:-1]))
    if repeat is None:
        return
    row, key_code = divmod(ordered[repeat].as_py(), distinct_keys)
    raise FrameError(
        f"labels: row {row} has duplicate key {encoded.dictionary[key_code].as_py()!r}"
    )


def _checked_columns(table: pa.Table, expected_rows: int | None) -> dict[str, Any]:
    """Schema, row count and full buffer validation; the four columns, one chunk each."""
    check_points_schema(table.schema)
    rows = table.num_rows
    if expected_rows is not None and rows != expected_rows:
        raise FrameError(f"payload has {rows} rows but record_count is {expected_rows}")
    if rows == 0:
        raise FrameError("payload has 0 rows (a frame carries at least 1)")
    columns = {}
    for name in _RULE_TYPES:
        column = table.column(name)
        # The IPC reader checks structure only; full validation (offsets, UTF-8,
        # dictionary indices) must pass before anything (even concatenation) reads
        # the buffers, or a hostile frame could make a kernel read out of bounds.
        for chunk in column.chunks:
            chunk.validate(full=True)
        # One chunk (a stream of one record batch: every frame this project writes) is
        # taken as it is; combining copies even a single chunk.
        columns[name] = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    _check_no_nulls("ts", columns["ts"])
    return columns


def _metric_bytes(array: Any, rows: int, limit: int | None) -> int:
    """Bytes of text the metric column holds once decoded to plain utf8, after its checks.

    A dictionary column: at most ``rows`` x its longest referenced value; counted exactly
    (one length per row, 4-8 bytes, never the text itself) only when that bound is over
    ``limit``, so a frame that fits is never charged its dictionary's worst case."""
    if not pa.types.is_dictionary(array.type):
        return int(pc.sum(pc.binary_length(array)).as_py() or 0)
    lengths = pc.binary_length(array.dictionary)
    longest = int(pc.max(lengths).as_py() or 0)
    if limit is None or rows * longest <= limit:
        return rows * longest
    return int(pc.sum(pc.take(pc.fill_null(lengths, 0), array.indices)).as_py() or 0)


@dataclass(frozen=True, slots=True)
class CheckedPoints:
    """A points table whose every rule holds, not yet in canonical shape.

    ``decoded_bytes``: the buffers `canonical` allocates or keeps, at most (fixed-width
    ts and value, the offsets, the metric text with any dictionary expanded per row, the
    live label entries); a dictionary-encoded frame can be many times its own size."""

    columns: dict[str, Any]
    labels: _CheckedLabels
    decoded_bytes: int
    ts_range: tuple[int, int]  # (min, max) ``ts`` in unix ns (the index rows', §3.7)

    def canonical(self) -> pa.Table:
        """The table in `POINTS_SCHEMA` shape (dictionaries decoded, extra columns gone)."""
        columns = self.columns
        metric = columns["metric"]
        if pa.types.is_dictionary(metric.type):
            metric = pc.cast(metric, metric.type.value_type)
        if metric.type != pa.string():
            metric = pc.cast(metric, pa.string())
        return pa.Table.from_arrays(
            [
                columns["ts"],
                metric,
                columns["value"],
                _canonical_labels(columns["labels"], self.labels),
            ],
            schema=POINTS_SCHEMA,
        )


def checked_points(
    table: pa.Table, *, expected_rows: int | None = None, max_decoded_bytes: int | None = None
) -> CheckedPoints:
    """Check `table` against every points rule without building the canonical table: a
    metric dictionary is never expanded per row, so the memory used stays proportional to
    the table's own buffers (see `protocol.frame`'s `payload_check_memory_bound`).

    `max_decoded_bytes`: refuse a table whose canonical form would take more than this
    (`CheckedPoints.decoded_bytes`), e.g. many rows pointing at one long dictionary value.
    Raises FrameError for any rule broken; Arrow errors (e.g. invalid buffers found by
    full validation) propagate for the caller to convert."""
    columns = _checked_columns(table, expected_rows)
    rows = table.num_rows
    _check_metric(columns["metric"])
    _check_no_nulls("value", columns["value"])
    labels = _check_labels(columns["labels"])
    metric_bytes = _metric_bytes(columns["metric"], rows, max_decoded_bytes)
    label_bytes = (
        int(pc.sum(pc.binary_length(labels.keys)).as_py() or 0)
        + int(pc.sum(pc.binary_length(labels.items)).as_py() or 0)
        + 8 * (len(labels.keys) + 1)  # key and value offsets
        + (rows + 7) // 8  # validity
    )
    decoded = 16 * rows + 8 * (rows + 1) + metric_bytes + label_bytes
    if max_decoded_bytes is not None and decoded > max_decoded_bytes:
        what = (
            "metric dictionary expanded per row"
            if pa.types.is_dictionary(columns["metric"].type)
            else "its columns"
        )
        raise FrameError(
            f"payload decodes to {decoded} bytes ({rows} rows, {metric_bytes} bytes of metric "
            f"text: {what}) > max_raw_bytes {max_decoded_bytes}"
        )
    return CheckedPoints(columns, labels, decoded, time_range(columns["ts"]))


def time_range(ts: Any) -> tuple[int, int]:
    """(min, max) of a non-empty, non-null ``timestamp[ns]`` column, in unix ns (the
    scalars' ``value``: no cast of the column to int64 first)."""
    bounds = pc.min_max(ts)
    return int(bounds["min"].value), int(bounds["max"].value)


def canonical_points(
    table: pa.Table, *, expected_rows: int | None = None, max_decoded_bytes: int | None = None
) -> pa.Table:
    """Check `table` against the points rules and return it in `POINTS_SCHEMA` shape.

    Extra columns are dropped; metric dictionaries are decoded to plain utf8 (up to
    `MAX_METRIC_BYTES` per row, whatever the dictionary's own size, unless
    `max_decoded_bytes` refuses it first); every column is one chunk. `expected_rows`
    (the frame's record_count) is checked first. Raises as `checked_points`.
    """
    return checked_points(
        table, expected_rows=expected_rows, max_decoded_bytes=max_decoded_bytes
    ).canonical()
