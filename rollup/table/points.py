"""Decoded frames as ``points`` rows (`rollup.table.schemas.POINTS_SCHEMA`): pure pyarrow +
numpy, no Spark, no I/O.

``ts`` is floored from nanoseconds to microseconds (the tables' unit), ``series`` is the
canonical series string (`rollup.table.series`), ``agent_id``/``boot_id`` come from the frame
header and ``seq`` is ``seq_start`` + row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from protocol.frame import Frame
from rollup.table.columns import int64_column, string_codes
from rollup.table.schemas import POINTS_SCHEMA, TS_TYPE
from rollup.table.series import series_array

US_PER_HOUR = 3_600_000_000
_INT64_MAX = 2**63 - 1


class PointsError(ValueError):
    """A decoded frame cannot become ``points`` rows (e.g. seq beyond int64)."""


def points_rows(frame: Frame) -> pa.Table:
    """The ``points`` rows of one decoded frame (`schemas.POINTS_SCHEMA`).

    ``ts`` is floored to microseconds; ``seq`` is ``seq_start + row``. Raises
    `PointsError` if a sequence number does not fit int64 (the table's type)."""
    if frame.seq_end > _INT64_MAX:
        raise PointsError(f"seq_end {frame.seq_end} does not fit points.seq (int64)")
    points = frame.points
    rows = points.num_rows
    ts_ns = int64_column(points.column("ts"))
    ts_us = pa.array(np.floor_divide(ts_ns, 1000), pa.int64()).cast(TS_TYPE)
    metric = points.column("metric").combine_chunks()
    labels = points.column("labels").combine_chunks()
    return pa.Table.from_arrays(
        [
            ts_us,
            metric,
            labels,
            points.column("value").combine_chunks(),
            series_of(metric, labels),
            pa.repeat(pa.scalar(frame.agent_id, pa.string()), rows),
            pa.repeat(pa.scalar(str(frame.boot_id), pa.string()), rows),
            pa.array(np.arange(frame.seq_start, frame.seq_start + rows, dtype=np.int64)),
        ],
        schema=POINTS_SCHEMA,
    )


def series_of(metric: pa.Array, labels: pa.Array) -> pa.Array:
    """`rollup.table.series.series_array`, computed once per distinct (metric, label list).

    A frame repeats a few label sets many times; building the canonical string is the
    costly part, so rows are first grouped exactly by (metric, length, entry codes) —
    entries as given, so two orderings of one map form two groups with the same string —
    and the string is built for one row of each group."""
    rows = len(metric)
    if rows == 0:
        return series_array(metric, labels)
    labels = pa.concat_arrays([labels])  # offsets now start at its own children
    offsets = np.asarray(labels.offsets.to_numpy(), dtype=np.int64)
    lengths = np.diff(offsets)
    valid = np.asarray(pc.is_valid(labels).to_numpy(zero_copy_only=False), dtype=bool)
    lengths = np.where(valid, lengths, 0)
    width = int(lengths.max()) if rows else 0
    start = int(offsets[0])
    count = int(offsets[-1]) - start
    key_codes, _ = string_codes(labels.keys.slice(start, count))
    value_codes, value_dict = string_codes(pc.fill_null(labels.items.slice(start, count), ""))
    entry_codes = key_codes * (len(value_dict) + 1) + value_codes
    signature = np.full((rows, width + 2), -1, dtype=np.int64)
    signature[:, 0] = string_codes(metric)[0]
    signature[:, 1] = lengths
    if width:
        parents = np.repeat(np.arange(rows), np.diff(offsets))
        positions = np.arange(count) - (offsets[:-1] - start)[parents]
        keep = valid[parents]
        signature[parents[keep], positions[keep] + 2] = entry_codes[keep]
    # Each row's signature as one fixed-size binary value: hashed, not sorted.
    row_bytes = signature.shape[1] * 8
    as_binary = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(row_bytes), rows, [None, pa.py_buffer(np.ascontiguousarray(signature))]
    )
    encoded = pc.dictionary_encode(as_binary)
    _, first = np.unique(np.asarray(encoded.indices.to_numpy()), return_index=True)
    picked = pa.array(first)
    distinct = series_array(metric.take(picked), labels.take(picked))
    return distinct.take(encoded.indices)


def hour_index(ts_us: np.ndarray) -> np.ndarray:
    """Hours since the epoch (floor) of microsecond timestamps."""
    hours: np.ndarray = np.floor_divide(ts_us, US_PER_HOUR)
    return hours


def split_by_hour(points: pa.Table) -> dict[int, pa.Table]:
    """``points`` rows by the hour (since the epoch) of their ``ts``."""
    hours = hour_index(int64_column(points.column("ts")))
    if len(hours) == 0:
        return {}
    low, high = int(hours.min()), int(hours.max())
    if low == high:
        return {low: points}
    if np.all(hours[1:] >= hours[:-1]):  # in time order (the usual frame): slices, no copy
        edges = np.searchsorted(hours, np.arange(low, high + 2))
        return {
            low + i: points.slice(int(edges[i]), int(edges[i + 1] - edges[i]))
            for i in range(high - low + 1)
            if edges[i + 1] > edges[i]
        }
    return {int(h): points.filter(pa.array(hours == h)) for h in np.unique(hours)}
