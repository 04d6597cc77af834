"""One-minute aggregates as mergeable partials: pure pyarrow + numpy, no Spark, no I/O.

A *partial* (`PARTIAL_SCHEMA`) summarises some of the samples of one (minute, series):
``count``, ``sum``/``min``/``max`` over the finite values (null when none is finite), and
the first and last sample with their full ordering key. Partials of the same (minute,
series) merge associatively and commutatively (`merge_partials`), which is what lets
executors pre-aggregate their frames, Spark shuffle only partials, and a later run fold
late batches into rows committed earlier.

Order of samples (PROTOCOL §4 "first/last by ts, ties broken by (agent_id, boot_id,
seq)"): samples are ordered by the tuple ``(ts, agent_id, boot_id, seq)`` — ``ts`` in
microseconds as stored in the tables (decision: the tables keep microseconds, so the
rollup must be derivable from the ``points`` table alone; two samples that differ only
below a microsecond tie and are ordered by the rest of the key), strings by code point
(= UTF-8 byte order). ``first`` is the least sample, ``last`` the greatest.

Timestamps travel as int64 microseconds since the epoch (``*_us`` columns) until rows
are written: Spark's timestamp conversions never touch them.

A partial's tie-key columns may be null when the key is unknown (rows read back from
``rollup_1m``, which does not store it). Merging treats an unknown key as the least for
``first`` and the greatest for ``last`` (the committed sample keeps its place on an equal
``ts``); callers that merge such rows resolve equal-``ts`` ties first where the
committed point still exists (`rollup.job.hour_stage.resolve_committed_ties`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup.table.columns import int64_column, nullable, ranks, runs, string_codes
from rollup.table.schemas import LABELS_TYPE, ROLLUP_1M_SCHEMA, TS_TYPE

US_PER_MINUTE = 60_000_000

PARTIAL_SCHEMA = pa.schema(
    [
        pa.field("window_us", pa.int64()),
        pa.field("series", pa.string()),
        pa.field("count", pa.int64()),
        pa.field("sum", pa.float64()),
        pa.field("min", pa.float64()),
        pa.field("max", pa.float64()),
        pa.field("first_ts_us", pa.int64()),
        pa.field("first", pa.float64()),
        pa.field("first_agent", pa.string()),
        pa.field("first_boot", pa.string()),
        pa.field("first_seq", pa.int64()),
        pa.field("last_ts_us", pa.int64()),
        pa.field("last", pa.float64()),
        pa.field("last_agent", pa.string()),
        pa.field("last_boot", pa.string()),
        pa.field("last_seq", pa.int64()),
    ]
)

SERIES_INFO_SCHEMA = pa.schema(
    [
        pa.field("series", pa.string()),
        pa.field("metric", pa.string()),
        pa.field("labels", LABELS_TYPE),
    ]
)
"""One row per series: the metric and labels its canonical string stands for."""


# --- partial aggregates -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Tie:
    """One ordering key per row (first or last candidate): numpy columns."""

    ts: np.ndarray
    agent: np.ndarray
    boot: np.ndarray
    seq: np.ndarray

    def order(self, group: np.ndarray) -> np.ndarray:
        # lexsort's last key is the primary one: group, then (ts, agent, boot, seq).
        return np.lexsort((self.seq, self.boot, self.agent, self.ts, group))


def partials_of_points(
    points: pa.Table, sources: Sequence[tuple[str, str, int]] | None = None
) -> pa.Table:
    """Partials (one per minute and series) of ``points`` rows (`POINTS_SCHEMA`).

    ``sources``, when given, says the rows are runs of ``(agent_id, boot_id, rows)`` in
    order (one per frame): ranking a few pairs is much cheaper than two string columns."""
    if points.num_rows == 0:
        return PARTIAL_SCHEMA.empty_table()
    ts = int64_column(points.column("ts"))
    values = points.column("value").to_numpy()
    finite = np.isfinite(values)
    if sources is not None:
        pair_ranks = {
            pair: rank for rank, pair in enumerate(sorted({(a, b) for a, b, _ in sources}))
        }
        pair_rank = np.repeat(
            np.array([pair_ranks[(a, b)] for a, b, _ in sources], dtype=np.int64),
            np.array([rows for _, _, rows in sources], dtype=np.int64),
        )
        if len(pair_rank) != points.num_rows:
            raise ValueError(f"sources cover {len(pair_rank)} rows, points has {points.num_rows}")
        agent, boot = pair_rank, np.zeros_like(pair_rank)
    else:
        agent, boot = ranks(points.column("agent_id")), ranks(points.column("boot_id"))
    tie = _Tie(ts, agent, boot, int64_column(points.column("seq")))
    window = ts - np.mod(ts, US_PER_MINUTE)
    group, _ = _groups(window, points.column("series"))
    order = tie.order(group)
    starts, ends = runs(group[order])
    first, last = order[starts], order[ends]
    total = len(starts)
    return _partial_table(
        window=window[first],
        series=points.column("series").take(pa.array(first)),
        count=np.diff(np.append(starts, len(order))).astype(np.int64),
        aggregates=_finite_aggregates(
            values, finite, values, finite, values, finite, order, starts
        ),
        first=_take_candidate(points, ("ts", "value", "agent_id", "boot_id", "seq"), first),
        last=_take_candidate(points, ("ts", "value", "agent_id", "boot_id", "seq"), last),
        rows=total,
    )


def merge_partials(partials: pa.Table) -> pa.Table:
    """Merge partials of the same (minute, series) into one row each (`PARTIAL_SCHEMA`).

    ``count`` adds up; ``sum`` adds the non-null sums (null when all are null); ``min``/
    ``max`` over the non-null ones; ``first``/``last`` keep the least/greatest candidate
    by ``(ts, agent, boot, seq)``, an unknown (null) tie key counting as the least for
    ``first`` and the greatest for ``last``."""
    if partials.num_rows == 0:
        return PARTIAL_SCHEMA.empty_table()
    window = int64_column(partials.column("window_us"))
    group, _ = _groups(window, partials.column("series"))
    first_tie = _tie(partials, "first")
    last_tie = _tie(partials, "last")
    order = first_tie.order(group)
    starts, _ = runs(group[order])
    last_order = last_tie.order(group)
    _, last_ends = runs(group[last_order])
    first, last = order[starts], last_order[last_ends]
    counts = np.add.reduceat(int64_column(partials.column("count"))[order], starts)
    sums, sums_ok = nullable(partials.column("sum"))
    mins, mins_ok = nullable(partials.column("min"))
    maxs, maxs_ok = nullable(partials.column("max"))
    first_cols = ("first_ts_us", "first", "first_agent", "first_boot", "first_seq")
    last_cols = ("last_ts_us", "last", "last_agent", "last_boot", "last_seq")
    return _partial_table(
        window=window[first],
        series=partials.column("series").take(pa.array(first)),
        count=counts.astype(np.int64),
        aggregates=_finite_aggregates(sums, sums_ok, mins, mins_ok, maxs, maxs_ok, order, starts),
        first=_take_candidate(partials, first_cols, first),
        last=_take_candidate(partials, last_cols, last),
        rows=len(starts),
    )


def partials_of_rollup(rows: pa.Table) -> pa.Table:
    """``rollup_1m`` rows as partials, with unknown (null) tie keys."""
    count = rows.num_rows
    unknown_text = pa.nulls(count, pa.string())
    unknown_seq = pa.nulls(count, pa.int64())
    return pa.Table.from_arrays(
        [
            _us(rows.column("window_start")),
            rows.column("series"),
            rows.column("count"),
            rows.column("sum"),
            rows.column("min"),
            rows.column("max"),
            _us(rows.column("first_ts")),
            rows.column("first"),
            unknown_text,
            unknown_text,
            unknown_seq,
            _us(rows.column("last_ts")),
            rows.column("last"),
            unknown_text,
            unknown_text,
            unknown_seq,
        ],
        schema=PARTIAL_SCHEMA,
    )


def series_info(points_or_rollup: pa.Table) -> pa.Table:
    """One (series, metric, labels) row per distinct series of ``points`` or
    ``rollup_1m`` rows (the first row of each series)."""
    series = points_or_rollup.column("series")
    if len(series) == 0:
        return SERIES_INFO_SCHEMA.empty_table()
    _, first = np.unique(string_codes(series)[0], return_index=True)
    picked = pa.array(first)
    return pa.Table.from_arrays(
        [
            series.take(picked),
            points_or_rollup.column("metric").take(picked),
            points_or_rollup.column("labels").take(picked),
        ],
        schema=SERIES_INFO_SCHEMA,
    )


def rollup_rows(partials: pa.Table, info: pa.Table) -> pa.Table:
    """``rollup_1m`` rows (`ROLLUP_1M_SCHEMA`) from merged partials, sorted by (series,
    window_start). ``info`` names every series' metric and labels (`series_info`); an
    empty label map is written as null ("no labels"). Raises `ValueError` if a series
    has no info."""
    if partials.num_rows == 0:
        return ROLLUP_1M_SCHEMA.empty_table()
    at = pc.index_in(partials.column("series"), value_set=info.column("series"))
    if at.null_count:
        missing = partials.column("series").filter(pc.is_null(at))[0].as_py()
        raise ValueError(f"no metric/labels known for series {missing!r}")
    labels = _empty_as_null(info.column("labels").take(at))
    rows = pa.Table.from_arrays(
        [
            _ts(partials.column("window_us")),
            partials.column("series"),
            info.column("metric").take(at),
            labels,
            partials.column("count"),
            partials.column("sum"),
            partials.column("min"),
            partials.column("max"),
            _ts(partials.column("first_ts_us")),
            partials.column("first"),
            _ts(partials.column("last_ts_us")),
            partials.column("last"),
        ],
        schema=ROLLUP_1M_SCHEMA,
    )
    order = pc.sort_indices(
        rows, sort_keys=[("series", "ascending"), ("window_start", "ascending")]
    )
    return rows.take(order)


# --- helpers ----------------------------------------------------------------------------


def _empty_as_null(labels: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Label maps with empty ones made null ("no labels" has one spelling in rollup_1m).
    Lengths come from the offsets: list kernels on MapArrays are not all safe in pyarrow 26."""
    if isinstance(labels, pa.ChunkedArray):
        labels = labels.combine_chunks()
    lengths = np.diff(np.asarray(labels.offsets.to_numpy(), dtype=np.int64))
    no_labels = (lengths == 0) | ~np.asarray(
        pc.is_valid(labels).to_numpy(zero_copy_only=False), dtype=bool
    )
    if not no_labels.any():
        return labels
    return labels.take(pa.array(np.arange(len(labels)), mask=no_labels))


