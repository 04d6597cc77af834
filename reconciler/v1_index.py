"""``lm-reconciler drop-v1-index``: delete a version-1 store's per-object index once migrated.

A store written before the index (PROTOCOL §3.7) holds per-object derived entries
(`keys.V1_INDEX_PREFIXES`: ``accepted-by-time/v1/``, ``accepted-by-blob/v1/``,
``raw-blobs-by-time/v1/``, ``quarantine-by-blob/v1/``), the old steady checkpoint
(`keys.RECONCILER_V1_CHECKPOINT_KEY`) and hour dirty markers
(`keys.is_v1_rollup_dirty_key`). The first completed audit of the index catalogs every
record (its promise: every record that existed at its start is in the catalog), and from
then on nothing of this version reads them: PROTOCOL §3.7 lets an operator command delete
them. `drop_v1_index` is that command.

It refuses (`V1DropRefused`) unless a completed audit of the index exists
(`latest_completed_audit`: ``catalog = true``). It runs under the reconciler lease, like
every one-shot command, so no reconciler runs while it deletes. Run it only once every
reconciler and collector runs this version: a version-1 reconciler's GC takes a missing
``accepted-by-blob`` entry for "unreferenced", so it must never run against a store whose
old index was dropped. Acceptance records, blobs, the catalog and every other object are
never touched: only keys under the old prefixes (and the two old kinds of state object)
are listed and deleted.

``dry_run`` lists and counts, deleting nothing. Cost: one LIST page per 1,000 objects and
one DELETE per object, ``reconciler.concurrency`` in flight, the fence checked before
each chunk. Interrupted, it is simply run again: what is left is deleted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from protocol import keys
from reconciler.audit.partitions import closing
from reconciler.audit.records import latest_completed_audit
from reconciler.context import ReconcilerContext
from store.errors import ConditionConflict, OutcomeUnknown, Unavailable

CHUNK = 1_000  # deletes between fence checks


class V1DropRefused(RuntimeError):
    """No completed audit of the index: the old index may still be all that names some
    records. Run ``lm-reconciler audit`` (or ``run --once``) first."""


@dataclass
class V1DropResult:
    dry_run: bool
    audit_id: str
    deleted: dict[str, int] = field(default_factory=dict)
    """Objects deleted (or, in a dry run, found) per prefix."""

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


async def drop_v1_index(ctx: ReconcilerContext, *, dry_run: bool) -> V1DropResult:
    """Delete the version-1 index (see the module docstring). Raises `V1DropRefused`,
    `LeaseLost`, and store errors left after bounded retries (run it again)."""
    audit = await latest_completed_audit(ctx.store)
    if audit is None:
        raise V1DropRefused(
            "no completed audit of the index yet: run `lm-reconciler audit` first, so that "
            "every record is in the catalog before the old index is deleted"
        )
    found: Counter[str] = Counter()
    targets = [(prefix, prefix) for prefix in keys.V1_INDEX_PREFIXES]
    targets.append((keys.ROLLUP_DIRTY_PREFIX, "v1 rollup dirty markers"))
    targets.append((keys.RECONCILER_V1_CHECKPOINT_KEY, keys.RECONCILER_V1_CHECKPOINT_KEY))
    for prefix, label in targets:
        chunk: list[str] = []
        async with closing(ctx.store.list(prefix)) as listing:
            async for info in listing:
                if not _is_v1_object(prefix, info.key):
                    continue
                chunk.append(info.key)
                found[label] += 1
                if len(chunk) >= CHUNK:
                    await _delete(ctx, chunk, dry_run)
                    chunk = []
        await _delete(ctx, chunk, dry_run)
    result = V1DropResult(dry_run=dry_run, audit_id=audit.audit_id, deleted=dict(found))
    ctx.log.info(
        "v1_index_dropped",
        dry_run=dry_run,
        audit_id=audit.audit_id,
        total=result.total,
        by_prefix=result.deleted,
    )
    return result


def _is_v1_object(prefix: str, key: str) -> bool:
    if prefix == keys.ROLLUP_DIRTY_PREFIX:
        return keys.is_v1_rollup_dirty_key(key)  # never the index's own work markers
    if prefix == keys.RECONCILER_V1_CHECKPOINT_KEY:
        return key == prefix
    return True


async def _delete(ctx: ReconcilerContext, chunk: list[str], dry_run: bool) -> None:
    if dry_run or not chunk:
        return
    await ctx.check_fence()
    limit = asyncio.Semaphore(ctx.reconciler_settings.concurrency)

    async def one(key: str) -> None:
        async with limit:
            await _delete_one(ctx, key)

    try:
        async with asyncio.TaskGroup() as group:
            for key in chunk:
                group.create_task(one(key))
    except BaseExceptionGroup as errors:
        raise errors.exceptions[0] from None  # the store error, as callers expect it


async def _delete_one(ctx: ReconcilerContext, key: str) -> None:
    delays = ctx.backoff.delays(ctx.rng)
    while True:
        try:
            await ctx.store.delete(key)
            return
        except (Unavailable, ConditionConflict, OutcomeUnknown):
            # Safe to repeat: deleting an absent key is no error, and nothing of this
            # version writes under these prefixes again.
            delay = next(delays, None)
            if delay is None:
                raise
            await ctx.clock.sleep(delay)
