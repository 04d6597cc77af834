"""`collector.promql.select_order`: the run order equals a full sort whenever it answers,
and it declines (None) exactly when samples must be merged (a tie at one millisecond,
stored series presenting one label set that overlap in time)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from collector.promql.matchers import compile_matcher
from collector.promql.select_order import merged_order, ordered_runs


def hourly_files(rng: np.random.Generator, series: int, hours: int) -> tuple[np.ndarray, ...]:
    """Rows as ``points`` files hold them, hour after hour: per file sorted by stored
    series, then time; a series' µs strictly increasing across whole milliseconds."""
    sid, ts = [], []
    for hour in range(hours):
        for s in rng.permutation(series)[: series - 1]:  # one series absent each hour
            count = int(rng.integers(1, 6))
            steps = rng.integers(1, 4000, count).cumsum() * 1000 + rng.integers(0, 1000, count)
            sid.append(np.full(count, s, np.int64))
            ts.append(hour * 10**9 + steps)
    out_sid = np.concatenate(sid)
    out_ts = np.concatenate(ts)
    # Sort within each hour by (sid, ts), as a file is.
    hour_of = out_ts // 10**9
    within = np.lexsort((out_ts, out_sid, hour_of))
    return out_sid[within], out_ts[within]


def full_sort(sid: np.ndarray, ts_us: np.ndarray, rank: np.ndarray) -> np.ndarray:
    return np.lexsort((ts_us, rank[sid]))


def test_runs_give_the_full_sorts_order_over_hourly_files() -> None:
    rng = np.random.default_rng(7)
    for trial in range(20):
        series = int(rng.integers(2, 30))
        sid, ts_us = hourly_files(rng, series, int(rng.integers(1, 5)))
        rank = rng.permutation(series).astype(np.int64)  # presented order differs
        ts_ms = ts_us // 1000
        runs = ordered_runs(sid, ts_us, ts_ms, rank, series)
        assert runs is not None, trial
        expected = full_sort(sid, ts_us, rank)
        got = np.arange(len(sid)) if runs.order is None else runs.order
        assert np.array_equal(got, expected), trial
        assert np.array_equal(runs.counts, np.bincount(rank[sid], minlength=series))


def test_rows_already_in_order_are_not_moved() -> None:
    sid = np.array([0, 0, 1, 1, 2], np.int64)
    ts_us = np.array([1000, 2000, 500, 7000, 0], np.int64)
    runs = ordered_runs(sid, ts_us, ts_us // 1000, np.arange(3, dtype=np.int64), 3)
    assert runs is not None and runs.order is None
    assert runs.counts.tolist() == [2, 2, 1]


def test_a_tie_or_an_overlap_needs_the_merge() -> None:
    rank = np.array([0, 1, 0], np.int64)  # stored 0 and 2 present the same label set
    ident = np.arange(3, dtype=np.int64)
    # Two samples of one stored series in one millisecond (µs 1000 and 1999).
    tie = np.array([1000, 1999], np.int64)
    assert ordered_runs(np.zeros(2, np.int64), tie, tie // 1000, ident, 3) is None
    # The same at a file boundary: the series' last sample of one hour, first of the next.
    sid = np.array([0, 1, 0], np.int64)
    ts_us = np.array([5000, 1000, 5500], np.int64)
    assert ordered_runs(sid, ts_us, ts_us // 1000, ident, 3) is None
    # Two stored series, one presented series, interleaved in time.
    sid = np.array([0, 0, 2, 2], np.int64)
    ts_us = np.array([1000, 3000, 2000, 4000], np.int64)
    assert ordered_runs(sid, ts_us, ts_us // 1000, rank, 2) is None
    # ... and the merge orders them by time, nothing lost (no millisecond shared).
    order, counts, collisions = merged_order(
        rank[sid], ts_us, ts_us // 1000, lambda: sid, lambda: (sid * 0, sid * 0), 2
    )
    assert ts_us[order].tolist() == [1000, 2000, 3000, 4000]
    assert counts.tolist() == [4, 0] and collisions == 0
    # One presented series from two stored series that do not overlap: no merge needed.
    sid = np.array([0, 0, 2, 2], np.int64)
    ts_us = np.array([1000, 2000, 3000, 4000], np.int64)
    runs = ordered_runs(sid, ts_us, ts_us // 1000, rank, 2)
    assert runs is not None and runs.order is None and runs.counts.tolist() == [4, 0]


def test_a_part_meeting_a_new_series_below_a_known_one() -> None:
    """A later part (e.g. the live one) whose rows hold a series read before and, at a
    lower dictionary code, one not seen yet: both selected, in order."""
    from collector.promql.select import SeriesCache, _Rows
    from collector.query.points_scan import Part, ScanWork
    from rollup.table.schemas import POINTS_SCHEMA

    def part(series: list[str], ts_us: list[int]) -> Part:
        n = len(series)
        table = pa.table(
            {
                "ts": pa.array(ts_us, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                "metric": ["m"] * n,
                "labels": pa.array(
                    [[("k", s)] for s in series], POINTS_SCHEMA.field("labels").type
                ),
                "value": [1.0] * n,
                "series": pa.array(series).dictionary_encode(),
                "agent_id": ["a"] * n,
                "boot_id": ["b"] * n,
                "seq": list(range(n)),
            }
        )
        return Part(table)

    rows = _Rows((compile_matcher("RE", "__name__", ".+"),), 100, SeriesCache())
    rows.add(part(["m{k=z}"], [1000]))
    rows.add(part(["m{k=a}", "m{k=z}"], [2000, 3000]))  # codes: a=0 new, z=1 known
    columns = rows.finish(ScanWork()).columns
    assert [dict(s)["k"] for s in columns.label_sets] == ["m{k=a}", "m{k=z}"]
    assert columns.timestamps_ms.tolist() == [2, 1, 3]
