"""Audit records (``reconciler/v1/audits/<start>-<id>.json``): reading, creating, saving.

Keys sort by ``started_at_unix_ns``, so the newest audit is the last key. Records written
by the version before the index (``catalog = false``: audits of per-object derived
entries) are read but never resumed or trusted (`latest_completed_audit`). A record is
created (If-None-Match) when an audit starts and replaced by compare-and-swap as it goes;
the swap refuses a record whose ``owner_epoch`` is newer than ours (a newer leader took
the audit over: we are stale) or that is already ``completed`` (completed is final).
"""

from __future__ import annotations

from index.audits import audit_keys, iter_audits_newest_first
from protocol import keys
from protocol.records import AuditRecord
from reconciler import store_calls
from reconciler.audit.blob_verify import VERIFY_CURSOR
from reconciler.audit.inventory import InventorySource
from reconciler.audit.ranges import PREVIOUS_KEYS_CURSOR, previous_keys_cursor
from reconciler.audit.remark import remark_since
from reconciler.bundle_verify import BUNDLE_VERIFY_CURSOR
from reconciler.context import ReconcilerContext
from store.base import ObjectStore
from store.cas import update_object
from store.lease import LeaseLost

INVENTORY_CURSOR = "inventory:manifest"
"""Cursor key naming the inventory report an inventory audit reads (a resumed inventory
audit must read the same report)."""


class AuditRecordConflict(RuntimeError):
    """The stored audit record cannot be replaced (it is already completed). A bug or an
    operator's edit: stop and look."""


async def delete_under(store: ObjectStore, prefix: str) -> int:
    """Delete every object under ``prefix``; returns how many."""
    doomed = [info.key async for info in store.list(prefix)]
    for key in doomed:
        await store.delete(key)
    return len(doomed)


async def latest_audit(store: ObjectStore, *, catalog_only: bool = False) -> AuditRecord | None:
    """The most recently started audit, in whatever state; with ``catalog_only``, the most
    recent audit of the index (``catalog = true``)."""
    async for record in iter_audits_newest_first(store):
        if record.catalog or not catalog_only:
            return record
    return None


async def latest_completed_audit(store: ObjectStore) -> AuditRecord | None:
    """The completed audit of the index (``catalog = true``) that started last (PROTOCOL
    §3.5 rule 5 asks for "an audit that started after X"), or ``None``. A resumed audit
    keeps its original start. Audits written before the index never count: they did not
    catalog anything, list the raw blobs or write an orphan file, so a version-1 store's
    first audit under this version is due at once (it is the migration, PROTOCOL §3)."""
    async for record in iter_audits_newest_first(store):
        if record.status == "completed" and record.catalog:
            return record
    return None


async def resume_or_start(
    ctx: ReconcilerContext, inventory: InventorySource | None
) -> tuple[AuditRecord, bool]:
    """The newest audit of the index (``catalog = true``: never one a version-1 reconciler
    left running, whose finished groups were never cataloged) to resume if it is still
    ``running``, of the same source (and, for inventories, the same report), and its pin
    has not lapsed (PROTOCOL §3.7: then it starts again, with a new start time); else a
    new audit's record, created. Returns (record, resumed).

    First, when the newest audit was left ``running`` (killed, stopped, or failed), the
    markers its runs may have left unwritten are created (`remark_since`: its own
    files), whether it is resumed or not: a new audit joins that run's catalog files
    as cataloged too. Done before a new record exists, so a kill meanwhile leaves the
    same audit newest and the next call does it again."""
    await ctx.check_fence()
    source = "listing" if inventory is None else "inventory"
    report = await inventory.report() if inventory is not None else None
    latest = await latest_audit(ctx.store, catalog_only=True)
    if latest is not None and latest.status == "running" and latest.catalog_created_from:
        await remark_since(ctx, latest)  # a kill between file and marker
    if (
        latest is not None
        and latest.status == "running"
        and latest.source == source
        and (report is None or latest.cursors.get(INVENTORY_CURSOR) == report.manifest_key)
    ):
        expires = latest.pin_expires_at_unix_ns
        if expires is None or expires > ctx.clock.now_ns():
            ctx.log.info("audit_resumed", audit_id=latest.audit_id, cursors=len(latest.cursors))
            return latest, True
        ctx.log.warning("audit_restarted_pin_lapsed", audit_id=latest.audit_id)
    cursors = {INVENTORY_CURSOR: report.manifest_key} if report else {}
    for cursor in (VERIFY_CURSOR, BUNDLE_VERIFY_CURSOR):
        if latest is not None and cursor in latest.cursors:
            cursors[cursor] = latest.cursors[cursor]  # verification goes on
    # Before the start time is taken: every catalog file created after the start is named
    # by an entry from here on (the GC's rule 2 reads them). Also for an inventory, whose
    # audit counts as started at the report's creation, before now: the catalog files
    # created between the report and this position are among those the audit reads (it
    # pins and joins every catalog file there is when it starts), so rule 2 still sees
    # every row — needed only where ``gc.inventory_proves`` lets such an audit prove.
    position = ctx.catalog_writer.position()
    # PROTOCOL §3.7: the first audit of the rank era (no completed audit recorded whether it
    # reread) reads back every key with rows of more than one rank.
    completed = await latest_completed_audit(ctx.store)
    reread = completed is None or completed.reread_ranks is None
    if completed is not None and completed.keys_listed:  # sizes the listing's plan
        cursors[PREVIOUS_KEYS_CURSOR] = previous_keys_cursor(completed.keys_listed)
    record = AuditRecord(
        audit_id=f"{ctx.rng.getrandbits(64):016x}",
        # An inventory shows the bucket as of its creation: the audit counts from then.
        started_at_unix_ns=report.created_at_unix_ns if report else ctx.clock.now_ns(),
        ran_from_unix_ns=ctx.clock.now_ns(),
        catalog_created_from=position,
        source=source,
        owner_epoch=ctx.epoch,
        cursors=cursors,
        catalog=True,
        reread_ranks=reread,
        # Pins every catalog file from the start (PROTOCOL §3.7); `reconciler.audit.run`
        # narrows and renews it.
        pin_expires_at_unix_ns=ctx.clock.now_ns() + int(ctx.settings.reconciler.audit_pin_s * 1e9),
    )
    await create_audit(ctx, record)
    ctx.log.info("audit_started", audit_id=record.audit_id, source=source)
    return record, False


