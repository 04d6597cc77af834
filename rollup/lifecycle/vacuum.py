"""``lm-rollup vacuum``: delete rollup objects no retained snapshot needs.

Retention (decision): the *retained* snapshots are the current one, plus
- with ``retain_versions=K``: the newest K versions (the current counts as one; a
  version that changed nothing — vacuum's own, see below — counts with the one it
  repeats);
- with ``retain_s=S``: every snapshot created in the last S seconds *and* the one that
  was current S seconds ago (the newest created before then), so any state the dataset
  had within the last S seconds can still be read by version;
both when both are given; and every snapshot that the current published Iceberg metadata
of a table still lists (`rollup.iceberg.publish.published_versions`), so engines reading
Iceberg never find a file gone. Older snapshots' manifests are deleted too, which ends
`history` and version travel there. Published Iceberg metadata files themselves
(``rollup/v1/iceberg/``) are not vacuumed yet.

Everything under ``rollup/v1/manifests/``, ``tables/``, ``ledger/`` and ``tombstones/``
that no retained snapshot reaches (their manifests, data, ledger and tombstone files) is
deleted: files superseded long enough ago (their removal is recorded in the superseding
snapshot's ``removed_files``), tombstone records of deletes whose commit failed, orphans of commits that crashed or lost, and old manifests. The pointer
and the owner lease are never touched.

Safety:
- Nothing reachable from the current snapshot is ever deleted: the keep set always
  includes it.
- **The pointer moves first** (PROTOCOL §4.1): before deleting anything, vacuum commits
  a snapshot of its own — the current snapshot's content as a new version, under
  vacuum's owner epoch — with the pointer CAS on the ETag it planned with. A writer
  that planned on the older pointer (a job that passed its last lease check and then
  stalled, a ``delete`` or ``compact``) fails its CAS and plans again on the new
  snapshot instead of swapping the pointer to files deleted here; a pointer that moved
  while vacuum planned aborts it (`VacuumAborted`, nothing deleted). So a vacuum that
  deletes something adds one version (``history`` shows it with nothing added or
  removed); one with nothing to delete commits nothing. Before the first commit it
  commits an empty version 1 (only while holding the owner lease; without it, nothing
  is deleted).
- An unreachable object younger than ``min_age_s`` is kept: a commit in flight may be
  about to reference it (its files are written before its snapshot and pointer). Ages
  (and the retention cutoff) are judged in store time (PROTOCOL §3.8, `store.time`):
  LastModified is the store's clock, so a host whose clock runs ahead must not see a
  file of a commit in flight as old.
- A snapshot pinned by an unexpired reader lease (``rollup/v1/readers/``,
  `rollup.read.reader_lease`) keeps every file it reaches, whatever the retention says;
  leases are read after the candidates are listed, as late as possible, and judged
  against store time taken at the start (a renewal landing meanwhile is seen). Expired
  leases (readers that died) are deleted and reported; unreadable ones are reported and
  left for an operator. `VacuumReport.pinned` says what each lease kept.
- Vacuum holds the rollup owner lease while it works (``hold_lease``), so no job commits
  meanwhile; `store.lease.LeaseHeld` when a job holds it: run vacuum later.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import structlog

from protocol import keys
from protocol.clock import Clock
from protocol.records import RollupReaderLease
from rollup.iceberg.publish import published_versions
from rollup.read.reader_lease import list_reader_leases
from rollup.table.commit import (
    CommitConflict,
    LoadedSnapshot,
    commit,
    load_latest,
    read_snapshot,
    walk_snapshots,
)
from rollup.table.manifest import Changes, Snapshot, parse_created_at
from rollup.table.owner import VACUUM_OWNER_PREFIX, OwnerLease
from store.base import ObjectInfo, ObjectStore
from store.errors import NotFound
from store.time import store_clock

log = structlog.get_logger(__name__)

VACUUMED_PREFIXES = (
    keys.ROLLUP_MANIFESTS_PREFIX,
    keys.ROLLUP_TABLES_PREFIX,
    keys.ROLLUP_LEDGER_PREFIX,
    keys.ROLLUP_TOMBSTONES_PREFIX,
)


class VacuumAborted(Exception):
    """The pointer moved while vacuum planned (a commit ran without the lease): nothing
    was deleted; run vacuum again."""


@dataclass(slots=True)
class PinnedSnapshot:
    """A snapshot an unexpired reader lease pins, and how many files vacuum kept only
    because of it (0 when the retention keeps them anyway). ``snapshot_gone``: its
    manifest was already vacuumed, so the lease pins nothing."""

    lease: RollupReaderLease
    files_kept: int = 0
    snapshot_gone: bool = False


@dataclass(slots=True)
class VacuumReport:
    current_version: int | None
    retained_versions: list[int] = field(default_factory=list)
    kept: int = 0
    too_young: int = 0
    deleted: list[str] = field(default_factory=list)
    dry_run: bool = False
    pinned: list[PinnedSnapshot] = field(default_factory=list)
    expired_leases: list[RollupReaderLease] = field(default_factory=list)
    unreadable_leases: list[str] = field(default_factory=list)
    committed_version: int | None = None
    """The snapshot vacuum committed before deleting (None: nothing was deleted)."""


def retained(
    chain: list[Snapshot], *, now_ns: int, retain_versions: int | None, retain_s: float | None
) -> list[Snapshot]:
    """Pure: the retained prefix of ``chain`` (newest first, contiguous versions).

    ``retain_versions`` counts *states*: a snapshot whose content equals the one before
    it (vacuum's own pointer move, `_move_pointer`) goes with the state it repeats, so
    running vacuum again does not push an older version out."""
    if not chain:
        return []
    if retain_versions is not None and retain_versions < 1:
        raise ValueError(f"retain_versions must be >= 1, got {retain_versions}")
    if retain_s is not None and retain_s < 0:
        raise ValueError(f"retain_s must be >= 0, got {retain_s}")
    newest = chain[0].version
    cutoff_ns = now_ns - int(retain_s * 1e9) if retain_s is not None else None
    passed_cutoff = False
    kept: list[Snapshot] = []
    states = 1  # distinct states from the newest down to this snapshot
    for index, snapshot in enumerate(chain):
        if index and not same_state(snapshot, chain[index - 1]):
            states += 1
        by_version = retain_versions is not None and states <= retain_versions
        # Walking back in time, every snapshot down to and including the first one
        # created before the cutoff is kept: that one was current at the cutoff.
        by_time = cutoff_ns is not None and not passed_cutoff
        if cutoff_ns is not None and _created_ns(snapshot) < cutoff_ns:
            passed_cutoff = True
        if snapshot.version != newest and not (by_version or by_time):
            break
        kept.append(snapshot)
    return kept


def same_state(older: Snapshot, newer: Snapshot) -> bool:
    """Whether ``newer`` holds exactly what ``older`` holds (it changed nothing)."""
    return (
        not newer.removed_files
        and newer.tables == older.tables
        and newer.tombstones == older.tombstones
        and newer.ledger_files == older.ledger_files
        and newer.ledger_hours == older.ledger_hours
        and newer.ledger_late == older.ledger_late
        and newer.retention == older.retention
    )


def _created_ns(snapshot: Snapshot) -> int:
    return int(parse_created_at(snapshot.created_at).timestamp() * 1e6) * 1000


async def vacuum(
    store: ObjectStore,
    *,
    clock: Clock,
    retain_versions: int | None = None,
    retain_s: float | None = None,
    min_age_s: float = 3600.0,
    dry_run: bool = False,
    hold_lease: bool = True,
    lease_ttl_s: float = 300.0,
    concurrency: int = 16,
) -> VacuumReport:
    """Delete what no retained snapshot reaches (see the module doc). Returns what was
    kept and deleted (with ``dry_run``: what would be). Raises `LeaseHeld` while a job
    holds the owner lease, `VacuumAborted` if the pointer moved, store errors (a failed
    delete stops the run; what was deleted before is reported in the log)."""
    owner = None
    if hold_lease:
        owner_id = f"{VACUUM_OWNER_PREFIX}{uuid.uuid4()}"
        owner = await OwnerLease.acquire(store, owner_id, lease_ttl_s, clock)
    try:
        return await _vacuum(
            store, clock, retain_versions, retain_s, min_age_s, dry_run, owner, concurrency
        )
    finally:
        if owner is not None:
            await owner.release()


async def _vacuum(
    store: ObjectStore,
    clock: Clock,
    retain_versions: int | None,
    retain_s: float | None,
    min_age_s: float,
    dry_run: bool,
    owner: OwnerLease | None,
    concurrency: int,
) -> VacuumReport:
    latest = await load_latest(store)
    chain = [s async for s in walk_snapshots(store, latest)] if latest is not None else []
    now_ns = store_clock(store, clock).now_ns()
    kept_snapshots = retained(
        chain, now_ns=now_ns, retain_versions=retain_versions, retain_s=retain_s
    )
    # Engines reading the published Iceberg metadata may time-travel to any snapshot it
    # still lists: those versions' files stay live, whatever the retention says.
    published = await published_versions(store)
    kept_versions = {s.version for s in kept_snapshots}
    kept_snapshots += [s for s in chain if s.version in published - kept_versions]
    keep: set[str] = set()
    for snapshot in kept_snapshots:
        keep |= snapshot.reachable_keys()
    report = VacuumReport(
        current_version=latest.snapshot.version if latest is not None else None,
        retained_versions=[s.version for s in kept_snapshots],
        dry_run=dry_run,
    )
    listed: list[ObjectInfo] = []
    for prefix in VACUUMED_PREFIXES:
        async for info in store.list(prefix):
            if info.key in keep:
                report.kept += 1
            else:
                listed.append(info)
    # Leases are read after the listing, so a lease written before this point is seen.
    leases = await list_reader_leases(store, now_ns=now_ns)
    report.expired_leases, report.unreadable_leases = leases.expired, leases.unreadable
    pinned_by: dict[str, PinnedSnapshot] = {}
    for lease in sorted(leases.live, key=lambda r: (r.version, r.reader)):
        pin = PinnedSnapshot(lease)
        report.pinned.append(pin)
        try:
            pinned = await read_snapshot(store, lease.manifest_key)
        except NotFound:
            pin.snapshot_gone = True
            continue
        for key in pinned.reachable_keys():
            pinned_by.setdefault(key, pin)
    candidates: list[ObjectInfo] = []
    for info in listed:
        if info.key in pinned_by:
            pinned_by[info.key].files_kept += 1
            report.kept += 1
        elif now_ns - info.last_modified_ns < min_age_s * 1e9:
            report.too_young += 1
        else:
            candidates.append(info)
    # Manifests last: a run cut short keeps the chain's older links as long as possible.
    candidates.sort(key=lambda i: i.key.startswith(keys.ROLLUP_MANIFESTS_PREFIX))
    if latest is None and owner is None:
        candidates = []  # no pointer, and no epoch to commit one under: delete nothing
    report.deleted = [c.key for c in candidates]
    if dry_run or not (candidates or report.expired_leases):
        return report
    if candidates:
        report.committed_version = await _move_pointer(store, latest, owner, clock)
    elif owner is not None:
        await owner.check()
    limit = asyncio.Semaphore(concurrency)

    async def delete(key: str) -> None:
        async with limit:
            await store.delete(key)

    await asyncio.gather(*(delete(c.key) for c in candidates))
    # Expired leases last: they pinned nothing this run kept (judged at the start).
    await asyncio.gather(*(delete(keys.rollup_reader_key(r.reader)) for r in report.expired_leases))
    log.info(
        "rollup_vacuumed",
        committed_version=report.committed_version,
        deleted=len(candidates),
        kept=report.kept,
        pinned=len(report.pinned),
        expired_leases=len(report.expired_leases),
    )
    return report


async def _move_pointer(
    store: ObjectStore, latest: LoadedSnapshot | None, owner: OwnerLease | None, clock: Clock
) -> int:
    """PROTOCOL §4.1: commit a snapshot of vacuum's own (the latest one's content, a new
    version) with the pointer CAS on the ETag read when vacuum planned, before anything
    is deleted. Any commit planned on that older pointer then fails its CAS and plans
    again, so a writer that passed its last lease check and stalled can never swap the
    pointer to files deleted here. A pointer that moved meanwhile: `VacuumAborted`.
    Before the first commit (orphans of first commits that failed) this is an empty
    version 1, created like any first commit (If-None-Match), under vacuum's lease."""
    try:
        moved = await commit(store, base=latest, changes=Changes(), owner=owner, clock=clock)
    except CommitConflict as exc:
        raise VacuumAborted(
            f"the rollup pointer moved while vacuum planned; nothing deleted ({exc})"
        ) from None
    return moved.snapshot.version