def _us(column: pa.ChunkedArray) -> pa.ChunkedArray:
    return column.cast(TS_TYPE).cast(pa.int64())


def _ts(column: pa.ChunkedArray) -> pa.ChunkedArray:
    return column.cast(TS_TYPE)


def _groups(window: np.ndarray, series: pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """One int64 per (minute, series) that orders by minute first."""
    codes, dictionary = string_codes(series)
    minutes = np.floor_divide(window - window.min(), US_PER_MINUTE)
    return minutes * max(1, len(dictionary)) + codes, len(dictionary)


def _tie(partials: pa.Table, which: str) -> _Tie:
    """The ordering key of each row's ``which`` candidate. An unknown key (null agent:
    a committed row whose tie key could not be resolved) sorts first for ``first`` and
    last for ``last``, so the committed sample wins an equal ``ts`` either way."""
    seq, _ = nullable(partials.column(f"{which}_seq"), fill=0)
    agent = ranks(partials.column(f"{which}_agent"))
    boot = ranks(partials.column(f"{which}_boot"))
    seq = seq.astype(np.int64)
    if which == "last":
        unknown = agent == 0
        if unknown.any():
            agent = np.where(unknown, agent.max() + 1, agent)
            boot = np.where(unknown, boot.max() + 1, boot)
            seq = np.where(unknown, np.iinfo(np.int64).max, seq)
    return _Tie(int64_column(partials.column(f"{which}_ts_us")), agent, boot, seq)


def _finite_aggregates(
    sums: np.ndarray,
    sums_ok: np.ndarray,
    mins: np.ndarray,
    mins_ok: np.ndarray,
    maxs: np.ndarray,
    maxs_ok: np.ndarray,
    order: np.ndarray,
    starts: np.ndarray,
) -> tuple[pa.Array, pa.Array, pa.Array]:
    """``sum``/``min``/``max`` per group over the valid entries; null when none is."""

    def reduce(
        op: np.ufunc, values: np.ndarray, ok: np.ndarray, neutral: float
    ) -> tuple[np.ndarray, np.ndarray]:
        picked = np.where(ok, values, neutral)[order]
        any_ok = np.add.reduceat(ok[order].astype(np.int64), starts) > 0
        return op.reduceat(picked, starts), any_ok

    total, total_ok = reduce(np.add, sums, sums_ok, 0.0)
    low, low_ok = reduce(np.minimum, mins, mins_ok, np.inf)
    high, high_ok = reduce(np.maximum, maxs, maxs_ok, -np.inf)
    return (
        pa.array(total, pa.float64(), mask=~total_ok),
        pa.array(low, pa.float64(), mask=~low_ok),
        pa.array(high, pa.float64(), mask=~high_ok),
    )


def _take_candidate(table: pa.Table, columns: tuple[str, ...], rows: np.ndarray) -> list[pa.Array]:
    """The (ts_us, value, agent, boot, seq) columns of the chosen rows."""
    picked = pa.array(rows)
    ts_name, *rest = columns
    ts = table.column(ts_name).take(picked)
    if pa.types.is_timestamp(ts.type):
        ts = ts.cast(pa.int64())
    return [ts, *(table.column(name).take(picked) for name in rest)]


def _partial_table(
    *,
    window: np.ndarray,
    series: pa.ChunkedArray,
    count: np.ndarray,
    aggregates: tuple[pa.Array, pa.Array, pa.Array],
    first: list[pa.Array],
    last: list[pa.Array],
    rows: int,
) -> pa.Table:
    table = pa.Table.from_arrays(
        [
            pa.array(window, pa.int64()),
            series,
            pa.array(count, pa.int64()),
            *aggregates,
            *first,
            *last,
        ],
        schema=PARTIAL_SCHEMA,
    )
    assert table.num_rows == rows
    return table
