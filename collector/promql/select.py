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
id, µs, value, writer id, seq); in the common case they are ordered without a sort
(`select_order.ordered_runs`: files hold runs of a series in time order), else one
``lexsort`` orders them and two neighbour comparisons keep the winners. Python runs once per stored series and per writer
(agent, boot), never per sample. Values are the stored float64, bit for bit.

More than ``max_samples`` rows selected raises `TooManySamples` as soon as it is
known (the rows counted before ties at one millisecond are merged, so a read is never
cut short, and at most ``max_samples`` rows are ever held). ``check`` is called before
each unit of work (a row group, a frame) and raises to stop the read.

Matchers are resolved against the ``series`` index first (PROTOCOL §5 "Matchers",
`collector.query.series_first`): the committed part then opens only the ``points``
files and row groups whose ``series`` statistics hold a selected stored series, in the
hours the index answers for (other hours, e.g. committed before the index existed, are
read as before). `resolve_series` adds bounds on the stored metric from an equality on
``__name__`` (exact, or the prefix before the first ``_``, which ``lm_escape`` never
changes), pushed down to the manifest's file statistics and each row group's: it also
narrows those other hours and the live part's frames. Files and footers come through the
collector's `FileCache` (``query.cache_bytes``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from collector.query.file_cache import FileCache
from collector.query.points_scan import MetricBounds, Part, ScanWork, committed_parts, live_parts
from collector.query.series_first import resolve_stored_series
from protocol.frame import Frame
from protocol.prom_names import (
    NAME_LABEL,
    escape_metric_array,
    present_labels,
    presented_labels_array,
)
from rollup.table.columns import int64_column
from rollup.table.manifest import Snapshot

from .matchers import LabelMatcher, select_label_sets
from .select_order import merged_order, ordered_runs, ranks
from .series_columns import LabelSet, SeriesColumns


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
    """Bounds on the stored metrics a read can need (see the module doc)."""
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


def _dictionary(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Per row a code, and the distinct values: a dictionary column's own, else one made."""
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 1:
            column = column.chunk(0)
        elif pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type).combine_chunks()
        else:
            column = column.combine_chunks()
    encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
    return _numpy(encoded.indices).astype(np.int64), encoded.dictionary


def _joined(pieces: list[np.ndarray]) -> np.ndarray:
    """The pieces concatenated, each let go of as soon as it is copied (one column's
    pieces at a time: never the whole selection twice)."""
    joined = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    pieces.clear()
    return joined


PresentedSeries = tuple[LabelSet, int]
"""A stored series as presented: its label set and how many stored labels it dropped."""
MAP_TYPE = pa.map_(pa.string(), pa.string())


class SeriesCache:
    """Presented label sets of stored series, shared by reads (a stored series string
    always presents the same way), the least recently used dropped past ``max_series``.
    Thread-safe: selections run on worker threads."""

    def __init__(self, max_series: int = 100_000) -> None:
        self._max = max_series
        self._known: OrderedDict[str, PresentedSeries] = OrderedDict()
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[str]) -> list[PresentedSeries | None]:
        with self._lock:
            found = [self._known.get(key) for key in keys]
            for key, value in zip(keys, found, strict=True):
                if value is not None:
                    self._known.move_to_end(key)
            return found

    def put_many(self, items: Sequence[tuple[str, PresentedSeries]]) -> None:
        with self._lock:
            for key, value in items:
                self._known[key] = value
            while len(self._known) > self._max:
                self._known.popitem(last=False)

    def __len__(self) -> int:
        return len(self._known)


def _present(part: Part, rows: np.ndarray) -> list[PresentedSeries]:
    """The presented label sets of the stored series at ``rows`` of ``part``."""
    table = part.metric_and_labels(rows)
    metric = table.column("metric")
    labels = table.column("labels").combine_chunks()
    names = escape_metric_array(metric).to_pylist()
    presented, dropped_total = presented_labels_array(labels)
    pairs_list = presented.to_pylist()
    dropped = [0] * len(names)
    if dropped_total:  # rare: count per series with the reference, per series
        metrics, maps = metric.to_pylist(), labels.to_pylist()
        dropped = [
            present_labels(m, dict(pairs or []))[1] for m, pairs in zip(metrics, maps, strict=True)
        ]
    out = []
    for name, pairs, lost in zip(names, pairs_list, dropped, strict=True):
        label_set = [(NAME_LABEL, name), *pairs]
        label_set.sort(key=lambda pair: pair[0].encode())
        out.append((tuple(label_set), lost))
    return out


