"""Selecting the samples of one remote-read query (PROTOCOL §5 "Series model").

Given a checked `ReadQuery` (matchers compiled, ``[start_ms, end_ms]`` already narrowed
to the hints), `select_series` reads the latest committed snapshot's ``points`` and the
live window's batches the snapshot's ledger lacks (`collector.query.points_scan`: the
merge of ``/v1/query``, tombstones masking both parts) and returns a `SeriesColumns`:

- a stored series (its ``series`` string) is presented once (`protocol.prom_names`:
  ``__name__`` = ``lm_escape`` of its metric plus its presented labels; stored labels
  dropped for a name clash are counted, ``lm_query_dropped_labels_total``), and the
  matchers are evaluated on that presented set, per stored series, never per sample;
- timestamps are the stored microseconds floored to milliseconds; within one stored
  series at one millisecond the last point by ``(ts µs, agent_id, boot_id, seq)`` wins,
  in both parts alike (so a batch's winner does not change when it is committed);
- stored series that present the same label set are one series, merged by time; at one
  millisecond the lexically (byte-wise) smaller stored ``series`` wins, and each sample
  that loses so is counted (``lm_query_name_collisions_total``);
- series are unique and in Prometheus' label order (`series_columns.label_order_key`).

All of it column-wise: each part's rows are reduced to five numpy columns (stored series
id, µs, value, writer id, seq); one ``lexsort`` orders them and two neighbour
comparisons keep the winners. Python runs once per stored series and per writer
(agent, boot), never per sample. Values are the stored float64, bit for bit.

More than ``max_samples`` rows selected raises `TooManySamples` as soon as it is
known (the rows counted before ties at one millisecond are merged, so a read is never
cut short, and at most ``max_samples`` rows are ever held). ``check`` is called before
each unit of work (a row group, a frame) and raises to stop the read.

`resolve_series` is the seam to the ``series`` table (PROTOCOL §5: resolve matchers
against ``series`` rows first, then read only those stored series' row groups): today it
turns an equality on ``__name__`` into bounds on the stored metric (exact, or the prefix
before the first ``_``, which ``lm_escape`` never changes), pushed down to the manifest's
file statistics and each row group's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from collector.query.points_scan import MetricBounds, ScanWork, committed_parts, live_parts
from protocol.frame import Frame
from protocol.prom_names import NAME_LABEL, escape_metric_array, presented_labels_array
from rollup.table.columns import int64_column
from rollup.table.manifest import Snapshot

from .matchers import LabelMatcher, select_label_sets
from .series_columns import LabelSet, SeriesColumns, label_order_key


@dataclass(frozen=True, slots=True)
class ReadQuery:
    """One checked query: samples with ``start_ms <= t <= end_ms`` (Prometheus' range is
    closed) of the series every matcher selects."""

    start_ms: int
    end_ms: int
    matchers: tuple[LabelMatcher, ...]

    @property
    def empty(self) -> bool:
        return self.start_ms > self.end_ms or not self.matchers

    @property
    def us_range(self) -> tuple[int, int]:
        """The stored ``ts`` (µs) range whose floor to ms lies in the query: half-open."""
        return self.start_ms * 1000, (self.end_ms + 1) * 1000


class TooManySamples(Exception):
    def __init__(self, count: int, limit: int) -> None:
        super().__init__(f"more than {limit} samples selected (query.max_read_samples)")
        self.count = count
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Selection:
    columns: SeriesColumns
    dropped_labels: int
    name_collisions: int
    work: ScanWork


def resolve_series(matchers: Sequence[LabelMatcher]) -> MetricBounds:
    """The stored metrics a read can need (see the module doc): the seam where the
    ``series`` table will name the stored series first."""
    for matcher in matchers:
        if matcher.name != NAME_LABEL or matcher.kind != "EQ" or not matcher.value:
            continue
        wanted = matcher.value
        if "_" not in wanted:
            return MetricBounds(exact=wanted)  # lm_escape only ever writes "_"
        prefix = wanted[: wanted.index("_")]
        if prefix and prefix.isascii():
            return MetricBounds(low=prefix, high=prefix[:-1] + chr(ord(prefix[-1]) + 1))
    return MetricBounds()


def _numpy(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return np.asarray(column.to_numpy(zero_copy_only=False))


def _codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    encoded = pc.dictionary_encode(column)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    return _numpy(encoded.indices).astype(np.int64), encoded.dictionary.to_pylist()


class _Rows:
    """The selected rows so far, five numpy columns per part, and one entry per stored
    series (its presented label set, None when the matchers do not select it) and per
    writer."""

    def __init__(self, matchers: Sequence[LabelMatcher], max_samples: int) -> None:
        self.matchers = matchers
        self.max_samples = max_samples
        self.series: list[str] = []
        self.sid: dict[str, int] = {}
        self.label_sets: list[LabelSet | None] = []
        self.writers: list[tuple[str, str]] = []
        self.writer_id: dict[tuple[str, str], int] = {}
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.count = 0
        self.dropped_labels = 0

    def _learn(
        self, rows: pa.Table, codes: np.ndarray, distinct: list[str], new: list[int]
    ) -> None:
        _, first = np.unique(codes, return_index=True)  # every code occurs
        picked = pa.array(first[new])
        names = escape_metric_array(rows.column("metric").take(picked))
        labels = rows.column("labels").take(picked)
        if isinstance(labels, pa.ChunkedArray):
            labels = labels.combine_chunks()
        presented, _ = presented_labels_array(labels)
        selected = select_label_sets(names, presented, self.matchers)
        if selected.any():
            _, dropped = presented_labels_array(labels.filter(pa.array(selected)))
            self.dropped_labels += dropped
        name_list = names.to_pylist()
        pairs_list = presented.to_pylist()
        for j, position in enumerate(new):
            key = distinct[position]
            self.sid[key] = len(self.series)
            self.series.append(key)
            if not selected[j]:
                self.label_sets.append(None)
                continue
            pairs = [(NAME_LABEL, name_list[j]), *pairs_list[j]]
            pairs.sort(key=lambda pair: pair[0].encode())
            self.label_sets.append(tuple(pairs))

    def add(self, rows: pa.Table) -> None:
        codes, distinct = _codes(rows.column("series"))
        new = [i for i, key in enumerate(distinct) if key not in self.sid]
        if new:
            self._learn(rows, codes, distinct, new)
        sids = np.fromiter((self.sid[key] for key in distinct), np.int64, len(distinct))
        chosen = np.fromiter((self.label_sets[s] is not None for s in sids), bool, len(distinct))
        keep = chosen[codes]
        kept = int(np.count_nonzero(keep))
        if kept == 0:
            return
        if self.count + kept > self.max_samples:
            raise TooManySamples(self.count + kept, self.max_samples)
        self.count += kept
        agent_codes, agents = _codes(rows.column("agent_id"))
        boot_codes, boots = _codes(rows.column("boot_id"))
        pair = agent_codes * max(1, len(boots)) + boot_codes
        pairs, inverse = np.unique(pair[keep], return_inverse=True)
        ids = np.empty(len(pairs), np.int64)
        for i, code in enumerate(pairs.tolist()):
            writer = (agents[code // max(1, len(boots))], boots[code % max(1, len(boots))])
            found = self.writer_id.get(writer)
            if found is None:
                found = self.writer_id[writer] = len(self.writers)
                self.writers.append(writer)
            ids[i] = found
        self.parts.append(
            (
                sids[codes][keep],
                int64_column(rows.column("ts"))[keep],
                _numpy(rows.column("value")).astype(np.float64, copy=False)[keep],
                ids[inverse.reshape(-1)],
                _numpy(rows.column("seq")).astype(np.int64, copy=False)[keep],
            )
        )

    def finish(self, work: ScanWork) -> Selection:
        if not self.parts:
            return Selection(SeriesColumns.empty(), self.dropped_labels, 0, work)
        sid, ts_us, value, writer, seq = (np.concatenate(c) for c in zip(*self.parts, strict=True))
        self.parts = []
        # Presented series in Prometheus' order; stored series and writers in byte order.
        distinct_sets = sorted({s for s in self.label_sets if s is not None}, key=label_order_key)
        rank_of_set = {label_set: i for i, label_set in enumerate(distinct_sets)}
        rank = np.array(
            [rank_of_set[s] if s is not None else -1 for s in self.label_sets], np.int64
        )
        lex = np.empty(len(self.series), np.int64)
        lex[sorted(range(len(self.series)), key=lambda i: self.series[i].encode())] = np.arange(
            len(self.series)
        )
        writer_rank = np.empty(len(self.writers), np.int64)
        writer_rank[
            sorted(
                range(len(self.writers)), key=lambda i: tuple(x.encode() for x in self.writers[i])
            )
        ] = np.arange(len(self.writers))
        ts_ms = np.floor_divide(ts_us, 1000)
        presented, stored = rank[sid], lex[sid]
        order = np.lexsort((seq, writer_rank[writer], ts_us, stored, ts_ms, presented))
        p, m, s = presented[order], ts_ms[order], stored[order]
        # Within one stored series at one millisecond: the last by (µs, agent, boot, seq).
        last = np.ones(len(order), bool)
        last[:-1] = (p[1:] != p[:-1]) | (m[1:] != m[:-1]) | (s[1:] != s[:-1])
        order, p, m = order[last], p[last], m[last]
        # Within one presented series at one millisecond: the smallest stored series.
        first = np.ones(len(order), bool)
        first[1:] = (p[1:] != p[:-1]) | (m[1:] != m[:-1])
        collisions = int(len(first) - np.count_nonzero(first))
        order, p, m = order[first], p[first], m[first]
        counts = np.bincount(p, minlength=len(distinct_sets))
        offsets = np.zeros(len(distinct_sets) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        columns = SeriesColumns(
            label_sets=distinct_sets,
            offsets=offsets,
            timestamps_ms=np.ascontiguousarray(m, dtype=np.int64),
            values=np.ascontiguousarray(value[order], dtype=np.float64),
        )
        return Selection(columns, self.dropped_labels, collisions, work)


def select_series(
    query: ReadQuery,
    snapshot: Snapshot | None,
    frames: Sequence[Frame],
    filesystem: pafs.FileSystem,
    root: str,
    *,
    max_samples: int,
    check: Callable[[], None] = lambda: None,
    work: ScanWork | None = None,
) -> Selection:
    """The samples of ``query`` (see the module doc). Blocking: run it on a thread.
    Raises `TooManySamples`, whatever ``check`` raises, and the store's read errors
    (``OSError``). ``work`` is filled as the read goes (also when it stops)."""
    work = work if work is not None else ScanWork()
    if query.empty:
        return Selection(SeriesColumns.empty(), 0, 0, work)
    rows = _Rows(query.matchers, max_samples)
    low_us, high_us = query.us_range
    bounds = resolve_series(query.matchers)
    for part in committed_parts(
        snapshot,
        filesystem,
        root,
        low_us=low_us,
        high_us=high_us,
        bounds=bounds,
        check=check,
        work=work,
    ):
        rows.add(part)
    for part in live_parts(
        frames, snapshot, low_us=low_us, high_us=high_us, bounds=bounds, check=check, work=work
    ):
        rows.add(part)
    check()
    return rows.finish(work)
