"""``lm-rollup compact``: rewrite an hour's small files into few large ones, deletes applied.

For each chosen (table, hour) of the latest snapshot, `compact` reads the hour's files
one at a time through the reader (so rows that the snapshot's tombstones mask are left
out), streams them into new files of about ``target_bytes`` (judged from the input's
bytes per row), and commits all of it in one pointer CAS: the new files added, the old
ones removed (PROTOCOL §4.1). Readers of older snapshots keep working until vacuum.

Which hours (no ``hours`` given): those where a table has at least ``min_files`` files,
or a file with rows that a delete still masks (`rollup.table.tombstones.pending_on`): the
snapshot alone tells, no listing.

Like ``delete``, compaction commits without the owner lease (`rollup.table.commit.commit`):
a rollup run in flight loses its CAS and re-plans on the compacted snapshot, and if the
run commits first, compaction deletes what it wrote and plans again on the new
snapshot, at most `MAX_ATTEMPTS` times (repeating is safe: nothing of a lost attempt is
reachable, and each attempt reads only the snapshot it commits on).

The ledger: without ``tables``, the same commit merges the ledger files of every accepted
hour that has at least ``min_files`` of them (or of the ``hours`` given) into one
(`rollup.table.ledger_merge`: the same rows, their totals checked against ``ledger.hours``), so
``ledger.files`` stays at about one file per hour however many runs wrote it.

The series index: an hour of ``series`` or a day of ``series_day`` is rewritten as one
file with one row per series (counts added, first/last widened). A ``points`` hour whose
rewrite applies a delete, or that has no ``series`` rows (written before the index
existed: the backfill), has its ``series`` rows recomputed from the new files in the
same commit, and its day's ``series_day`` rewritten if the day is written
(`rollup.lifecycle.series_files.recompute_hours`).

Counts: total rows after = rows before - rows masked (`CompactionReport`); no batch is
added to or removed from the ledger. Cost per hour rewritten: one GET per input
file, one multipart/PUT per output file; plus 2 GETs and 2 PUTs for the commit.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import structlog

from config.settings import RollupSettings
from protocol import keys
from protocol.clock import Clock
from rollup.lifecycle import series_files
from rollup.read import reader
from rollup.table import ledger_merge, schemas, series_rows
from rollup.table.commit import (
    CommitConflict,
    LoadedSnapshot,
    commit,
    delete_uncommitted,
    load_latest,
)
from rollup.table.manifest import Changes, DataFile, Snapshot
from rollup.table.storage import StoreAccess, open_parquet_writer
from rollup.table.tombstones import pending_on
from store.base import ObjectStore
from store.errors import StoreError
from store.retry import Backoff

log = structlog.get_logger(__name__)

MAX_ATTEMPTS = 4
_BACKOFF = Backoff(attempts=MAX_ATTEMPTS, base_s=0.1, cap_s=2.0)


@dataclass(frozen=True, slots=True)
class HourWork:
    table: str
    hour: keys.UtcHour
    files: tuple[DataFile, ...]


@dataclass(slots=True)
class CompactionReport:
    """What a compaction did (per (table, hour) in ``hours``), and the committed version."""

    version: int | None = None
    hours: list[dict[str, object]] = field(default_factory=list)
    rows_before: int = 0
    rows_after: int = 0
    rows_masked: int = 0
    files_before: int = 0
    files_after: int = 0
    attempts: int = 0
    ledger_hours: list[str] = field(default_factory=list)
    """Accepted hours whose ledger files were merged into one (`rollup.table.ledger_merge`)."""
    ledger_files_before: int = 0
    ledger_files_after: int = 0


def choose(
    snapshot: Snapshot,
    *,
    hours: Sequence[keys.UtcHour] | None = None,
    tables: Sequence[str] | None = None,
    min_files: int = 2,
) -> list[HourWork]:
    """The (table, hour) groups to rewrite, in table then hour order. Pure."""
    wanted = set(hours) if hours is not None else None
    work: list[HourWork] = []
    for table in tables or sorted(schemas.TABLES):
        by_hour: dict[keys.UtcHour, list[DataFile]] = {}
        for data_file in snapshot.data_files(table):
            by_hour.setdefault(data_file.partition, []).append(data_file)
        for hour, files in sorted(by_hour.items()):
            if wanted is not None and hour not in wanted:
                continue
            masked = any(pending_on(snapshot.tombstones, f) for f in files)
            if wanted is None and len(files) < min_files and not masked:
                continue
            work.append(HourWork(table, hour, tuple(sorted(files, key=lambda f: f.path))))
    return work


class _Output:
    """The new files of one (table, hour), cut every ``rows_per_file`` rows."""

    def __init__(
        self,
        access: StoreAccess,
        work: HourWork,
        version: int,
        rows_per_file: int,
        compression: str,
    ) -> None:
        self._access = access
        self._work = work
        self._version = version
        self._rows_per_file = rows_per_file
        self._compression = compression
        self._schema = schemas.table_schema(work.table)
        # points: small row groups, for single-series reads (PROTOCOL §5); each input
        # file is sorted by (series, ts) and streamed in order, so an output file is a few
        # sorted runs (one per input file), not re-sorted whole (memory stays one file)
        self._group_rows = schemas.POINTS_ROW_GROUP_ROWS if work.table == "points" else None
        self.files: list[DataFile] = []
        self._open: tuple[str, pq.ParquetWriter, pa.NativeFile] | None = None
        self._rows = 0
        self._stats: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def write(self, rows: pa.Table) -> None:
        offset = 0
        while offset < rows.num_rows:
            if self._open is None:
                path = keys.rollup_data_key(self._work.table, self._work.hour, str(uuid.uuid4()))
                writer, stream = open_parquet_writer(
                    self._access, path, self._schema, compression=self._compression
                )
                self._open, self._rows, self._stats = (path, writer, stream), 0, []
            part = rows.slice(offset, self._rows_per_file - self._rows)
            self._open[1].write_table(part.cast(self._schema), row_group_size=self._group_rows)
            self._stats.append(schemas.file_stats(part))
            self._rows += part.num_rows
            offset += part.num_rows
            if self._rows >= self._rows_per_file:
                self.close()

    def close(self) -> None:
        if self._open is None:
            return
        path, writer, stream = self._open
        writer.close()
        size = stream.tell()
        stream.close()
        low, high = schemas.merged_stats(self._stats)
        self.files.append(
            DataFile(
                path=path,
                table=self._work.table,
                partition=self._work.hour,
                row_count=self._rows,
                size_bytes=size,
                min=low,
                max=high,
                added_version=self._version,
            )
        )
        self._open = None


def rewrite_hour(
    work: HourWork,
    snapshot: Snapshot,
    *,
    access: StoreAccess,
    version: int,
    target_bytes: int,
    compression: str,
) -> tuple[list[DataFile], int]:
    """Write ``work``'s rows (masked) as new files; ``(files, rows masked)``. Blocking."""
    filesystem, root = access.filesystem()
    in_bytes = sum(f.size_bytes for f in work.files)
    in_rows = max(1, sum(f.row_count for f in work.files))
    rows_per_file = max(1, int(target_bytes / max(1.0, in_bytes / in_rows)))
    output = _Output(access, work, version, rows_per_file, compression)
    stats = reader.ScanStats()  # counts over every input file
    if work.table in schemas.SERIES_TABLES:
        # The series index's hour is small: its files' rows combined into one per series.
        rows = reader.read_files(work.files, work.table, filesystem, root)
        output.write(series_rows.combine(rows, schemas.PARTITION_COLUMN[work.table]))
        output.close()
        return output.files, 0
    try:
        for data_file in work.files:  # one input file in memory at a time
            rows = reader.read_files(
                [data_file],
                work.table,
                filesystem,
                root,
                stats=stats,
                tombstones=snapshot.tombstones,
            )
            output.write(rows)
    finally:
        output.close()
    return output.files, stats.rows_masked