class _Rows:
    """The selected rows so far, five numpy columns per part, and one entry per stored
    series (its presented label set, None when the matchers do not select it) and per
    writer."""

    def __init__(
        self, matchers: Sequence[LabelMatcher], max_samples: int, cache: SeriesCache
    ) -> None:
        self.matchers = matchers
        self.max_samples = max_samples
        self.cache = cache
        self.series: list[str] = []
        self.sid: dict[str, int] = {}
        self.label_sets: list[LabelSet | None] = []
        self.writers: list[tuple[str, str]] = []
        self.writer_id: dict[tuple[str, str], int] = {}
        self.parts: list[list[np.ndarray]] = [[], [], [], [], []]  # sid, µs, value, writer, seq
        self.count = 0
        self.dropped_labels = 0

    def _learn(self, part: Part, codes: np.ndarray, used: np.ndarray, keys: list[str]) -> None:
        """Learn the stored series ``keys`` (codes ``used``) this reader meets first."""
        known = self.cache.get_many(keys)
        missing = [j for j, found in enumerate(known) if found is None]
        if missing:
            first = np.zeros(int(codes.max()) + 1, np.int64)  # codes: every row's, not only new
            first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)  # each code's first row
            made = _present(part, first[used[missing]])
            self.cache.put_many([(keys[j], m) for j, m in zip(missing, made, strict=True)])
            for j, m in zip(missing, made, strict=True):
                known[j] = m
        sets = [found[0] for found in known if found is not None]
        names = pa.array([dict(s)[NAME_LABEL] for s in sets], pa.string())
        labels = pa.array([[p for p in s if p[0] != NAME_LABEL] for s in sets], MAP_TYPE)
        selected = select_label_sets(names, labels, self.matchers)
        for j, key in enumerate(keys):
            self.sid[key] = len(self.series)
            self.series.append(key)
            if selected[j]:
                self.label_sets.append(sets[j])
                self.dropped_labels += known[j][1]  # type: ignore[index]
            else:
                self.label_sets.append(None)

    def add(self, part: Part) -> None:
        rows = part.rows
        codes, dictionary = _dictionary(rows.column("series"))
        # A dictionary read from Parquet may hold values no row uses (other row groups'
        # series): only the used ones are looked at, in Python once each.
        used = np.flatnonzero(np.bincount(codes, minlength=len(dictionary)))
        keys = dictionary.take(pa.array(used)).to_pylist()
        new = [j for j, key in enumerate(keys) if key not in self.sid]
        if new:
            self._learn(part, codes, used[new], [keys[j] for j in new])
        sids = np.full(len(dictionary), -1, np.int64)
        sids[used] = np.fromiter((self.sid[key] for key in keys), np.int64, len(keys))
        chosen = np.zeros(len(dictionary), bool)
        chosen[used] = [self.label_sets[s] is not None for s in sids[used].tolist()]
        keep = chosen[codes]
        kept = int(np.count_nonzero(keep))
        if kept == 0:
            return
        if self.count + kept > self.max_samples:
            raise TooManySamples(self.count + kept, self.max_samples)
        self.count += kept
        agent_codes, agent_values = _dictionary(rows.column("agent_id"))
        boot_codes, boot_values = _dictionary(rows.column("boot_id"))
        agents, boots = agent_values.to_pylist(), boot_values.to_pylist()
        width = max(1, len(boots))
        combined = (agent_codes * width + boot_codes)[keep]
        one = combined.min() == combined.max()  # one writer: the common case, no sort
        pairs, inverse = (
            (combined[:1], np.zeros(len(combined), np.int64))
            if one
            else np.unique(combined, return_inverse=True)
        )
        ids = np.empty(len(pairs), np.int64)
        for i, code in enumerate(pairs.tolist()):
            writer = (agents[code // width], boots[code % width])
            found = self.writer_id.get(writer)
            if found is None:
                found = self.writer_id[writer] = len(self.writers)
                self.writers.append(writer)
            ids[i] = found
        columns = [
            sids[codes],
            part.ts_us if part.ts_us is not None else int64_column(rows.column("ts")),
            _numpy(rows.column("value")).astype(np.float64, copy=False),
            _numpy(rows.column("seq")).astype(np.int64, copy=False),
        ]
        if kept < len(keep):
            columns = [column[keep] for column in columns]
        sid, ts, value, seq = columns
        for column, found in zip(
            self.parts, (sid, ts, value, ids[inverse.reshape(-1)], seq), strict=True
        ):
            column.append(found)

    def finish(self, work: ScanWork) -> Selection:
        if not self.parts[0]:
            return Selection(SeriesColumns.empty(), self.dropped_labels, 0, work)
        sid, ts_us, value = (_joined(column) for column in self.parts[:3])
        writers, seqs = self.parts[3:]  # joined only if samples must be merged
        distinct_sets, rank, lex, writer_rank = ranks(self.label_sets, self.series, self.writers)
        ts_ms = np.floor_divide(ts_us, 1000)
        runs = ordered_runs(sid, ts_us, ts_ms, rank, len(distinct_sets))
        if runs is not None:  # the common case: nothing to merge, nothing sorted
            writers.clear()
            seqs.clear()
            if runs.order is not None:
                ts_ms, value = ts_ms[runs.order], value[runs.order]
            return self._selection(distinct_sets, runs.counts, ts_ms, value, 0, work)
        order, counts, collisions = merged_order(
            rank[sid],
            ts_us,
            ts_ms,
            lambda: lex[sid],
            lambda: (writer_rank[_joined(writers)], _joined(seqs)),
            len(distinct_sets),
        )
        ts_ms, value = ts_ms[order], value[order]
        return self._selection(distinct_sets, counts, ts_ms, value, collisions, work)

    def _selection(
        self,
        label_sets: list[LabelSet],
        counts: np.ndarray,
        ts_ms: np.ndarray,
        values: np.ndarray,
        collisions: int,
        work: ScanWork,
    ) -> Selection:
        offsets = np.zeros(len(label_sets) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        columns = SeriesColumns(
            label_sets=label_sets,
            offsets=offsets,
            timestamps_ms=np.ascontiguousarray(ts_ms, dtype=np.int64),
            values=np.ascontiguousarray(values, dtype=np.float64),
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
    cache: SeriesCache | None = None,
    file_cache: FileCache | None = None,
) -> Selection:
    """The samples of ``query`` (see the module doc). Blocking: run it on a thread.
    Raises `TooManySamples`, whatever ``check`` raises, and the store's read errors
    (``OSError``). ``work`` is filled as the read goes (also when it stops)."""
    work = work if work is not None else ScanWork()
    if query.empty:
        return Selection(SeriesColumns.empty(), 0, 0, work)
    rows = _Rows(query.matchers, max_samples, cache if cache is not None else SeriesCache())
    low_us, high_us = query.us_range
    bounds = resolve_series(query.matchers)
    file_cache = file_cache if file_cache is not None else FileCache(0)
    stored = resolve_stored_series(
        snapshot,
        filesystem,
        root,
        low_us=low_us,
        high_us=high_us,
        matchers=query.matchers,
        cache=file_cache,
        check=check,
    )
    work.index_files = stored.index_files if stored is not None else 0
    for part in committed_parts(
        snapshot,
        filesystem,
        root,
        low_us=low_us,
        high_us=high_us,
        bounds=bounds,
        check=check,
        work=work,
        stored=stored,
        cache=file_cache,
    ):
        rows.add(part)
    for part in live_parts(
        frames, snapshot, low_us=low_us, high_us=high_us, bounds=bounds, check=check, work=work
    ):
        rows.add(part)
    check()
    return rows.finish(work)
