"""Rows of a live query: live points filtered, merged with the committed rows. Pure pyarrow.

- `live_points`: the ``points`` rows (`rollup.table.points.points_rows`) of the window's
  batches that match a query — filtered on the decoded frame first (agent, metric, time,
  labels), so rows are built only for matching points, with ``seq`` kept right.
- `merge_points`: committed + live ``points`` rows, ordered by (series, ts, agent, boot,
  seq).
- `merge_rollup`: the ``rollup_1m`` shape from committed ``rollup_1m`` rows and live
  points aggregated per minute: both become mergeable partials (`rollup.table.aggregate`),
  ``count`` adds, ``sum/min/max`` over finite values, ``first/last`` by (ts, agent, boot,
  seq); a committed first/last whose ``ts`` ties a live one is resolved from the
  committed points (`rollup.job.hour_stage.resolve_committed_ties`), as a rollup run does.
- `rollup_of_points`: the ``rollup_1m`` shape from points alone (an ``agent`` filter:
  ``rollup_1m`` has no agent column, so the committed points are aggregated instead).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from protocol.frame import Frame
from rollup.table import aggregate
from rollup.table.columns import int64_column
from rollup.table.points import points_rows
from rollup.table.schemas import POINTS_SCHEMA, ROLLUP_1M_SCHEMA
from rollup.table.ties import resolve_committed_ties

from .api import LiveQuery


def label_mask(labels: pa.Array | pa.ChunkedArray, wanted: Sequence[tuple[str, str]]) -> pa.Array:
    """True where every ``(key, value)`` of ``wanted`` is in the row's label map."""
    if isinstance(labels, pa.ChunkedArray):
        labels = labels.combine_chunks()
    mask = pa.array(np.ones(len(labels), dtype=bool))
    for key, value in wanted:
        found = pc.map_lookup(labels, pa.scalar(key), "first")
        mask = pc.and_(mask, pc.fill_null(pc.equal(found, pa.scalar(value)), False))
    return mask


def filter_labels(rows: pa.Table, wanted: Sequence[tuple[str, str]]) -> pa.Table:
    if not wanted or rows.num_rows == 0:
        return rows
    return rows.filter(label_mask(rows.column("labels"), wanted))


def frame_matches(frame: Frame, query: LiveQuery, range_ns: tuple[int, int]) -> pa.Table:
    """The ``points`` rows of ``frame`` that ``query`` selects (``ts`` in ``range_ns``
    after flooring to microseconds, like the tables)."""
    if query.agent is not None and frame.agent_id != query.agent:
        return POINTS_SCHEMA.empty_table()
    points = frame.points
    low, high = range_ns
    ts_us = int64_column(points.column("ts")) // 1000
    mask = (ts_us >= -((-low) // 1000)) & (ts_us < -((-high) // 1000))
    keep = pc.and_(pa.array(mask), pc.equal(points.column("metric"), pa.scalar(query.metric)))
    if query.labels:
        keep = pc.and_(keep, label_mask(points.column("labels"), query.labels))
    indices = np.flatnonzero(np.asarray(keep.to_numpy(zero_copy_only=False), dtype=bool))
    return frame_rows(frame, indices)


def frame_rows(frame: Frame, indices: np.ndarray) -> pa.Table:
    """The ``points`` rows of ``frame``'s points at ``indices`` (ascending), each with its
    own ``seq`` (``seq_start`` + its index in the frame). Shared with remote read
    (`collector.query.points_scan`)."""
    if len(indices) == 0:
        return POINTS_SCHEMA.empty_table()
    picked = dataclasses.replace(frame, points=frame.points.take(pa.array(indices)))
    rows = points_rows(picked)
    seq = pa.array(frame.seq_start + indices.astype(np.int64), pa.int64())
    return rows.set_column(rows.schema.get_field_index("seq"), "seq", seq)


def live_points(frames: Sequence[Frame], query: LiveQuery, max_rows: int) -> tuple[pa.Table, int]:
    """Matching rows of ``frames`` and how many frames had some; `TooManyRows` past
    ``max_rows``."""
    parts: list[pa.Table] = []
    total = 0
    for frame in frames:
        part = frame_matches(frame, query, query.points_range_ns)
        total += part.num_rows
        if total > max_rows:
            raise TooManyRows(total)
        if part.num_rows:
            parts.append(part)
    table = pa.concat_tables(parts) if parts else POINTS_SCHEMA.empty_table()
    return table, len(parts)


class TooManyRows(Exception):
    def __init__(self, rows: int) -> None:
        super().__init__(f"more than {rows - 1} rows")
        self.rows = rows


def merge_points(committed: pa.Table, live: pa.Table) -> pa.Table:
    rows = pa.concat_tables([committed.cast(POINTS_SCHEMA), live.cast(POINTS_SCHEMA)])
    keys = ["series", "ts", "agent_id", "boot_id", "seq"]
    return rows.take(pc.sort_indices(rows, sort_keys=[(k, "ascending") for k in keys]))


def rollup_of_points(points: pa.Table) -> pa.Table:
    partials = aggregate.partials_of_points(points)
    return aggregate.rollup_rows(partials, aggregate.series_info(points))


def merge_rollup(
    committed: pa.Table, live: pa.Table, committed_points: Callable[[list[str]], pa.Table]
) -> pa.Table:
    """``rollup_1m`` rows of committed rows plus live points (see the module doc)."""
    committed = committed.cast(ROLLUP_1M_SCHEMA)
    if live.num_rows == 0:
        return committed.take(
            pc.sort_indices(
                committed, sort_keys=[("series", "ascending"), ("window_start", "ascending")]
            )
        )
    new = aggregate.partials_of_points(live)
    old = aggregate.partials_of_rollup(committed)
    old = resolve_committed_ties(old, new, committed_points)
    merged = aggregate.merge_partials(pa.concat_tables([old, new]))
    info = aggregate.series_info(
        pa.concat_tables(
            [
                committed.select(["series", "metric", "labels"]),
                live.select(["series", "metric", "labels"]).cast(
                    committed.select(["series", "metric", "labels"]).schema
                ),
            ]
        )
    )
    return aggregate.rollup_rows(merged, info)


def json_cell(value: Any) -> Any:
    """One value as JSON: times RFC 3339 (µs, Z), maps as objects, non-finite floats as
    the strings ``NaN``, ``+Inf``, ``-Inf`` (JSON has no such numbers)."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    if isinstance(value, list) and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        return dict(value)
    return value


def json_rows(table: pa.Table) -> list[list[Any]]:
    columns = [table.column(name).to_pylist() for name in table.column_names]
    return [[json_cell(column[i]) for column in columns] for i in range(table.num_rows)]
