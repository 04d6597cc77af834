"""The order of a remote read's selected samples without sorting them (the common case).

`collector.promql.select` must hand back the samples ordered by (presented series, time),
one per millisecond of a presented series. Its selected rows come from ``points`` files
(sorted by stored series, then time: PROTOCOL §4) read hour after hour, then the live
window's frames: runs of one stored series in time order, a few per series and hour. So
instead of sorting every sample, `ordered_runs` cuts the rows into such runs (a run ends
where the stored series changes or time goes back), sorts the runs (a few thousand) by
(presented rank, first µs) and checks, column-wise, that the runs then join into strictly
increasing milliseconds within each presented series: no tie at one millisecond inside a
run, and each run starts after the millisecond its predecessor of the same series ended
in. Then that order is the one a full sort would give (it is unique), nothing needs
merging, and no sample is copied more than once (not at all when the runs are already in
order: the rows are then returned as they are). Otherwise (ties at one millisecond, two
stored series presenting one label set, overlapping parts) it answers None and the
caller merges with `merged_order`: the full sort, and two neighbour comparisons that
keep the winners.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .series_columns import LabelSet, label_order_key

I64 = npt.NDArray[np.int64]


def ranks(
    label_sets: Sequence[LabelSet | None], series: Sequence[str], writers: Sequence[tuple[str, str]]
) -> tuple[list[LabelSet], I64, I64, I64]:
    """Presented series in Prometheus' order; per stored series (its presented label set,
    None when not selected, and its ``series`` string) its presented rank and its
    byte-order rank; per writer its (agent, boot) byte-order rank."""
    distinct_sets = sorted({s for s in label_sets if s is not None}, key=label_order_key)
    rank_of_set = {label_set: i for i, label_set in enumerate(distinct_sets)}
    rank = np.array([rank_of_set.get(s, -1) if s is not None else -1 for s in label_sets], np.int64)
    lex = np.empty(len(series), np.int64)
    lex[sorted(range(len(series)), key=lambda i: series[i].encode())] = np.arange(len(series))
    writer_rank = np.empty(len(writers), np.int64)
    by_bytes = sorted(range(len(writers)), key=lambda i: tuple(x.encode() for x in writers[i]))
    writer_rank[by_bytes] = np.arange(len(writers))
    return distinct_sets, rank, lex, writer_rank


@dataclass(frozen=True, slots=True)
class RunOrder:
    """The samples' order (None: as they are) and each presented series' sample count."""

    order: I64 | None
    counts: I64


def ordered_runs(sid: I64, ts_us: I64, ts_ms: I64, rank: I64, series_count: int) -> RunOrder | None:
    """The order of samples ``(sid, ts_us)`` by (``rank[sid]``, time) when no merging is
    needed (see the module doc), else None. ``ts_ms`` is ``ts_us`` floored to ms;
    ``rank`` maps a stored series id to its presented series (``0..series_count-1``)."""
    n = len(sid)
    if n == 0:
        return RunOrder(None, np.zeros(series_count, np.int64))
    cut = np.empty(n, bool)
    cut[0] = True
    np.not_equal(sid[1:], sid[:-1], out=cut[1:])
    cut[1:] |= ts_us[1:] < ts_us[:-1]
    starts = np.flatnonzero(cut)
    del cut
    # Inside a run µs never decrease: two neighbours in one millisecond are a tie.
    tie = ts_ms[1:] == ts_ms[:-1]
    tie[starts[1:] - 1] = False  # neighbours across a run boundary are checked below
    if tie.any():
        return None
    del tie
    ends = np.empty(len(starts), np.int64)
    ends[:-1] = starts[1:]
    ends[-1] = n
    run_rank = rank[sid[starts]]
    run_order = np.lexsort((ts_us[starts], run_rank))
    r = run_rank[run_order]
    first_ms, last_ms = ts_ms[starts[run_order]], ts_ms[ends[run_order] - 1]
    same = r[1:] == r[:-1]
    if (same & (first_ms[1:] <= last_ms[:-1])).any():
        return None
    lengths = ends - starts
    counts = np.zeros(series_count, np.int64)
    np.add.at(counts, run_rank, lengths)
    if bool((run_order[1:] > run_order[:-1]).all()):
        return RunOrder(None, counts)
    moved = lengths[run_order]
    new_starts = np.zeros(len(moved), np.int64)
    np.cumsum(moved[:-1], out=new_starts[1:])
    order = np.repeat(starts[run_order] - new_starts, moved)
    order += np.arange(n, dtype=np.int64)
    return RunOrder(order, counts)


def merged_order(
    presented: I64,
    ts_us: I64,
    ts_ms: I64,
    stored: Callable[[], I64],
    writer_seq: Callable[[], tuple[I64, I64]],
    series_count: int,
) -> tuple[I64, I64, int]:
    """The order of the winning samples, each presented series' count and the samples
    lost to a name collision (`collector.promql.select`'s rules): ``presented`` is each
    sample's presented rank, ``stored()`` its stored series' byte-order rank and
    ``writer_seq()`` its writer's (agent, boot) byte-order rank and its ``seq`` (asked
    for only when two samples of a presented series share a millisecond)."""
    collisions = 0
    # Ordered by (series, µs), no two samples of a presented series share a
    # millisecond: nothing to merge.
    order = np.lexsort((ts_us, presented))
    p, m = presented[order], ts_ms[order]
    if len(order) > 1 and ((p[1:] == p[:-1]) & (m[1:] == m[:-1])).any():
        s_rank = stored()
        writer, seq = writer_seq()
        order = np.lexsort((seq, writer, ts_us, s_rank, ts_ms, presented))
        p, m, s = presented[order], ts_ms[order], s_rank[order]
        # Within one stored series at one millisecond: the last by (µs, agent, boot, seq).
        last = np.ones(len(order), bool)
        last[:-1] = (p[1:] != p[:-1]) | (m[1:] != m[:-1]) | (s[1:] != s[:-1])
        order, p = order[last], p[last]
        m = m[last]
        # Within one presented series at one millisecond: the smallest stored series.
        first = np.ones(len(order), bool)
        first[1:] = (p[1:] != p[:-1]) | (m[1:] != m[:-1])
        collisions = int(len(first) - np.count_nonzero(first))
        order, p = order[first], p[first]
    return order, np.bincount(p, minlength=series_count).astype(np.int64), collisions
