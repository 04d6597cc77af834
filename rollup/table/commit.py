"""Loading and committing rollup snapshots (PROTOCOL §4): the pointer CAS is the commit point.

Commit order: data and ledger files (the caller) → the new snapshot, created with
If-None-Match at a key unique to this attempt (``v<version>-<commit-id>.json``) → the
pointer ``rollup/v1/_latest_manifest``, swapped with If-Match on the ETag read with the
base (created with If-None-Match for version 1). Until the swap lands, nothing written is
reachable: a crash anywhere before it leaves only orphans, which vacuum deletes.

Outcomes of `commit`:
- success: a `LoadedSnapshot` of the new latest snapshot;
- `CommitConflict`: another commit moved the pointer first (definite). Our snapshot file
  is deleted (it can never become reachable); re-read with `load_latest`, re-plan, retry;
- `OwnerLost`: the owner lease is gone, or a newer owner already committed: stop;
- `RollupInvariantError`: the changes do not fit the base (a planning bug): nothing
  was written;
- `OutcomeUnknown`: the pointer write's answer was lost and no read could settle it.
  Nothing is deleted; the next run's `load_latest` tells whether it landed;
- `Unavailable`: the store failed before anything became visible.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import structlog

from protocol.clock import Clock
from protocol.keys import ROLLUP_POINTER_KEY
from protocol.records import RecordError, RollupPointer
from rollup.table.manifest import (
    Changes,
    RollupInvariantError,
    RollupManifestError,
    Snapshot,
    format_created_at,
)
from rollup.table.manifest_codec import snapshot_from_json
from rollup.table.owner import OwnerLease, OwnerLost
from rollup.table.transition import apply
from store.base import ObjectStore
from store.errors import (
    ConditionConflict,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    StoreError,
    Unavailable,
)
from store.retry import Backoff

__all__ = [
    "STALE_ETAG",
    "CommitConflict",
    "LoadedSnapshot",
    "OwnerLost",
    "VersionNotFound",
    "commit",
    "delete_uncommitted",
    "load_latest",
    "load_version",
    "read_snapshot",
    "walk_snapshots",
]

log = structlog.get_logger(__name__)

_COMMIT_BACKOFF = Backoff(attempts=5, base_s=0.05, cap_s=2.0)

STALE_ETAG = '"lightmetrics-stale-pointer"'
"""``pointer_etag`` of a snapshot that is committed but no longer latest: it matches no
real ETag, so a commit based on it fails with `CommitConflict` and re-plans."""


class CommitConflict(Exception):
    """The pointer moved to another commit first. Definite: our snapshot will never be
    reachable. Re-read the latest snapshot, re-plan against it, and retry (bounded)."""

    def __init__(self, detail: str, *, current_version: int | None, orphan_key: str) -> None:
        super().__init__(detail)
        self.current_version = current_version
        self.orphan_key = orphan_key


class VersionNotFound(LookupError):
    """The asked-for version does not exist, or was removed by vacuum."""


@dataclass(frozen=True, slots=True)
class LoadedSnapshot:
    """A committed snapshot, where it is stored, and the pointer ETag to commit on top of
    it (`STALE_ETAG` when it is not the latest)."""

    snapshot: Snapshot
    manifest_key: str
    pointer_etag: str


async def read_snapshot(store: ObjectStore, key: str) -> Snapshot:
    """The snapshot stored at ``key``; `NotFound` if absent, `RollupManifestError` if it
    is malformed or not stored at its own key."""
    body, _ = await store.get(key)
    snapshot = snapshot_from_json(body)
    if snapshot.manifest_key != key:
        raise RollupManifestError(f"snapshot at {key!r} names itself {snapshot.manifest_key!r}")
    return snapshot


async def _read_pointer(store: ObjectStore) -> tuple[RollupPointer, str] | None:
    try:
        body, etag = await store.get(ROLLUP_POINTER_KEY)
    except NotFound:
        return None
    try:
        return RollupPointer.from_json(body), etag
    except RecordError as exc:
        raise RollupManifestError(f"{ROLLUP_POINTER_KEY}: {exc}") from None


async def read_pointer(store: ObjectStore) -> tuple[RollupPointer, str] | None:
    """The pointer and its ETag (one GET), or None before the first commit; a reader
    that caches snapshots by version reads only this to learn whether one is new."""
    return await _read_pointer(store)


async def load_latest(store: ObjectStore) -> LoadedSnapshot | None:
    """The snapshot the pointer names, or None before the first commit.

    Raises `RollupManifestError` if the pointer or snapshot is malformed or they disagree
    on the version; `NotFound` if the pointer names a missing snapshot; store errors."""
    pointer = await _read_pointer(store)
    if pointer is None:
        return None
    record, etag = pointer
    snapshot = await read_snapshot(store, record.manifest_key)
    if snapshot.version != record.version:
        raise RollupManifestError(
            f"pointer says version {record.version}, snapshot is version {snapshot.version}"
        )
    return LoadedSnapshot(snapshot, record.manifest_key, etag)


async def walk_snapshots(
    store: ObjectStore, start: LoadedSnapshot | None = None
) -> AsyncIterator[Snapshot]:
    """Snapshots from ``start`` (default: the latest) back to version 1, newest first.

    Stops early, without error, where vacuum removed an older snapshot (history beyond
    the retention is gone). Raises `RollupManifestError` if the chain is inconsistent."""
    latest = start if start is not None else await load_latest(store)
    if latest is None:
        return
    current: Snapshot | None = latest.snapshot
    while current is not None:
        yield current
        previous = current.previous_manifest_key
        if previous is None:
            return
        try:
            older = await read_snapshot(store, previous)
        except NotFound:
            return
        if older.version != current.version - 1:
            raise RollupManifestError(
                f"version {current.version} links to {previous!r}, version {older.version}"
            )
        current = older


async def load_version(store: ObjectStore, version: int) -> LoadedSnapshot:
    """Snapshot ``version``, found by walking back from the latest. `VersionNotFound` if
    it is newer than the latest, below 1, or vacuumed."""
    latest = await load_latest(store)
    if latest is None or not 1 <= version <= latest.snapshot.version:
        newest = latest.snapshot.version if latest else 0
        raise VersionNotFound(f"version {version} does not exist (latest is {newest})")
    oldest = latest.snapshot.version
    async for snapshot in walk_snapshots(store, latest):
        if snapshot.version == version:
            etag = latest.pointer_etag if snapshot is latest.snapshot else STALE_ETAG
            return LoadedSnapshot(snapshot, snapshot.manifest_key, etag)
        oldest = snapshot.version
    raise VersionNotFound(f"version {version} was vacuumed (oldest kept is {oldest})")


async def commit(
    store: ObjectStore,
    *,
    base: LoadedSnapshot | None,
    changes: Changes,
    owner: OwnerLease | None,
    clock: Clock,
    backoff: Backoff = _COMMIT_BACKOFF,
    rng: random.Random | None = None,
) -> LoadedSnapshot:
    """Commit ``changes`` on top of ``base`` (None: the first commit). See the module doc
    for every outcome. The caller has written every added data and ledger file.

    ``owner=None`` is a commit without the owner lease (deletes, compaction): it keeps
    the base's owner epoch and needs a base. That is safe because the pointer swap is
    conditional on the base's ETag: a job's commit planned on the older pointer fails
    its CAS and re-plans on the snapshot this one made, never the other way round."""
    rng = rng or random.Random()
    if owner is None:
        if base is None:
            raise RollupInvariantError("a commit without the owner lease needs a base snapshot")
        epoch = base.snapshot.owner_epoch
    else:
        await owner.check()
        epoch = owner.epoch
    if owner is not None and base is not None and base.snapshot.owner_epoch > owner.epoch:
        # A newer owner has committed: we were taken over, whatever our lease says.
        raise OwnerLost(
            f"version {base.snapshot.version} was written by owner epoch "
            f"{base.snapshot.owner_epoch}; ours is {owner.epoch}"
        )
    snapshot = apply(
        base.snapshot if base is not None else None,
        changes,
        version=(base.snapshot.version if base is not None else 0) + 1,
        commit_id=str(uuid.uuid4()),
        owner_epoch=epoch,
        created_at=format_created_at(clock.now_ns()),
        manifest_key_of_base=base.manifest_key if base is not None else None,
    )
    key = snapshot.manifest_key
    await _create_snapshot(store, key, snapshot.to_json(), backoff, rng, clock)
    # The lease may have run out while the snapshot was written; the swap is the commit.
    if owner is not None:
        await owner.check()
    etag = await _swap_pointer(store, base, snapshot, backoff, rng, clock)
    log.info("rollup_committed", version=snapshot.version, manifest_key=key)
    return LoadedSnapshot(snapshot, key, etag)


async def _create_snapshot(
    store: ObjectStore, key: str, body: bytes, backoff: Backoff, rng: random.Random, clock: Clock
) -> None:
    delays = backoff.delays(rng)
    while True:
        # Safe to repeat: the key is unique to this attempt and the create is
        # If-None-Match, so a repeat either creates it once or finds our own bytes.
        try:
            await store.put(key, body, if_none_match=True)
            return
        except PreconditionFailed:
            stored, _ = await store.get(key)
            if stored == body:
                return  # an earlier attempt whose answer was lost did land
            raise RollupManifestError(f"{key!r} exists with other content") from None
        except (ConditionConflict, Unavailable):
            delay = next(delays, None)
            if delay is None:
                raise
            await clock.sleep(delay)


async def _swap_pointer(
    store: ObjectStore,
    base: LoadedSnapshot | None,
    snapshot: Snapshot,
    backoff: Backoff,
    rng: random.Random,
    clock: Clock,
) -> str:
    key = snapshot.manifest_key
    body = RollupPointer(version=snapshot.version, manifest_key=key).to_json()
    delays = backoff.delays(rng)
    maybe_landed = False
    last: StoreError | None = None
    while True:
        # Safe to repeat: the write is conditional on the base's pointer ETag, which
        # never comes back once the pointer moved (every pointer body names a new
        # version), so a repeat lands at most once; and before each repeat the pointer
        # is read to see whether an earlier attempt already landed.
        try:
            if base is None:
                return await store.put(ROLLUP_POINTER_KEY, body, if_none_match=True)
            return await store.put(ROLLUP_POINTER_KEY, body, if_match=base.pointer_etag)
        except PreconditionFailed as exc:
            last = exc  # settled below by reading the pointer
        except OutcomeUnknown as exc:
            maybe_landed = True
            last = exc
        except (ConditionConflict, Unavailable) as exc:
            last = exc
        try:
            settled = await _settle(store, base, snapshot, maybe_landed)
        except Unavailable as exc:
            last, settled = exc, None
        if settled is not None:
            return settled
        delay = next(delays, None)
        if delay is None:
            if maybe_landed:
                raise OutcomeUnknown("commit", ROLLUP_POINTER_KEY, f"{key}: {last}") from last
            raise last
        await clock.sleep(delay)


async def _settle(
    store: ObjectStore, base: LoadedSnapshot | None, snapshot: Snapshot, maybe_landed: bool
) -> str | None:
    """After a refused or unanswered swap: our pointer's ETag if our commit landed;
    None if the pointer is still the base (retry); `CommitConflict` if another commit won."""
    key = snapshot.manifest_key
    pointer = await _read_pointer(store)
    if pointer is not None and pointer[0].manifest_key == key:
        return pointer[1]  # an earlier attempt whose answer was lost did land
    base_etag = base.pointer_etag if base is not None else None
    if (pointer[1] if pointer is not None else None) == base_etag:
        return None
    current = pointer[0].version if pointer is not None else None
    if maybe_landed and pointer is not None and pointer[0].version > snapshot.version:
        # Our lost write may have landed and then been built upon: look in the chain.
        latest = await load_latest(store)
        async for older in walk_snapshots(store, latest):
            if older.version == snapshot.version:
                if older.manifest_key == key:
                    return STALE_ETAG
                break
    # Definite: the pointer holds another commit at or after our version, so our
    # conditional write can never land; our snapshot is garbage, delete it now.
    try:
        await store.delete(key)
    except StoreError:
        pass  # left for vacuum
    raise CommitConflict(
        f"pointer moved to version {current} while committing version {snapshot.version}",
        current_version=current,
        orphan_key=key,
    )


async def delete_uncommitted(store: ObjectStore, changes: Changes) -> int:
    """Delete the data and ledger files ``changes`` added. Call only after a definite
    failure (`CommitConflict`, `OwnerLost`, `RollupInvariantError`), never after
    `OutcomeUnknown`, and only for files the retry will not reuse. Best effort: returns
    how many deletes succeeded; the rest are orphans for vacuum."""
    deleted = 0
    for key in [*(f.path for f in changes.added_files), *changes.added_ledger_files]:
        try:
            await store.delete(key)
            deleted += 1
        except StoreError:
            continue
    return deleted
