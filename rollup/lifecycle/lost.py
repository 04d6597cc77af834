"""``lm-rollup acknowledge-lost``: record an accepted batch whose raw blob is gone or
corrupt as *lost* in the rollup ledger (issue 24 item 13; PROTOCOL §4.1's per-hour
parts of the ledger, next to ``late_excluded``).

Why: the rollup can never include a batch whose blob is missing or does not read as the
batch (`rollup.table.batch_frames.check_frame`: ``missing-blob``, ``corrupt-blob``); it stays
pending, so its accepted hour's ledger never matches the catalog, and everything that
waits for that — ``sealed_through_ns`` of ``/v1/query``, raw retention, ``verify`` — stops
at that hour for ever. An operator who has given up on the blob (no backup to restore)
acknowledges the loss, with who and why.

`acknowledge_lost` checks, and refuses with `NotLost` naming the problem otherwise:
1. the key is an accepted manifest that exists (either agent key form, PROTOCOL §3);
2. its batch is the one the catalog hour counts (one per ``manifest_id``, read out of
   core: `index.catalog_tables.read_hour_totals`): the ledger must match the catalog, so
   an uncataloged batch cannot be acknowledged;
3. the blob really is lost: absent (``missing-blob``), or present but failing its hash,
   decode or identity check (``corrupt-blob``), or a bundled frame whose range and bundle
   index cannot serve it (``bad-range``, PROTOCOL §3.10), judged exactly as a rollup run
   judges it (`index.raw_reads.read_frame`, then `check_frame`);
4. the latest snapshot's ledger does not hold the batch yet.

Then it writes a one-row ledger file for the batch's accepted hour and commits it as a
`LostBatch` (part of the commit's ledger delta: ``ledger.hours`` counts it, so catalog =
included + late_excluded + lost, and the planner never plans it again), without the
owner lease like ``delete`` (the pointer CAS serializes; a run that planned the batch
loses its CAS and re-plans without it), or under it before the first commit. A lost race
is retried on the new snapshot, bounded, after checking step 4 again. Finally the
problem records for the blob are removed (a ``missing-blob`` audit finding is not
recorded again for an acknowledged batch: `rollup.read.lost.acknowledged_shas`).

Cost: a few GETs (the manifest, the catalog hour's files, the blob, the snapshot and the
hour's ledger files), one ledger PUT and a commit (2 PUTs).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import structlog

from index.catalog_tables import read_hour_totals
from index.raw_reads import BadRange, RawRef, read_frame
from protocol import keys
from protocol.clock import Clock
from protocol.records import AcceptedManifest, RecordError
from rollup.table.batch_frames import MAX_RAW_BYTES, BadFrame, check_frame
from rollup.table.commit import (
    CommitConflict,
    LoadedSnapshot,
    commit,
    delete_uncommitted,
    load_latest,
)
from rollup.table.ledger import LedgerRow, included_manifest_ids, write_ledger_files
from rollup.table.manifest import Changes, LostBatch, format_created_at
from rollup.table.manifest_ledger import LOST_PROBLEMS
from rollup.table.owner import OwnerLease
from store.base import ObjectStore
from store.errors import NotFound, StoreConfigError, StoreError
from store.retry import Backoff
from store.time import store_clock

log = structlog.get_logger(__name__)
MAX_ATTEMPTS = 6
_BACKOFF = Backoff(attempts=MAX_ATTEMPTS, base_s=0.05, cap_s=2.0)


class NotLost(ValueError):
    """The batch cannot be acknowledged as lost; the message says why (nothing written)."""


@dataclass(frozen=True, slots=True)
class Acknowledged:
    lost: LostBatch
    version: int


async def _cataloged_batch(store: ObjectStore, manifest_key: str) -> AcceptedManifest:
    """Steps 1-2 of the module doc: the batch, or `NotLost`."""
    try:
        keys.parse_accepted_manifest_key(manifest_key)
        body, _ = await store.get(manifest_key)
        manifest = AcceptedManifest.from_json(body, reads_bundles=True)
    except keys.KeyFormatError as exc:
        raise NotLost(f"{manifest_key!r} is not an accepted manifest key: {exc}") from None
    except NotFound:
        raise NotLost(f"no accepted manifest at {manifest_key}") from None
    except RecordError as exc:
        raise NotLost(f"{manifest_key} is not a readable accepted manifest: {exc}") from None
    if manifest_key not in (
        manifest.manifest_key,
        keys.legacy_accepted_manifest_key(manifest.identity),
    ):
        raise NotLost(f"{manifest_key} holds the manifest of another batch")
    manifest_id = manifest.identity.manifest_id
    if await _cataloged_as(store, manifest.accepted_hour, manifest_id) != (
        manifest.frame_sha256,
        manifest.record_count,
    ):
        raise NotLost(
            f"batch {manifest_id} is not in catalog hour {manifest.accepted_hour.iso} as this "
            "manifest (the reconciler catalogs it first; the ledger must match the catalog)"
        )
    return manifest


async def _cataloged_as(
    store: ObjectStore, hour: keys.UtcHour, manifest_id: str
) -> tuple[str, int] | None:
    """``(frame_sha256, record_count)`` of the batch the catalog hour counts for
    ``manifest_id`` (`index.catalog_tables.read_hour_totals`: out of core, the hour's
    batches written locally and filtered there), None when it counts none."""
    with tempfile.TemporaryDirectory(prefix="lm-rollup-lost-") as tmp:
        path = str(Path(tmp, "batches.parquet"))
        await read_hour_totals(store, hour, batches_to=path)
        found = await asyncio.to_thread(
            pq.read_table,
            path,
            columns=["frame_sha256", "record_count"],
            filters=[("manifest_id", "==", manifest_id)],
        )
    if found.num_rows == 0:
        return None
    return str(found["frame_sha256"][0]), int(found["record_count"][0].as_py())


async def _blob_problem(store: ObjectStore, manifest: AcceptedManifest) -> BadFrame:
    """Step 3 of the module doc: why the batch's blob cannot be read, or `NotLost`."""
    manifest_id = manifest.identity.manifest_id
    ref = RawRef.of_manifest(manifest)
    try:
        read = await read_frame(store, ref, max_frame_bytes=MAX_RAW_BYTES)
    except NotFound:
        read = None
    if isinstance(read, BadRange):
        return BadFrame(read.kind, manifest.raw_blob_key, read.detail)
    data: bytes | None = read
    try:
        check_frame(
            data,
            blob_key=manifest.raw_blob_key,
            frame_sha256=manifest.frame_sha256,
            manifest_id=manifest_id,
            max_raw_bytes=MAX_RAW_BYTES,
        )
    except BadFrame as bad:
        return bad
    raise NotLost(
        f"{manifest.raw_blob_key} is present and reads as batch {manifest_id}: it is not "
        "lost (the next rollup run includes it)"
    )