async def compact(
    store: ObjectStore,
    *,
    access: StoreAccess,
    clock: Clock,
    hours: Sequence[keys.UtcHour] | None = None,
    tables: Sequence[str] | None = None,
    target_bytes: int = 128 * 1024 * 1024,
    min_files: int = 2,
    compression: str = "zstd",
    progress: Callable[[str], None] | None = None,
    rng: random.Random | None = None,
) -> CompactionReport:
    """Compact the chosen hours of the latest snapshot in one commit (see the module doc).
    Raises `CommitConflict` when every attempt lost the pointer race, store errors."""
    delays = _BACKOFF.delays(rng or random.Random())
    report = CompactionReport()
    while True:
        report.attempts += 1
        base = await load_latest(store)
        if base is None:
            return report
        chosen = choose(base.snapshot, hours=hours, tables=tables, min_files=min_files)
        chosen, recompute = series_files.recomputed_by_compaction(base.snapshot, chosen)
        ledger_hours: dict[str, tuple[str, ...]] = {}
        if tables is None:  # the ledger is compacted with every table, not with one
            ledger_hours = ledger_merge.choose_hours(
                base.snapshot, min_files=min_files, hours=hours
            )
        if not chosen and not ledger_hours:
            report.version = base.snapshot.version
            return report
        changes, rows = await _rewrite(base, chosen, access, target_bytes, compression, progress)
        if recompute:  # a delete left points: their hours' series rows follow them
            changes = await asyncio.to_thread(
                series_files.with_recomputed,
                base.snapshot,
                changes,
                recompute,
                access=access,
                compression=compression,
            )
        merges = await ledger_merge.merge_hours(store, base.snapshot, ledger_hours)
        if not chosen and not merges:
            report.version = base.snapshot.version
            return report
        changes = replace(
            changes,
            added_ledger_files=tuple(m.added for m in merges),
            removed_ledger_files=tuple(p for m in merges for p in m.removed),
        )
        try:
            committed = await commit(store, base=base, changes=changes, owner=None, clock=clock)
        except CommitConflict:
            await delete_uncommitted(store, changes)
            delay = next(delays, None)
            if delay is None:
                raise
            log.warning("rollup_compaction_conflict", attempt=report.attempts)
            await clock.sleep(delay)
            continue
        _fill(report, committed, chosen, changes, rows)
        report.ledger_hours = [m.hour for m in merges]
        report.ledger_files_before = sum(len(m.removed) for m in merges)
        report.ledger_files_after = len(merges)
        log.info("rollup_compacted", version=report.version, hours=len(chosen))
        return report


