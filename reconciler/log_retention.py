"""Deleting consumed index log segments (PROTOCOL §3.7, §3.9: the log does not grow without
bound), the ``catalog-created`` entries no rule reads any more (`trim_catalog_created`),
and version-registry entries of processes gone for longer than the log's retention
(`sweep_version_registry`).

A segment is deleted once all of these hold:

- it is older than ``reconciler.segment_retention_s`` in store time (LastModified, lower
  bound: an object never looks older than it is). The retention is at least the GC's
  retry horizon plus a day (blob rows nominate orphans until then), the steady pass's
  lookback and the live query's window (the designated query collector follows the log),
  checked when settings load;
- its name time (cut time) lies before the steady pass's position minus its lookback: the pass has
  consumed it, or will never list it again (a segment that came later still is the audit's
  to find);
- a completed *listing* audit started after it was written (its LastModified): every
  record its rows name existed then, so that audit catalogued it, and every blob it named
  was listed and joined (the orphan file).

Segment names start with their cut time, so the oldest segments come first in a
listing: each run lists from the start of ``index/v1/log/`` and stops at the first segment
too young to go. Since everything before it was deleted by earlier runs, a run lists the
deletable segments plus one page, never the retained history again and again. Deletes
run ``reconciler.concurrency`` at a time, after a fence check; each is a plain DELETE of
an immutable object nobody writes again (repeating one is harmless).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from index.versions import ENTRY_TTL_S
from protocol import keys
from protocol.clock import Clock
from reconciler.context import ReconcilerContext
from reconciler.steady import SteadyResult, read_checkpoint
from store.errors import NotFound, StoreError

from .gc.catalog_since import trim_unneeded_entries
from .gc.run import latest_listing_audit

NS_PER_S = 1_000_000_000
MAX_PER_RUN = 100_000


@dataclass
class LogRetentionResult:
    deleted: int = 0
    failed: int = 0
    oldest_kept: str | None = None


async def delete_consumed_segments(
    ctx: ReconcilerContext, *, log_through_ns: int, audit_started_ns: int | None
) -> LogRetentionResult:
    """Delete the segments PROTOCOL §3.7 lets go (module docstring). ``log_through_ns``: the
    steady pass's position; ``audit_started_ns``: the start of the latest completed listing
    audit (None: nothing may go yet)."""
    result = LogRetentionResult()
    if audit_started_ns is None or not log_through_ns:
        return result
    settings = ctx.settings.reconciler
    now_ns = ctx.clock.now_ns()
    old_before = now_ns - int(settings.segment_retention_s * NS_PER_S)
    consumed_before = log_through_ns - int(settings.lookback_s * NS_PER_S)
    doomed: list[str] = []
    async for info in ctx.store.list(keys.INDEX_LOG_PREFIX):
        try:
            name = keys.parse_index_log_segment_key(info.key)
        except keys.KeyFormatError:
            continue  # not a segment: never ours to delete
        if name.time_ns >= consumed_before or name.time_ns >= old_before:
            result.oldest_kept = info.key
            break  # names sort by cut time: every later segment is younger still
        if info.last_modified_ns >= min(old_before, audit_started_ns):
            continue  # written late (a straggler): kept until an audit and the age pass it
        doomed.append(info.key)
        if len(doomed) >= MAX_PER_RUN:
            break
    if not doomed:
        return result
    await ctx.check_fence()
    result.deleted, result.failed = await _delete_all(ctx, doomed, "log_segment_delete_failed")
    ctx.metrics.log_segments_deleted.inc(result.deleted)
    if result.deleted:
        ctx.log.info("log_segments_deleted", deleted=result.deleted, failed=result.failed)
    return result


async def sweep_log(ctx: ReconcilerContext, steady: SteadyResult | None) -> LogRetentionResult:
    """Delete consumed segments (`reconciler.log_retention`): one short LIST a sweep."""
    checkpoint = steady.checkpoint if steady is not None else None
    if checkpoint is None:
        checkpoint = await read_checkpoint(ctx.store)
    audit = await latest_listing_audit(ctx.store)
    return await delete_consumed_segments(
        ctx,
        log_through_ns=checkpoint.log_through_ns if checkpoint else 0,
        audit_started_ns=audit.started_at_unix_ns if audit else None,
    )


async def trim_catalog_created(ctx: ReconcilerContext) -> int:
    """The lease holder's trim of the ``catalog-created`` entries no rule reads any more
    (PROTOCOL §3.5 rule 2, `reconciler.gc.catalog_since.trim_unneeded_entries`): without
    it, entries would pile up forever while the GC is disabled. Returns how many went."""
    position, trimmed = await trim_unneeded_entries(
        ctx.store, fence=ctx.check_fence, concurrency=ctx.settings.reconciler.concurrency
    )
    if trimmed:
        ctx.log.info("catalog_created_trimmed", entries=trimmed, before=position)
    return trimmed


async def sweep_version_registry(ctx: ReconcilerContext) -> int:
    """Delete the version-registry entries (PROTOCOL §3.10 "Writing") not rewritten for
    ``reconciler.segment_retention_s`` plus their TTL (LastModified, store time): each is
    expired, and every segment its writer cut lies past the retention, so neither of
    ``enable-bundles``' checks reads it any more ((a) reads unexpired entries, (b) the
    writers of segments within the retention). Without this, every collector start would
    leave one entry for ever. One LIST a sweep (hourly, `Housekeeping`; live processes plus
    the recently gone: about a page); a DELETE per entry that goes. A process that
    rewrites its entry after the LIST loses it until its next heartbeat a minute later,
    while it is not expired anyway: (a) skips it, and (b) then refuses, the safe way.
    Returns how many went."""
    keep_after = ctx.clock.now_ns() - int(
        (ctx.settings.reconciler.segment_retention_s + ENTRY_TTL_S) * NS_PER_S
    )
    doomed = []
    async for info in ctx.store.list(keys.INDEX_VERSIONS_PREFIX):
        try:
            keys.parse_version_entry_key(info.key)
        except keys.KeyFormatError:
            continue  # not an entry: never ours to delete
        if info.last_modified_ns < keep_after:
            doomed.append(info.key)
    if not doomed:
        return 0
    await ctx.check_fence()
    deleted, failed = await _delete_all(ctx, doomed, "version_entry_delete_failed")
    ctx.log.info("version_entries_deleted", deleted=deleted, failed=failed)
    return deleted


async def _delete_all(
    ctx: ReconcilerContext, doomed: list[str], failure_event: str
) -> tuple[int, int]:
    """Plain DELETEs of objects nobody writes again (repeating one is harmless; one already
    gone counts as deleted), ``reconciler.concurrency`` at a time. A failure is logged as
    ``failure_event`` and left to the next run. Returns (deleted, failed)."""
    limit = asyncio.Semaphore(ctx.settings.reconciler.concurrency)

    async def delete(key: str) -> bool:
        async with limit:
            try:
                await ctx.store.delete(key)
            except NotFound:
                pass
            except StoreError as exc:
                ctx.log.warning(failure_event, key=key, error=str(exc))
                return False
            return True

    deleted = sum(await asyncio.gather(*(delete(key) for key in doomed)))
    return deleted, len(doomed) - deleted


REGISTRY_SWEEP_INTERVAL_S = 3600.0
Stage = tuple[str, Callable[[ReconcilerContext], Awaitable[int]]]


class Housekeeping:
    """The daemon's housekeeping stages after `sweep_log`, by stage name (each isolated):
    the ``catalog-created`` trim at every sweep; the version-registry sweep once an hour,
    the first an hour after the daemon starts (entries gone for days can wait an hour)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._registry_due_at = clock.monotonic() + REGISTRY_SWEEP_INTERVAL_S

    def stages(self) -> list[Stage]:
        due: list[Stage] = [("catalog_created", trim_catalog_created)]
        if self._clock.monotonic() >= self._registry_due_at:
            self._registry_due_at = self._clock.monotonic() + REGISTRY_SWEEP_INTERVAL_S
            due.append(("version_registry", sweep_version_registry))
        return due
