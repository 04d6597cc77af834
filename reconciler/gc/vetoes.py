"""Step 4 of a GC run: vetoes that have done their work (PROTOCOL §3.5, Vetoes).

A veto older than the grace is removed, together with its mark, once a completed listing
audit started after veto + grace. A veto protects a collector request that found the
blob; after the grace that request has landed its record or never will, and that audit
cataloged it: its orphan file decides afresh whether the blob is referenced, gone (never
marked again) or still an orphan (marked from scratch). A mark that is ``deleting`` or
unreadable is left to the stale-deletion pass first. The veto goes last: a crash in
between leaves a veto without a mark (cleared next time), never a mark whose veto is gone.
"""

from __future__ import annotations

import structlog

from protocol import keys, records
from reconciler.gc.work import GcWork
from store.base import ObjectInfo

log = structlog.get_logger("reconciler.gc")


async def clear_settled_vetoes(work: GcWork, audit: records.AuditRecord | None) -> None:
    if not work.vetoes:
        return  # the run's listing found none: nothing to read
    now = work.clock.now_ns()
    audit_started = audit.started_at_unix_ns if audit is not None else None
    cleared = 0
    async for info in work.store.list(keys.GC_VETOES_PREFIX):
        if info.last_modified_ns + work.policy.grace_ns > now:
            continue
        try:
            sha = keys.parse_gc_veto_key(info.key)
        except keys.KeyFormatError:
            log.warning("gc_veto_key_ignored", key=info.key)
            continue
        done = await work.per_item("veto", info.key, _clear_veto(work, sha, info, audit_started))
        cleared += bool(done)
    if cleared:
        log.info("gc_vetoes_cleared", count=cleared)


async def _clear_veto(work: GcWork, sha: str, veto: ObjectInfo, audit_started: int | None) -> bool:
    if audit_started is None or audit_started <= veto.last_modified_ns + work.policy.grace_ns:
        return False  # the request it protects may not be cataloged yet
    mark_key = keys.gc_mark_key(sha)
    mark, mark_etag = await work.read_mark(mark_key)
    if mark_etag is not None and (mark is None or mark.state == "deleting"):
        return False  # deleting or unreadable: the stale-deletion pass resolves it first
    await work.fence()
    if mark is not None:
        await work.delete_mark_if_unchanged(mark_key, mark_etag)
    await work.delete_store.delete(veto.key)
    return True