async def check_lost(store: ObjectStore, manifest_key: str) -> tuple[AcceptedManifest, BadFrame]:
    """Every check of the module doc (steps 1-4) against the latest snapshot: the batch
    and why its blob is lost, or `NotLost` (``--dry-run`` stops here)."""
    manifest = await _cataloged_batch(store, manifest_key)
    await _not_included(store, await load_latest(store), manifest)
    return manifest, await _blob_problem(store, manifest)


async def acknowledge_lost(
    store: ObjectStore,
    manifest_key: str,
    *,
    reason: str,
    by: str,
    clock: Clock,
    owner_lease_ttl_s: float = 300.0,
    rng: random.Random | None = None,
) -> Acknowledged:
    """Record the batch as lost (see the module doc). Raises `NotLost` (nothing written),
    `LeaseHeld` (before the first commit, while a run holds the owner lease),
    `CommitConflict` when every attempt lost the pointer race, store errors."""
    manifest, bad = await check_lost(store, manifest_key)
    now_ns = store_clock(store, clock).now_ns()
    lost = LostBatch(
        manifest_id=manifest.identity.manifest_id,
        frame_sha256=manifest.frame_sha256,
        record_count=manifest.record_count,
        accepted_hour=manifest.accepted_hour.iso,
        manifest_key=manifest_key,
        problem=bad.kind,
        detail=bad.detail,
        acknowledged_by=by,
        reason=reason,
        acknowledged_at=format_created_at(now_ns),
    )
    delays = _BACKOFF.delays(rng or random.Random())
    while True:
        base = await load_latest(store)
        await _not_included(store, base, manifest)
        ledger = await write_ledger_files(
            store,
            [LedgerRow(lost.manifest_id, lost.frame_sha256, lost.record_count, lost.accepted_hour)],
        )
        changes = Changes(
            added_ledger_files=ledger.added_ledger_files,
            ledger_delta=ledger.ledger_delta,
            added_lost=(lost,),
        )
        try:
            committed = await _commit(store, base, changes, clock, owner_lease_ttl_s)
        except CommitConflict:
            await delete_uncommitted(store, changes)
            delay = next(delays, None)
            if delay is None:
                raise
            await clock.sleep(delay)
            continue
        break
    await _settle_problems(store, manifest.raw_blob_key)
    log.info("rollup_lost_acknowledged", version=committed.snapshot.version, **lost.to_dict())
    recorded = next(b for b in committed.snapshot.ledger_lost if b.manifest_id == lost.manifest_id)
    return Acknowledged(recorded, committed.snapshot.version)


async def _not_included(
    store: ObjectStore, base: LoadedSnapshot | None, manifest: AcceptedManifest
) -> None:
    if base is None:
        return
    hour, manifest_id = manifest.accepted_hour.iso, manifest.identity.manifest_id
    if manifest_id in (await included_manifest_ids(store, base.snapshot, {hour}))[hour]:
        already = any(b.manifest_id == manifest_id for b in base.snapshot.ledger_lost)
        raise NotLost(
            f"batch {manifest_id} is already in the ledger of version "
            f"{base.snapshot.version}" + (" (acknowledged as lost)" if already else "")
        )


async def _commit(
    store: ObjectStore,
    base: LoadedSnapshot | None,
    changes: Changes,
    clock: Clock,
    ttl_s: float,
) -> LoadedSnapshot:
    if base is not None:
        return await commit(store, base=base, changes=changes, owner=None, clock=clock)
    # Before the first commit there is no base to commit on without the lease.
    owner = await OwnerLease.acquire(store, f"lm-rollup-lost-{uuid.uuid4()}", ttl_s, clock)
    try:
        return await commit(store, base=None, changes=changes, owner=owner, clock=clock)
    finally:
        await owner.release()


async def _settle_problems(store: ObjectStore, blob_key: str) -> None:
    """Remove the problem records the rollup or an audit wrote for the blob: the loss is
    acknowledged. Best effort (the rollup's role may not delete under ``reconciler/``):
    the next audit removes a ``missing-blob`` record left behind, as it no longer finds
    the blob missing."""
    for kind in LOST_PROBLEMS:
        try:
            await store.delete(keys.problem_key(kind, blob_key))
        except NotFound:
            continue
        except (StoreError, StoreConfigError) as exc:
            log.warning("rollup_lost_problem_left", kind=kind, blob=blob_key, error=str(exc))
