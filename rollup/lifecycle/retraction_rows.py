"""The table side of a retraction (PROTOCOL §3.7 "Retraction"): one identity's points out of
``points``, and the ``rollup_1m`` cells they fed recomputed. Blocking pyarrow I/O, no
Spark: retractions are operator actions, a few batches at a time.

`remove_identity` works on the ``points`` hours it is given (the batch's point range from
its ledger row or its frame; every hour when neither is known) and, within them, only on
files whose statistics can hold the identity (agent, boot, seq range). A file holding
some of its points is rewritten without them, through the reader, so the snapshot's
deletes are applied as compaction applies them (`rollup.lifecycle.compaction`); the
other files stay. For each hour that lost points, the ``rollup_1m`` rows of the
(minute, series) cells those points fed are recomputed from the hour's remaining points
(masked as ``rollup_1m``'s deletes say, `rollup.table.tombstones.drop_from_rollup`); the
hour's other rows are kept as they are; its files are replaced by one. The hour's
``series`` rows are recomputed from its points left, and a written day's ``series_day``
rewritten from them (`rollup.lifecycle.series_files.recompute_hours`).

A cell is exact when ``points`` still holds every sample ``rollup_1m`` aggregated there;
where a delete of ``points`` only (by agent) or a shorter ``points`` retention removed
some, the recomputed cell lacks them too (noted in `IdentityRemoval.cells_recomputed`).
An hour whose ``points`` were dropped by retention has nothing to remove; its
``rollup_1m`` rows, if kept, cannot be recomputed and are left (``hours_unrecomputed``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from protocol import keys
from rollup.lifecycle import series_files
from rollup.read import reader
from rollup.table import aggregate, schemas
from rollup.table.data_file import DataFile, describe_file
from rollup.table.manifest import Snapshot
from rollup.table.storage import StoreAccess, open_parquet_writer
from rollup.table.tombstones import drop_from_rollup


@dataclass(frozen=True, slots=True)
class Identity:
    """The points of one batch: ``agent_id``, ``boot_id`` and ``seq`` in ``[seq_start,
    seq_end]`` (`rollup.table.points`: a point's seq is its batch's seq_start + row)."""

    agent_id: str
    boot_id: str
    seq_start: int
    seq_end: int

    @classmethod
    def of_manifest_id(cls, manifest_id: str) -> Identity:
        identity = keys.parse_manifest_id(manifest_id).identity
        assert identity is not None  # a manifest_id always spells the agent in hex
        return cls(identity.agent_id, str(identity.boot_id), identity.seq_start, identity.seq_end)

    def rows(self, points: pa.Table) -> pa.ChunkedArray:
        """True for the rows of ``points`` that are this identity's."""
        hit = pc.and_(
            pc.equal(points.column("agent_id"), self.agent_id),
            pc.equal(points.column("boot_id"), self.boot_id),
        )
        hit = pc.and_(hit, pc.greater_equal(points.column("seq"), self.seq_start))
        return pc.fill_null(pc.and_(hit, pc.less_equal(points.column("seq"), self.seq_end)), False)

    def may_be_in(self, data_file: DataFile) -> bool:
        """Whether the file's statistics allow rows of this identity (none: they may)."""
        for column, value in (
            ("agent_id", self.agent_id),
            ("boot_id", self.boot_id),
        ):
            low, high = data_file.min.get(column), data_file.max.get(column)
            if low is not None and high is not None and not low <= value <= high:
                return False
        low, high = data_file.min.get("seq"), data_file.max.get("seq")
        return not (
            low is not None and high is not None and (high < self.seq_start or low > self.seq_end)
        )


@dataclass(slots=True)
class IdentityRemoval:
    """What removing identities did: files to add and remove, counts."""

    added: list[DataFile] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    points_removed: int = 0
    cells_recomputed: int = 0
    hours_unrecomputed: list[str] = field(default_factory=list)


def remove_identities(
    snapshot: Snapshot,
    removals: Sequence[tuple[Identity, set[keys.UtcHour] | None]],
    *,
    access: StoreAccess,
    version: int,
    compression: str,
) -> IdentityRemoval:
    """Remove each identity's points from the ``points`` hours given (None: every hour),
    and recompute the ``rollup_1m`` cells they fed (module doc). Blocking."""
    result = IdentityRemoval()
    filesystem, root = access.filesystem()
    removed_by_hour: dict[keys.UtcHour, list[pa.Table]] = {}
    for data_file in snapshot.data_files("points"):
        wanted = [
            identity
            for identity, hours in removals
            if (hours is None or data_file.partition in hours) and identity.may_be_in(data_file)
        ]
        if not wanted:
            continue
        rows = reader.read_files(
            [data_file], "points", filesystem, root, tombstones=snapshot.tombstones
        )
        hit = wanted[0].rows(rows)
        for identity in wanted[1:]:
            hit = pc.or_(hit, identity.rows(rows))
        count = int(pc.sum(hit).as_py() or 0)
        if not count:
            continue
        result.points_removed += count
        removed_by_hour.setdefault(data_file.partition, []).append(rows.filter(hit))
        result.removed.append(data_file.path)
        kept = rows.filter(pc.invert(hit))
        if kept.num_rows:
            result.added.append(
                _write(access, "points", data_file.partition, kept, version, compression)
            )
    with_points = {f.partition for f in snapshot.data_files("points")}
    with_rollup = {f.partition for f in snapshot.data_files("rollup_1m")}
    for _identity, hours in removals:
        for hour in sorted((hours or set()) & (with_rollup - with_points)):
            result.hours_unrecomputed.append(hour.iso)  # points gone: cells left as they are
    for hour, parts in sorted(removed_by_hour.items()):
        _recompute_rollup(
            snapshot, hour, pa.concat_tables(parts), result, access, version, compression
        )
    if removed_by_hour:  # the series index follows the points (PROTOCOL §4)
        index = series_files.recompute_hours(
            snapshot,
            removed_by_hour,
            added=result.added,
            removed=result.removed,
            access=access,
            version=version,
            compression=compression,
        )
        result.added += index.added
        result.removed += index.removed
    return result


