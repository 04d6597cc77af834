"""Removing included batches whose key was retracted (PROTOCOL §3.7 "Retraction", §4.1).

An operator retracts a phantom catalog row (``lm-reconciler retract KEY``); the lease
holder writes a ``retracted`` row for the key, and its rollup work marker. The planner
(`rollup.job.plan_sql`) then reports every batch the ledger includes whose key's
counting row is ``retracted``, and a rollup run removes them **first, in one commit of
their own** (`commit_retraction`), before it plans what to include:

- the identity's points leave ``points`` in the hours of the batch's point range (its
  ledger row's ``min_ts``/``max_ts``; for an older row, the range of its frame; if the
  frame is gone, every hour, pruned by file statistics), and the ``rollup_1m`` cells they
  fed are recomputed (`rollup.lifecycle.retraction_rows`). The rollup only ever includes
  a batch whose frame header is its key's identity and whose seq range overlaps no other
  included identity of its agent and boot, so these points are the batch's and no
  other's;
- its ledger row leaves the ledger files of its accepted hour (they are rewritten as one
  file without it), and its digest moves from the hour's totals (included, or retired;
  its part of ``late_excluded`` or ``lost`` too) to ``retracted``
  (`rollup.table.ledger_retracted`).

A later real record of the key (a row the store returned, written after the retracted
one) is planned again like any batch not in the ledger, and the commit that includes it
moves its digest back (`restored_batches`).

The commit is the run's: under its owner lease, If-Match on the planned base. On a lost
race its files are deleted and the run plans again (nothing of it is reachable).

Which part a batch's digest leaves: ``lost`` when it was acknowledged lost;
``late_excluded`` when it is one of the batches whose setsum is its hour's late part;
else included (`rollup.table.ledger_retracted.in_late_part`: ledger rows do not say
whether a batch was late, so the hour's other rows are searched for the rest of the late
part, or for the part that is not late, whichever has fewer batches). In the rare hour
where both sides hold more than ``MAX_LATE_SEARCH`` + 1 batches it is attributed to the
included totals and logged; ``verify`` compares the hour's totals all the same.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc
import structlog

from protocol import keys
from protocol.clock import Clock
from rollup.lifecycle.retraction_rows import Identity, hours_between, remove_identities
from rollup.table.batch_frames import MAX_RAW_BYTES, BadFrame, check_frame
from rollup.table.commit import (
    CommitConflict,
    LoadedSnapshot,
    commit,
    delete_uncommitted,
)
from rollup.table.ledger import (
    LedgerRow,
    decode_ledger,
    encode_ledger,
    ledger_rows,
    ledger_table,
)
from rollup.table.ledger_retracted import RetractedBatch, in_late_part
from rollup.table.manifest import Changes, Snapshot
from rollup.table.manifest_ledger import EMPTY_LEDGER_HOUR, ledger_file_hour
from rollup.table.owner import OwnerLease
from rollup.table.schemas import LEDGER_SCHEMA
from rollup.table.storage import StoreAccess, read_object
from store.base import ObjectStore

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class RetractionReport:
    """What a retraction commit removed (``lm-rollup run`` reports it)."""

    version: int | None = None
    batches: list[str] = field(default_factory=list)
    points_removed: int = 0
    cells_recomputed: int = 0
    hours_unrecomputed: list[str] = field(default_factory=list)


async def commit_retraction(
    store: ObjectStore,
    base: LoadedSnapshot,
    retracted: pa.Table,
    *,
    access: StoreAccess,
    compression: str,
    owner: OwnerLease,
    clock: Clock,
) -> RetractionReport | None:
    """Remove the ``retracted`` batches (``accepted_hour``, ``manifest_id``) in one commit
    on ``base``; None when the pointer moved (this attempt's files deleted: plan again).
    Raises `OwnerLost`, store errors."""
    changes, report = await retraction_changes(
        store, base.snapshot, retracted, access=access, compression=compression
    )
    if not changes.added_retracted:
        return report
    try:
        committed = await commit(store, base=base, changes=changes, owner=owner, clock=clock)
    except CommitConflict:
        await delete_uncommitted(store, changes)
        return None
    except BaseException:
        await delete_uncommitted(store, changes)
        raise
    report.version = committed.snapshot.version
    log.info("rollup_retraction_committed", version=report.version, batches=report.batches)
    return report


async def retraction_changes(
    store: ObjectStore,
    snapshot: Snapshot,
    retracted: pa.Table,
    *,
    access: StoreAccess,
    compression: str,
) -> tuple[Changes, RetractionReport]:
    """The `Changes` that remove the ``retracted`` batches from ``snapshot`` (files
    written, nothing committed) and what they do."""
    wanted = set(
        zip(
            retracted.column("accepted_hour").to_pylist(),
            retracted.column("manifest_id").to_pylist(),
            strict=True,
        )
    )
    report = RetractionReport()
    added_ledger: list[str] = []
    removed_ledger: list[str] = []
    batches: list[RetractedBatch] = []
    removals: list[tuple[Identity, set[keys.UtcHour] | None]] = []
    for hour in sorted({h for h, _ in wanted}):
        paths = [p for p in snapshot.ledger_files if ledger_file_hour(p) == hour]
        rows = [row for path in paths for row in ledger_rows(await _read_ledger(store, path))]
        gone = [row for row in rows if (hour, row.manifest_id) in wanted]
        if not gone:
            log.warning("rollup_retraction_not_in_ledger", hour=hour)
            continue
        for row in gone:
            batches.append(_retracted_batch(snapshot, row, rows))
            removals.append((Identity.of_manifest_id(row.manifest_id), _point_hours(access, row)))
            report.batches.append(row.manifest_id)
        kept = [row for row in rows if (hour, row.manifest_id) not in wanted]
        key = keys.rollup_ledger_key(keys.UtcHour.parse_iso(hour), _new_id())
        await store.put(key, encode_ledger(_table(kept)))
        added_ledger.append(key)
        removed_ledger += paths
    removal = await asyncio.to_thread(
        remove_identities,
        snapshot,
        removals,
        access=access,
        version=snapshot.version + 1,
        compression=compression,
    )
    report.points_removed = removal.points_removed
    report.cells_recomputed = removal.cells_recomputed
    report.hours_unrecomputed = removal.hours_unrecomputed
    changes = Changes(
        added_files=tuple(sorted(removal.added, key=lambda f: f.path)),
        removed_files=tuple(sorted(set(removal.removed))),
        added_ledger_files=tuple(added_ledger),
        removed_ledger_files=tuple(removed_ledger),
        added_retracted=tuple(batches),
    )
    return changes, report


def restored_batches(
    base: LoadedSnapshot | None, items: pa.Table, left_out: set[str]
) -> tuple[tuple[str, str], ...]:
    """``(accepted_hour, manifest_id)`` of the base's retracted batches that this run
    includes again: planned (``items``) and not left out (a bad frame, ``left_out``)."""
    held = base.snapshot.ledger_retracted if base is not None else ()
    if not held:
        return ()
    ids = pa.array(sorted({b.manifest_id for b in held}), pa.string())
    planned = items.filter(pc.is_in(items.column("manifest_id"), value_set=ids))
    found = set(
        zip(
            planned.column("accepted_hour").to_pylist(),
            planned.column("manifest_id").to_pylist(),
            strict=True,
        )
    )
    return tuple(
        sorted(
            (b.accepted_hour, b.manifest_id)
            for b in held
            if (b.accepted_hour, b.manifest_id) in found and b.manifest_id not in left_out
        )
    )


def _retracted_batch(snapshot: Snapshot, row: LedgerRow, rows: list[LedgerRow]) -> RetractedBatch:
    """``row``'s batch and the part of its hour's totals it leaves (module doc); ``rows``:
    every ledger row of its hour."""
    batch = RetractedBatch(row.manifest_id, row.frame_sha256, row.record_count, row.accepted_hour)
    if any(b.manifest_id == row.manifest_id for b in snapshot.ledger_lost):
        return replace(batch, part="lost")
    late = snapshot.ledger_late.get(row.accepted_hour)
    if late is None:
        return batch
    hour = snapshot.ledger_hours.get(row.accepted_hour, EMPTY_LEDGER_HOUR)
    others = [(r.manifest_id, r.frame_sha256) for r in rows if r.manifest_id != row.manifest_id]
    found = in_late_part(late, hour, (row.manifest_id, row.frame_sha256), others)
    if found is None:
        log.warning(
            "rollup_retraction_late_part_unknown",
            manifest_id=row.manifest_id,
            hour=row.accepted_hour,
            late_batches=late.batches,
            batches=hour.batches,
        )
    return replace(batch, part="late_excluded") if found else batch


def _point_hours(access: StoreAccess, row: LedgerRow) -> set[keys.UtcHour] | None:
    """The ``points`` hours of the batch: its ledger row's range, else its frame's; None
    when neither is known (the frame is gone or unreadable: every hour is scanned)."""
    if row.min_ts is not None and row.max_ts is not None:
        return hours_between(row.min_ts, row.max_ts)
    key = keys.raw_blob_key(row.frame_sha256)
    try:
        data: bytes | None = read_object(access, key)
    except FileNotFoundError:
        data = None
    try:
        _frame, points = check_frame(
            data,
            blob_key=key,
            frame_sha256=row.frame_sha256,
            manifest_id=row.manifest_id,
            max_raw_bytes=MAX_RAW_BYTES,
        )
    except BadFrame:
        return None
    if points.num_rows == 0:
        return set()
    bounds = pc.min_max(points.column("ts").cast(pa.int64()))
    return hours_between(bounds["min"].as_py(), bounds["max"].as_py())


async def _read_ledger(store: ObjectStore, key: str) -> pa.Table:
    body, _etag = await store.get(key)
    return decode_ledger(body, key=key)


def _table(rows: list[LedgerRow]) -> pa.Table:
    return ledger_table(rows).cast(LEDGER_SCHEMA)


def _new_id() -> str:
    return str(uuid.uuid4())
