"""What a rollup run takes from its base snapshot, its plan and stage output: the files
retention expires and whether it moves a cutoff, stage 2's inputs per hour (committed
files, tombstones, first kept hours), the `DataFile` record of a written file, the hours
a commit leaves pending and the hour a work marker names."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from config.settings import RollupSettings
from protocol import keys
from rollup.job.plan import Plan
from rollup.job.tasks import HourInputs
from rollup.lifecycle import series_files
from rollup.table import schemas
from rollup.table.commit import LoadedSnapshot
from rollup.table.data_file import DataFile
from rollup.table.manifest import Changes


def data_file_of(body: dict[str, Any], version: int) -> DataFile:
    return DataFile(
        path=body["path"],
        table=body["table"],
        partition=keys.UtcHour.parse_iso(body["partition"]),
        row_count=body["row_count"],
        size_bytes=body["size_bytes"],
        min=body["min"],
        max=body["max"],
        added_version=version,
    )


def retention_cutoffs(
    settings: RollupSettings, base: LoadedSnapshot | None, now_ns: int
) -> dict[str, str]:
    """Per table with retention: the first hour it keeps, as of store time ``now_ns``
    (never before the base's: retention only moves forward). The series index
    (``series``, ``series_day``) keeps what ``points`` keeps."""
    days = {
        "points": settings.retention_points_days,
        "rollup_1m": settings.retention_rollup_1m_days,
    }
    days.update({table: settings.retention_points_days for table in schemas.SERIES_TABLES})
    cutoffs: dict[str, str] = {}
    for table, keep_days in days.items():
        if keep_days is None:
            continue
        first_kept = keys.UtcHour.from_unix_ns(now_ns - int(keep_days * 86400e9)).iso
        before = base.snapshot.retention.get(table) if base is not None else None
        cutoffs[table] = max(first_kept, before) if before is not None else first_kept
    return cutoffs


def expired_files(base: LoadedSnapshot | None, retention: dict[str, str]) -> set[str]:
    """Retention: every file of ``base`` of an hour before its table's first kept hour."""
    if base is None:
        return set()
    return {
        f.path
        for table, first_kept in retention.items()
        for f in base.snapshot.data_files(table)
        if f.partition.iso < first_kept
    }


def retention_moves(base: LoadedSnapshot | None, retention: dict[str, str]) -> bool:
    """Whether ``retention`` drops files of ``base`` or moves a cutoff."""
    if base is None:
        return False
    moved = any(base.snapshot.retention.get(t) != first for t, first in retention.items())
    return moved or bool(expired_files(base, retention))


def upkeep_due(
    base: LoadedSnapshot | None, retention: dict[str, str], now_ns: int, settings: RollupSettings
) -> bool:
    """Whether a run with no batches still commits: retention moves (`retention_moves`), or
    a day settled without ``series_day`` rows (`rollup.lifecycle.series_files.days_due`)."""
    if retention_moves(base, retention):
        return True
    snapshot = base.snapshot if base is not None else None
    first_kept = retention.get("series_day")
    settle_us = int(settings.series_day_settle_s * 1e6)
    return series_files.days_due(snapshot, first_kept, now_ns // 1000, settle_us)


def hour_inputs(base: LoadedSnapshot | None, retention: dict[str, str]) -> HourInputs:
    first_kept = {
        table: datetime.fromtimestamp(keys.UtcHour.parse_iso(hour).start_ns / 1e9, tz=UTC)
        for table, hour in retention.items()
    }
    if base is None:
        return HourInputs(first_kept=first_kept)
    rollup: dict[str, list[str]] = {}
    points: dict[str, list[str]] = {}
    for target, table in ((rollup, "rollup_1m"), (points, "points")):
        for data_file in base.snapshot.data_files(table):
            target.setdefault(data_file.partition.iso, []).append(data_file.path)
    return HourInputs(
        rollup_files={h: tuple(p) for h, p in rollup.items()},
        points_files={h: tuple(p) for h, p in points.items()},
        tombstones=base.snapshot.tombstones,
        first_kept=first_kept,
    )


def hours_left_pending(plan: Plan, changes: Changes) -> set[str]:
    """Hours with planned batches that the commit's ledger does not include, or with
    batches the plan refused (their markers stay: the next run tries them again)."""
    planned = plan.batches_per_hour()
    return refused_hours(plan) | {
        hour
        for hour, count in planned.items()
        if (delta := changes.ledger_delta.get(hour)) is None or delta.batches < count
    }


def refused_hours(plan: Plan) -> set[str]:
    """Hours of the batches the plan refused (``overlapping-identity``)."""
    return {str(h) for h in plan.refused.column("accepted_hour").to_pylist()}


def marker_hour(marker_key: str) -> str:
    hour, _epoch, _sequence = keys.parse_index_catalog_key(
        keys.parse_rollup_work_marker_key(marker_key)
    )
    return hour.iso