async def live_pin(store: ObjectStore, now_ns: int) -> int | None:
    """The catalog files a running audit pinned (PROTOCOL §3.7), read from the newest audit
    record, so it holds across processes: every file last modified at or before the
    returned store time (the largest int64 while the audit still lists the catalog), or
    ``None`` when no audit runs or its pin lapsed (``now_ns``: store time)."""
    latest = await latest_audit(store, catalog_only=True)
    if latest is None or latest.status != "running":
        return None
    expires = latest.pin_expires_at_unix_ns
    if expires is None or expires <= now_ns:
        return None
    through = latest.pinned_through_unix_ns
    return through if through is not None else 2**63 - 1


def record_key(record: AuditRecord) -> str:
    return keys.audit_key(record.started_at_unix_ns, record.audit_id)


async def create_audit(ctx: ReconcilerContext, record: AuditRecord) -> None:
    await ctx.check_fence()
    created = await store_calls.create_if_absent(ctx, record_key(record), record.to_json())
    if created is store_calls.Created.EXISTED:
        raise AuditRecordConflict(f"audit record {record_key(record)!r} already exists")


async def save_audit(ctx: ReconcilerContext, record: AuditRecord) -> None:
    """Replace the stored record with ``record`` (CAS, fenced by ``owner_epoch``).

    Raises `LeaseLost`, `AuditRecordConflict`, store errors (`CasExhausted`, ...)."""
    epoch = ctx.epoch
    body = record.to_json()
    key = record_key(record)

    def mutate(current_body: bytes | None) -> bytes:
        if current_body is not None:
            current = AuditRecord.from_json(current_body)
            if current.owner_epoch > epoch:
                raise LeaseLost(
                    keys.RECONCILER_LEASE_KEY,
                    epoch,
                    f"audit {record.audit_id} was taken over under epoch {current.owner_epoch}",
                )
            if current.status == "completed" and current_body != body:
                raise AuditRecordConflict(f"audit record {key!r} is already completed")
        return body

    await ctx.check_fence()
    await update_object(ctx.store, key, mutate, backoff=ctx.backoff, rng=ctx.rng, clock=ctx.clock)


KEEP_AUDITS = 4
"""Audit records (and their orphan files) kept: finding the newest one is then one short
listing, however long the store has run (nothing re-lists history)."""


async def trim_old_audits(ctx: ReconcilerContext) -> int:
    """Delete all but the newest `KEEP_AUDITS` audit records, their orphan files and their
    folders (listing parts), oldest first; never the newest completed one. Returns how many records were deleted."""
    record_keys = await audit_keys(ctx.store)
    doomed = record_keys[: max(0, len(record_keys) - KEEP_AUDITS)]
    if not doomed:
        return 0
    newest_completed = await latest_completed_audit(ctx.store)
    keep = record_key(newest_completed) if newest_completed is not None else None
    await ctx.check_fence()
    deleted = 0
    for key in doomed:
        if key == keep:
            continue
        name = key.removeprefix(keys.RECONCILER_AUDITS_PREFIX).removesuffix(".json")
        started, audit_id = name.split("-", 1)
        await ctx.store.delete(keys.audit_orphans_key(int(started), audit_id))
        await delete_under(ctx.store, keys.audit_folder(int(started), audit_id))
        await ctx.store.delete(key)
        deleted += 1
    return deleted
