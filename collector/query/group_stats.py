"""Row-group statistics of a ``points`` file, parsed once per cached footer
(`collector.query.points_scan` prunes row groups by them): ``ts`` in microseconds,
``metric`` and ``series`` min/max."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pyarrow.parquet as pq


def _us(moment: Any) -> int | None:
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
        return int((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)
    return None


def _ts_bounds_us(stats: Any) -> tuple[int, int] | None:
    """A row group's ``ts`` statistics in microseconds, or None (no pruning)."""
    if stats is None or not stats.has_min_max:
        return None
    if stats.physical_type == "INT64":
        logical = stats.logical_type
        try:
            unit = json.loads(logical.to_json()).get("timeUnit") if logical is not None else None
        except (ValueError, AttributeError):
            unit = None
        scale = {"milliseconds": 1000, "microseconds": 1}.get(unit or "")
        if scale is not None:
            return int(stats.min_raw) * scale, int(stats.max_raw) * scale
    low, high = _us(stats.min), _us(stats.max)
    return (low, high) if low is not None and high is not None else None


GroupStats = tuple[tuple[int, int] | None, tuple[Any, Any] | None, tuple[Any, Any] | None]
"""A row group's ``ts`` bounds in µs, ``metric`` and ``series`` min/max (None: unknown)."""


def group_stats(metadata: pq.FileMetaData) -> list[GroupStats]:
    found = []
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        ts = metric = series = None
        for c in range(group.num_columns):
            column = group.column(c)
            name = column.path_in_schema
            if name == "ts":
                ts = _ts_bounds_us(column.statistics)
            elif name in ("metric", "series"):
                stats = column.statistics
                if stats is not None and stats.has_min_max:
                    if name == "metric":
                        metric = (stats.min, stats.max)
                    else:
                        series = (stats.min, stats.max)
        found.append((ts, metric, series))
    return found