async def _rewrite(
    base: LoadedSnapshot,
    chosen: list[HourWork],
    access: StoreAccess,
    target_bytes: int,
    compression: str,
    progress: Callable[[str], None] | None,
) -> tuple[Changes, list[int]]:
    version = base.snapshot.version + 1
    added: list[DataFile] = []
    masked_per_hour: list[int] = []
    for index, work in enumerate(chosen, 1):
        files, masked = await asyncio.to_thread(
            rewrite_hour,
            work,
            base.snapshot,
            access=access,
            version=version,
            target_bytes=target_bytes,
            compression=compression,
        )
        added += files
        masked_per_hour.append(masked)
        if progress is not None:
            progress(
                f"[{index}/{len(chosen)}] {work.table} {work.hour.iso}: "
                f"{len(work.files)} files -> {len(files)}, {masked} rows masked"
            )
    removed = tuple(sorted(f.path for work in chosen for f in work.files))
    return Changes(added_files=tuple(added), removed_files=removed), masked_per_hour


def _fill(
    report: CompactionReport,
    committed: LoadedSnapshot,
    chosen: list[HourWork],
    changes: Changes,
    masked: list[int],
) -> None:
    report.version = committed.snapshot.version
    for work, rows_masked in zip(chosen, masked, strict=True):
        new = [f for f in changes.added_files if f.table == work.table and f.partition == work.hour]
        before = sum(f.row_count for f in work.files)
        after = sum(f.row_count for f in new)
        report.hours.append(
            {
                "table": work.table,
                "hour": work.hour.iso,
                "files_before": len(work.files),
                "files_after": len(new),
                "rows_before": before,
                "rows_after": after,
                "rows_masked": rows_masked,
            }
        )
        report.rows_before += before
        report.rows_after += after
        report.rows_masked += rows_masked
        report.files_before += len(work.files)
        report.files_after += len(new)


async def compact_after_run(
    store: ObjectStore, access: StoreAccess, settings: RollupSettings, clock: Clock
) -> dict[str, Any]:
    """``[rollup] compact_after_run``: compact what the commit left.
    The run's commit stands whatever happens here: a failure is logged, and the next run
    or ``lm-rollup compact`` does it."""
    try:
        report = await compact(
            store,
            access=access,
            clock=clock,
            target_bytes=settings.compact_target_bytes,
            min_files=settings.compact_min_files,
            compression=settings.compression,
        )
    except (CommitConflict, StoreError, OSError) as exc:
        log.warning("rollup_compaction_after_run_failed", error=f"{type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "version": report.version,
        "hours": len(report.hours),
        "files_before": report.files_before,
        "files_after": report.files_after,
        "rows_masked": report.rows_masked,
    }
