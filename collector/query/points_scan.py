r"""The ``points`` rows a remote read looks at, one unit of work at a time (PROTOCOL §5).

Two parts, as ``/v1/query`` merges them (`collector.query.endpoint`):

- `committed_parts`: the snapshot's ``points`` files its range and metric bounds can
  touch (`rollup.read.reader.plan_files`: the manifest's per-file statistics), each read
  one row group at a time, a row group skipped when its own ``ts``/``metric`` statistics
  rule it out; the rows the snapshot's tombstones mask are dropped as
  `rollup.read.reader.read_files` drops them (only tombstones a file's version has not
  applied, `rollup.table.tombstones.pending_on`);
- `live_parts`: the live window's batches the snapshot's ledger lacks (chosen by the
  caller, by ``manifest_id``), each frame filtered column-wise before its rows are built
  (`collector.query.rows.frame_rows`), every tombstone of the snapshot masking them.

With the stored series a read's matchers select (`collector.query.series_first.
StoredSeries`, resolved from the series index first), `committed_parts` also skips, in the
hours the index answers for, every file and row group whose ``series`` statistics hold
none of them (files are sorted by ``series``, then time: a single series is one or two
row groups of a file), and keeps only their rows; no wanted series: no ``points`` file
of those hours is opened. Other hours are read as before. Footers and row groups come
through the collector's `FileCache` when one is given (a repeated read opens no file
whose footer and row groups it holds).

Each yields `Part`\s: rows within ``[low_us, high_us)`` and the metric bounds (a file
with no tombstone pending is read without its label maps and with its string columns
dictionary-encoded, as Parquet stores them: a row group's maps are decoded only when a
reader meets a stored series it does not know yet, `Part.metric_and_labels`); before
each unit of work it calls ``check()``, which raises to stop the read (a client that
went away): a read stops within one row group or one frame. Blocking: run on a thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from protocol.frame import Frame
from rollup.read import reader
from rollup.table import tombstones as tombstones_mod
from rollup.table.columns import int64_column
from rollup.table.manifest import DataFile, Snapshot
from rollup.table.schemas import POINTS_SCHEMA

from .file_cache import CachedParquet, FileCache
from .group_stats import GroupStats, group_stats
from .rows import frame_rows
from .series_first import StoredSeries


@dataclass(frozen=True, slots=True)
class MetricBounds:
    """Stored metric names a read can need: ``exact`` (one name) or ``[low, high)``
    (a prefix range), or anything (all None)."""

    exact: str | None = None
    low: str | None = None
    high: str | None = None

    def predicates(self) -> list[reader.Predicate]:
        if self.exact is not None:
            return [reader.Predicate("metric", "=", self.exact)]
        found = []
        if self.low is not None:
            found.append(reader.Predicate("metric", ">=", self.low))
        if self.high is not None:
            found.append(reader.Predicate("metric", "<", self.high))
        return found

    def may_hold(self, low: Any, high: Any) -> bool:
        """Whether metric statistics ``[low, high]`` may hold a wanted name."""
        if not isinstance(low, str) or not isinstance(high, str):
            return True
        if self.exact is not None:
            return low <= self.exact <= high
        return (self.low is None or high >= self.low) and (self.high is None or low < self.high)

    def mask(self, metric: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
        """Rows whose metric is within the bounds (None: every row)."""
        if self.exact is not None:
            return _numpy(pc.equal(metric, pa.scalar(self.exact, pa.string())))
        keep = None
        if self.low is not None:
            keep = _numpy(pc.greater_equal(metric, pa.scalar(self.low, pa.string())))
        if self.high is not None:
            below = _numpy(pc.less(metric, pa.scalar(self.high, pa.string())))
            keep = below if keep is None else keep & below
        return keep


def _numpy(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(mask, pa.ChunkedArray):
        mask = mask.combine_chunks() if mask.num_chunks else pa.array([], pa.bool_())
    return np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=bool)


@dataclass(slots=True)
class ScanWork:
    """Units of work done (a test counts them after a client went away)."""

    files: int = 0
    files_skipped: int = 0  # by the stored series' statistics, never opened
    index_files: int = 0  # series/series_day files read to resolve the matchers
    row_groups_read: int = 0
    row_groups_skipped: int = 0
    frames: int = 0
    rows_masked: int = 0
    label_maps_read: int = 0  # row groups whose label maps were decoded
    paths: list[str] = field(default_factory=list)


def _row_group_may_match(
    stats: GroupStats,
    low_us: int,
    high_us: int,
    bounds: MetricBounds,
    stored: StoredSeries | None,
) -> bool:
    ts, metric, series = stats
    if ts is not None and (ts[1] < low_us or ts[0] >= high_us):
        return False
    if metric is not None and not bounds.may_hold(*metric):
        return False
    return series is None or stored is None or stored.may_hold(*series)


@dataclass(frozen=True, slots=True)
class Part:
    """Rows of one unit of work: ``ts``, ``metric``, ``value``, ``series``, ``agent_id``,
    ``boot_id``, ``seq`` (string columns may be dictionary-encoded, as Parquet stores
    them) and ``labels`` when it was read; else `labels_of` reads the ``metric`` and
    ``labels`` of some rows (by row number) on demand: a reader that already knows a
    series never decodes its label maps."""

    rows: pa.Table
    labels_of: Callable[[np.ndarray], pa.Table] | None = None
    ts_us: np.ndarray | None = None
    """The ``ts`` column as numpy int64 µs, when the reader already made it."""

    def metric_and_labels(self, rows: np.ndarray) -> pa.Table:
        if self.labels_of is not None:
            return self.labels_of(rows)
        return self.rows.select(["metric", "labels"]).take(pa.array(rows))


_METRIC_AND_LABELS = pa.schema([POINTS_SCHEMA.field("metric"), POINTS_SCHEMA.field("labels")])
SLIM_COLUMNS = ["ts", "metric", "value", "series", "agent_id", "boot_id", "seq"]
DICTIONARY_COLUMNS = ["metric", "series", "agent_id", "boot_id"]


def _string_mask(column: pa.ChunkedArray | pa.Array, bounds: MetricBounds) -> np.ndarray | None:
    """`MetricBounds.mask` over a plain or dictionary-encoded string column (a
    dictionary's values are compared once each)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], pa.string())
    if pa.types.is_dictionary(column.type):
        found = bounds.mask(column.dictionary)
        if found is None:
            return None
        indices = np.asarray(column.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        result: np.ndarray = found[indices]
        return result
    return bounds.mask(column)


def _selected(
    rows: pa.Table, bounds: MetricBounds, stored: StoredSeries | None
) -> np.ndarray | None:
    """Rows of the wanted metrics and stored series, whatever their time (None: all)."""
    keep = _string_mask(rows.column("metric"), bounds)
    if stored is not None:
        wanted = stored.mask(rows.column("series"))
        keep = wanted if keep is None else keep & wanted
    return keep


def _keep(
    rows: pa.Table, low_us: int, high_us: int, bounds: MetricBounds, stored: StoredSeries | None
) -> np.ndarray:
    ts = int64_column(rows.column("ts"))
    keep = (ts >= low_us) & (ts < high_us)
    selected = _selected(rows, bounds, stored)
    return keep if selected is None else keep & selected


def _labels_reader(
    parquet: CachedParquet, index: int, positions: np.ndarray, work: ScanWork
) -> Callable[[np.ndarray], pa.Table]:
    def read(rows: np.ndarray) -> pa.Table:
        work.label_maps_read += 1
        found = parquet.read_row_group(index, columns=["metric", "labels"])
        found = found.select(["metric", "labels"]).cast(_METRIC_AND_LABELS)
        return found.take(pa.array(positions[rows]))

    return read


def _file_may_hold(data_file: DataFile, stored: StoredSeries) -> bool:
    return stored.may_hold(data_file.min.get("series"), data_file.max.get("series"))


READ_AHEAD = 8
"""Files a remote store's read fetches at once (`committed_parts` ``read_ahead``)."""


def read_ahead_for(filesystem: pafs.FileSystem) -> int:
    """`READ_AHEAD` for a remote store (S3: each file is a few requests' round trips),
    1 on the local filesystem (reading is decoding there: nothing to overlap)."""
    return 1 if filesystem.type_name == "local" else READ_AHEAD


def committed_parts(
    snapshot: Snapshot | None,
    filesystem: pafs.FileSystem,
    root: str,
    *,
    low_us: int,
    high_us: int,
    bounds: MetricBounds,
    check: Callable[[], None],
    work: ScanWork,
    stored: StoredSeries | None = None,
    cache: FileCache | None = None,
    read_ahead: int | None = None,
) -> Iterator[Part]:
    """The snapshot's ``points`` rows in ``[low_us, high_us)`` within ``bounds`` (and of
    the ``stored`` series, in the hours it covers), one row group at a time, tombstones
    masking (see the module doc). A file no tombstone is pending on is read without its
    label maps, string columns dictionary-encoded. ``read_ahead`` (default
    `read_ahead_for` the filesystem) > 1: up to that many
    files are read at once on threads (``check`` is called there too), their parts
    still yielded in file order; the read stops as soon as one fails or the caller stops
    (files not started are not read, at most ``read_ahead`` finish)."""
    if snapshot is None:
        return
    start = datetime.fromtimestamp(low_us // 1_000_000, tz=UTC)
    end = datetime.fromtimestamp(-(-high_us // 1_000_000), tz=UTC)
    files: Sequence[DataFile] = reader.plan_files(
        snapshot, "points", where=bounds.predicates(), start=start, end=end
    )
    masking = tombstones_mod.for_table(snapshot.tombstones, "points")
    cache = cache if cache is not None else FileCache(0)
    plan = []
    for data_file in files:
        wanted = stored if stored is not None and stored.covers(data_file) else None
        if wanted is not None and not _file_may_hold(data_file, wanted):
            work.files_skipped += 1
            continue
        plan.append((data_file, wanted, tombstones_mod.pending_on(masking, data_file)))

    scan = _FileScan(filesystem, root, cache, low_us, high_us, bounds, check, work)
    read_ahead = read_ahead if read_ahead is not None else read_ahead_for(filesystem)
    if read_ahead <= 1 or len(plan) <= 1:
        for data_file, wanted, pending in plan:
            check()
            work.files += 1
            work.paths.append(data_file.path)
            with scan.open(data_file, pending) as parquet:
                yield from scan.parts(parquet, wanted, pending, work)
        return
    # Each file stays open until its parts are consumed (a part's label maps are read
    # then: no second open, so no second request on S3).
    with ThreadPoolExecutor(read_ahead, thread_name_prefix="points-read") as pool:
        ahead: deque[tuple[DataFile, ScanWork, Future[tuple[CachedParquet, list[Part]]]]]
        ahead = deque()
        try:
            for item in plan:
                counts = ScanWork()
                ahead.append((item[0], counts, pool.submit(scan.fetch, *item, counts)))
                while len(ahead) >= read_ahead or (ahead and item is plan[-1]):
                    data_file, counts, future = ahead.popleft()
                    check()
                    parquet, parts = future.result()
                    with parquet:
                        work.files += 1
                        work.paths.append(data_file.path)
                        _add_counts(work, counts)
                        yield from parts
        finally:
            for _file, _counts, future in ahead:
                future.cancel()
            pool.shutdown(wait=True)  # the files being read finish, then are closed
            for _file, _counts, future in ahead:
                if not future.cancelled() and future.exception() is None:
                    future.result()[0].close()


def _add_counts(work: ScanWork, counts: ScanWork) -> None:
    work.row_groups_read += counts.row_groups_read
    work.row_groups_skipped += counts.row_groups_skipped
    work.rows_masked += counts.rows_masked


@dataclass(frozen=True, slots=True)
class _FileScan:
    """What reading one ``points`` file of a `committed_parts` read needs."""

    filesystem: pafs.FileSystem
    root: str
    cache: FileCache
    low_us: int
    high_us: int
    bounds: MetricBounds
    check: Callable[[], None]
    work: ScanWork
    """Where label maps read later are counted."""

    def open(self, data_file: DataFile, pending: Any) -> CachedParquet:
        dictionary = None if pending else DICTIONARY_COLUMNS
        return self.cache.parquet(self.filesystem, self.root, data_file, read_dictionary=dictionary)

    def fetch(
        self, data_file: DataFile, wanted: StoredSeries | None, pending: Any, counts: ScanWork
    ) -> tuple[CachedParquet, list[Part]]:
        """A file's parts read at once (on a reader thread), the file left open."""
        parquet = self.open(data_file, pending)
        try:
            return parquet, list(self.parts(parquet, wanted, pending, counts))
        except BaseException:
            parquet.close()
            raise

    def parts(
        self, parquet: CachedParquet, wanted: StoredSeries | None, pending: Any, counts: ScanWork
    ) -> Iterator[Part]:
        """The file's parts; row groups counted into ``counts``."""
        low_us, high_us, bounds = self.low_us, self.high_us, self.bounds
        stats_of = parquet.memo.get("group_stats")
        if stats_of is None:  # parsed once per cached footer
            stats_of = parquet.memo["group_stats"] = group_stats(parquet.metadata)
        for index, stats in enumerate(stats_of):
            if not _row_group_may_match(stats, low_us, high_us, bounds, wanted):
                counts.row_groups_skipped += 1
                continue
            self.check()
            counts.row_groups_read += 1
            if pending:
                rows = parquet.read_row_group(index, columns=POINTS_SCHEMA.names)
                rows = rows.select(POINTS_SCHEMA.names).cast(POINTS_SCHEMA)
                rows = rows.filter(pa.array(_keep(rows, low_us, high_us, bounds, wanted)))
                rows, masked = tombstones_mod.drop_masked(pending, "points", rows)
                counts.rows_masked += masked
                if rows.num_rows:
                    yield Part(rows)
                continue
            selection = (bounds, wanted.wanted if wanted is not None else None)
            rows, positions = parquet.read_selected(
                index, SLIM_COLUMNS, selection, partial(_selected, bounds=bounds, stored=wanted)
            )
            rows = rows.select(SLIM_COLUMNS)
            ts = int64_column(rows.column("ts"))
            in_range = np.flatnonzero((ts >= low_us) & (ts < high_us))
            if len(in_range) == 0:
                continue
            if len(in_range) < rows.num_rows:
                rows, ts = rows.take(pa.array(in_range)), ts[in_range]
                positions = in_range if positions is None else positions[in_range]
            elif positions is None:
                positions = np.arange(rows.num_rows)
            yield Part(rows, _labels_reader(parquet, index, positions, self.work), ts)


def live_parts(
    frames: Sequence[Frame],
    snapshot: Snapshot | None,
    *,
    low_us: int,
    high_us: int,
    bounds: MetricBounds,
    check: Callable[[], None],
    work: ScanWork,
) -> Iterator[Part]:
    """The ``points`` rows of ``frames`` (the live part) in ``[low_us, high_us)`` within
    ``bounds``, every tombstone of ``snapshot`` masking them, one frame at a time."""
    masking = tombstones_mod.for_table(snapshot.tombstones, "points") if snapshot else ()
    for frame in frames:
        check()
        work.frames += 1
        points = frame.points
        ts_us = int64_column(points.column("ts")) // 1000  # ns → µs, floored (as the tables)
        keep = (ts_us >= low_us) & (ts_us < high_us)
        metric = bounds.mask(points.column("metric"))
        if metric is not None:
            keep &= metric
        indices = np.flatnonzero(keep)
        if len(indices) == 0:
            continue
        rows, masked = tombstones_mod.drop_masked(masking, "points", frame_rows(frame, indices))
        work.rows_masked += masked
        if rows.num_rows:
            yield Part(rows)
