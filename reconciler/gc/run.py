"""The reconciler's GC entry points: `run_gc` (raw retention's step, then one
`reconciler.gc.GarbageCollector` run with the reconciler's store, clock, lease fence,
audits and metrics), `settle_stale_deletions` (what a disabled GC still does), and the
proofs the GC reads from the store (`latest_listing_audit`, `unresolved_manifest_problems`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import structlog

from index.rows import IndexFileError
from protocol import keys, records
from protocol.bundle import max_bundle_bytes
from reconciler.gc.collector import GarbageCollector
from reconciler.gc.policy import GcOutcome, GcPolicy, GcRefused
from reconciler.gc.raw_retention import RawRetentionAdvance
from rollup.table.manifest import RollupManifestError
from store.base import ObjectStore
from store.errors import StoreError
from store.open import open_store
from store.time import store_clock

if TYPE_CHECKING:
    from config import StoreSettings
    from reconciler.context import ReconcilerContext

log = structlog.get_logger("reconciler.gc")


async def run_gc(ctx: ReconcilerContext, *, dry_run: bool) -> GcOutcome:
    """One GC run with the reconciler's store, clock, lease fence, audits and metrics;
    with ``retention.raw_days``, raw retention retires what it can first."""
    await advance_raw_retention(ctx, dry_run=dry_run)
    async with _gc_role_store(ctx) as delete_store:
        return await _collector(ctx, delete_store).run(dry_run=dry_run)


async def advance_raw_retention(ctx: ReconcilerContext, *, dry_run: bool) -> None:
    """Retire the accepted hours raw retention may (`reconciler.gc.raw_retention`). A failure
    is logged and the GC goes on: retiring later only keeps blobs longer."""
    raw_days = ctx.settings.retention.raw_days
    if raw_days is None:
        return
    memory = ctx.gc_memory
    if memory.raw_retention is None or memory.raw_retention.raw_days != raw_days:
        memory.raw_retention = RawRetentionAdvance(
            raw_days=raw_days, settle_margin_s=ctx.settings.settle_margin_s()
        )
    try:
        audit = await latest_listing_audit(ctx.store)
        state = await memory.raw_retention.run(
            ctx.store,
            now_ns=store_clock(ctx.store, ctx.clock).now_ns(),
            audit_started_ns=audit.started_at_unix_ns if audit is not None else None,
            fence=ctx.check_fence,
            dry_run=dry_run,
        )
        if not dry_run:  # a dry run's state is what would be written
            ctx.metrics.observe_raw_retention(state)
    except (StoreError, records.RecordError, RollupManifestError, IndexFileError) as exc:
        log.warning("raw_retention_failed", error=str(exc))


async def settle_stale_deletions(ctx: ReconcilerContext) -> None:
    """What a disabled GC still does: resolve stale ``deleting`` marks (deletes no blob;
    the marks it removes are deleted through the GC role, like every GC delete)."""
    async with _gc_role_store(ctx) as delete_store:
        await _collector(ctx, delete_store).settle_stale_deletions()


def _collector(ctx: ReconcilerContext, delete_store: ObjectStore | None) -> GarbageCollector:
    settings = ctx.settings
    names = {
        "candidates": "candidates",
        "marks": "marked",
        "vetoes": "vetoed",
        "deletions": "deleted",
    }

    def observe(event: str, count: int) -> None:
        if event.startswith("stalled:"):
            ctx.metrics.gc_stalled.labels(event.removeprefix("stalled:")).inc(count)
        elif event in names:
            ctx.metrics.record_gc(**{names[event]: count})

    if problem := settings.gc_lease_problem():
        raise GcRefused(problem)  # no deletion could ever be sent: say so, delete nothing
    network_s = settings.store.connect_timeout_s + settings.store.read_timeout_s
    return GarbageCollector(
        store=ctx.store,
        clock=ctx.clock,
        policy=GcPolicy(
            retry_horizon_s=settings.gc.retry_horizon_s,
            mark_grace_s=settings.gc.mark_grace_s,
            max_delete_fraction=settings.gc.max_delete_fraction,
            # A signed DELETE lands within its expiry (plus skew) of being signed, and the
            # answer may take a connect plus a read timeout: twice, for margin.
            settle_s=settings.gc.delete_expiry_s + settings.store.max_clock_skew_s + 2 * network_s,
            delete_expiry_s=settings.gc.delete_expiry_s,
            max_clock_skew_s=settings.store.max_clock_skew_s,
            # The DELETE is a few hundred bytes: once the connection is up (connect
            # timeout) it reaches the store, which judges its expiry on arrival.
            max_network_delay_s=settings.store.connect_timeout_s,
            max_frame_bytes=settings.ingest.max_frame_bytes,
            # Whether or not this store writes bundles yet: any collector may have.
            max_bundle_bytes=max_bundle_bytes(
                bundle_max_bytes=settings.ingest.bundle_max_bytes,
                max_frame_bytes=settings.ingest.max_frame_bytes,
                bundle_max_frames=settings.ingest.bundle_max_frames,
            ),
            concurrency=settings.gc.concurrency,
            inventory_lag_s=settings.gc.inventory_lag_s if settings.gc.inventory_proves else None,
        ),
        latest_audit=lambda: latest_listing_audit(
            ctx.store, inventory_proves=settings.gc.inventory_proves
        ),
        fence=ctx.check_fence,
        lease=ctx.fence.term,
        delete_store=delete_store,
        observe=observe,
        deletion_blocker=lambda: unresolved_manifest_problems(ctx.store),
        suspects=ctx.gc_suspects,
        recently_referenced=ctx.recently_referenced,
        audits_marked=ctx.gc_memory.audits_marked,
        rng=ctx.rng,
    )


@contextlib.asynccontextmanager
async def _gc_role_store(ctx: ReconcilerContext) -> AsyncIterator[ObjectStore | None]:
    """The store every GC delete goes through (blobs, marks, vetoes): the context's
    ``gc_store`` if given; else, with ``store.gc_credentials_profile``, that AWS profile
    (the GC role, opened for this run and closed after it), so the reconciler's everyday
    credentials need no s3:DeleteObject under ``raw-blobs/v1/`` or ``gc/v1/``
    (``deploy/bucket-policy``); else None (``ctx.store`` deletes)."""
    if ctx.gc_store is not None:
        yield ctx.gc_store
        return
    store_settings: StoreSettings = ctx.settings.store
    profile = store_settings.gc_credentials_profile
    if profile is None or not store_settings.url.startswith("s3://"):
        yield None
        return
    opened = open_store(
        store_settings.url,
        profile=profile,
        endpoint_url=store_settings.endpoint_url,
        region=store_settings.region,
        connect_timeout_s=store_settings.connect_timeout_s,
        read_timeout_s=store_settings.read_timeout_s,
    )
    try:
        yield opened
    finally:
        await opened.close()


async def latest_listing_audit(
    store: ObjectStore, *, inventory_proves: bool = False
) -> records.AuditRecord | None:
    """The newest completed catalog audit that *listed* the store. An S3 Inventory report
    is not an exact snapshot (objects written shortly before it may be missing), so it
    proves nothing about references for GC unless ``inventory_proves`` (``gc.inventory_
    proves``: then only for blobs old enough, `GcPolicy.audit_horizon_ns`); an audit of the
    previous version (no ``catalog``) wrote no orphan file."""
    from index.audits import iter_audits_newest_first

    sources = ("listing", "inventory") if inventory_proves else ("listing",)
    async for audit in iter_audits_newest_first(store):
        if audit.status == "completed" and audit.source in sources and audit.catalog:
            return audit
    return None


BLOCKING_PROBLEMS = (
    "unparseable-manifest",
    "unparseable-quarantine",
    "catalog-mismatch",
    "phantom-row",
)
"""Problem kinds while any of which the GC deletes nothing (PROTOCOL §3.5 rule 5): a record
nobody can read may reference any blob, and a catalog that disagrees with the store proves
nothing."""


async def unresolved_manifest_problems(store: ObjectStore) -> str | None:
    """Why the GC may delete nothing now (a `BLOCKING_PROBLEMS` record exists), or None."""
    for kind in BLOCKING_PROBLEMS:
        prefix = f"{keys.RECONCILER_PROBLEMS_PREFIX}{kind}/"
        async for info in store.list(prefix):
            return (
                f"{kind} problems are recorded under {prefix} (e.g. {info.key}); "
                "resolve them before GC deletes anything"
            )
    return None