def _recompute_rollup(
    snapshot: Snapshot,
    hour: keys.UtcHour,
    gone: pa.Table,
    result: IdentityRemoval,
    access: StoreAccess,
    version: int,
    compression: str,
) -> None:
    """Replace ``hour``'s ``rollup_1m`` files: the cells ``gone`` fed, recomputed from the
    hour's points left after this removal; every other row kept."""
    files = [f for f in snapshot.data_files("rollup_1m") if f.partition == hour]
    if not files:
        return  # retention dropped the hour from rollup_1m, or it held none of these points
    filesystem, root = access.filesystem()
    tombstones = snapshot.tombstones
    committed = reader.read_files(files, "rollup_1m", filesystem, root, tombstones=tombstones)
    touched = _cells(pc.floor_temporal(gone.column("ts"), unit="minute"), gone.column("series"))
    cell = _cells(committed.column("window_start"), committed.column("series"))
    keep = pc.invert(pc.is_in(cell, value_set=touched))
    series = pc.unique(gone.column("series"))
    removed = set(result.removed)
    sources = [
        f for f in snapshot.data_files("points") if f.partition == hour and f.path not in removed
    ]
    sources += [f for f in result.added if f.table == "points" and f.partition == hour]
    left = _read_points(sources, snapshot, access, series)
    left = drop_from_rollup(tombstones, left)
    partials = aggregate.partials_of_points(left)
    if partials.num_rows:
        windows = pc.cast(partials.column("window_us"), pa.int64()).cast(schemas.TS_TYPE)
        partials = partials.filter(pc.is_in(_cells(windows, partials.column("series")), touched))
    info = aggregate.series_info(committed.filter(pc.is_in(committed.column("series"), series)))
    rows = aggregate.rollup_rows(aggregate.merge_partials(partials), info)
    result.cells_recomputed += rows.num_rows
    merged = pa.concat_tables([committed.filter(keep).cast(schemas.ROLLUP_1M_SCHEMA), rows])
    merged = merged.take(
        pc.sort_indices(merged, [("series", "ascending"), ("window_start", "ascending")])
    )
    result.removed += [f.path for f in files]
    if merged.num_rows:
        result.added.append(_write(access, "rollup_1m", hour, merged, version, compression))


def _read_points(
    files: Sequence[DataFile], snapshot: Snapshot, access: StoreAccess, series: pa.Array
) -> pa.Table:
    """The rows of ``series`` in ``files`` (masked by the snapshot's deletes of points:
    what a reader sees)."""
    if not files:
        return schemas.POINTS_SCHEMA.empty_table()
    filesystem, root = access.filesystem()
    parts = []
    for data_file in files:
        rows = reader.read_files(
            [data_file], "points", filesystem, root, tombstones=snapshot.tombstones
        )
        parts.append(rows.filter(pc.is_in(rows.column("series"), value_set=series)))
    return pa.concat_tables(parts)


def _cells(windows: pa.ChunkedArray | pa.Array, series: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One string per (minute, series): ``<µs>|<series>``."""
    micros = pc.cast(pc.cast(windows, schemas.TS_TYPE), pa.int64())
    text = pc.cast(micros, pa.string())
    joined = pc.binary_join_element_wise(text, series, "|")
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


def _write(
    access: StoreAccess,
    table: str,
    hour: keys.UtcHour,
    rows: pa.Table,
    version: int,
    compression: str,
) -> DataFile:
    path = keys.rollup_data_key(table, hour, str(uuid.uuid4()))
    rows = rows.cast(schemas.table_schema(table))
    writer, stream = open_parquet_writer(
        access, path, schemas.table_schema(table), compression=compression
    )
    try:  # points: small row groups, for single-series reads (PROTOCOL §5)
        writer.write_table(
            rows, row_group_size=schemas.POINTS_ROW_GROUP_ROWS if table == "points" else None
        )
    finally:
        writer.close()
    size = int(stream.tell())
    stream.close()
    return describe_file(table, path, hour, rows, size_bytes=size, added_version=version)


def hours_between(min_ts_us: int, max_ts_us: int) -> set[keys.UtcHour]:
    """The UTC hours from ``min_ts_us`` to ``max_ts_us`` (µs since the epoch)."""
    first, last = (int(v) // 3_600_000_000 for v in (min_ts_us, max_ts_us))
    return {keys.UtcHour.from_unix_ns(h * 3600 * keys.NS_PER_S) for h in range(first, last + 1)}
