"""Catalog compaction (PROTOCOL §3.7, §3.9): geometric levels within an hour, one final
merge when it settles, inputs deleted later.

The steady pass writes one catalog file per hour per chunk, and audits one per chunk that
found records missing, so an hour collects files (level 0). `CatalogCompactor` merges
them by levels: as soon as an hour holds `FANOUT` files of one level that this process
knows of, they merge into one file of the next level (`index.catalog_merge`: out of
core, in DuckDB, under a quarter of ``reconciler.audit_memory_limit_mb``, 256 MB by
default: compacting a 3.6M-row hour then peaks at ~0.8 GiB of RSS, bench/RESULTS.md; the
merged file is uploaded from its local copy, `ObjectStore.put_file`, never held in
memory), so no row is rewritten more than a few times however busy the hour (log_FANOUT of its files), and readers (the
rollup planner, the GC, the live query) open few files per hour. Once the hour is
*settled* (its end is older than the lookback: the log will add nothing more to it but
stragglers) every file of the hour — listed, so files this process did not write are
included — merges into one. Every merged file gets its own rollup work marker.

Inputs are deleted `reconciler.catalog_grace_s` (store time) after the merge — longer
than any reader's listing-to-read time, so a reader that listed an input either reads it
or, finding it gone, lists the hour again and finds the merged file — and only by the
names the merged file records (`index.catalog.delete_compacted_inputs`); never a file a
running audit pinned (PROTOCOL §3.7): none while an audit of this process runs
(``hold_deletes``), and none that the newest audit record's live pin covers
(`reconciler.audit.records.live_pin`: read from the store, so an audit of another process
or a crashed one counts until its pin lapses). An hour with a pinned input keeps waiting. Levels and hours
waiting for that deletion are kept in memory; after a restart an hour's files are
merged when it settles, and until then it is read from a few more files.
"""

from __future__ import annotations

from dataclasses import dataclass

from index.catalog import delete_compacted_inputs, list_hour_files
from index.catalog_local import MergeLimits
from index.catalog_merge import merge_files
from index.rows import IndexFileError
from protocol import keys
from reconciler.audit.records import live_pin
from reconciler.cataloger import Cataloger
from reconciler.context import ReconcilerContext
from reconciler.problems import ProblemBook
from store.base import ObjectInfo
from store.errors import NotFound, StoreError

FANOUT = 8  # files of one level that merge into one of the next
MAX_LEVELS = 8  # 8^8 level-0 files in one hour: more than any hour holds
NS_PER_S = 1_000_000_000


@dataclass
class CompactionResult:
    hours_compacted: int = 0
    files_merged: int = 0
    inputs_deleted: int = 0
    failed: int = 0


class CatalogCompactor:
    def __init__(self) -> None:
        self._levels: dict[keys.UtcHour, dict[str, int]] = {}  # hour -> file -> level
        self._merged_at: dict[keys.UtcHour, int] = {}  # hour -> store time of the merge

    def touched(self, hour: keys.UtcHour, catalog_key: str | None = None) -> None:
        """A catalog file of ``hour`` was written (level 0)."""
        files = self._levels.setdefault(hour, {})
        if catalog_key is not None:
            files[catalog_key] = 0

    @property
    def pending(self) -> int:
        return len(self._levels) + len(self._merged_at)

    async def run(
        self, ctx: ReconcilerContext, *, force: bool = False, hold_deletes: bool = False
    ) -> CompactionResult:
        """Merge full levels and settled hours; delete inputs past the grace.
        ``hold_deletes``: a running audit pinned the catalog files it reads, so no input is
        deleted now (they wait for a later run)."""
        result = CompactionResult()
        now = ctx.clock.now_ns()
        lookback_ns = int(ctx.settings.reconciler.lookback_s * NS_PER_S)
        grace_s = ctx.settings.reconciler.catalog_grace_s
        pinned: int | None = None
        due = [
            hour
            for hour, at in sorted(self._merged_at.items())
            if not hold_deletes and (force or now - at >= grace_s * NS_PER_S)
        ]
        if due:
            try:
                pinned = await live_pin(ctx.store, now)
            except StoreError as exc:
                ctx.log.warning("catalog_pin_read_failed", error=str(exc))
                due = []  # the audits' pins are unknown: delete nothing now
        for hour in due:
            try:
                await ctx.check_fence()
                result.inputs_deleted += await delete_compacted_inputs(
                    ctx.store,
                    hour,
                    store_now_ns=now,
                    grace_s=0 if force else grace_s,
                    pinned_through_ns=pinned,
                )
                if pinned is None:
                    del self._merged_at[hour]  # else pinned inputs wait for a later run
            except (StoreError, IndexFileError) as exc:
                result.failed += 1
                ctx.log.warning("catalog_input_delete_failed", hour=hour.iso, error=str(exc))
        cataloger = Cataloger(ctx, ProblemBook(ctx))
        limits = MergeLimits(
            memory_limit_mb=max(64, ctx.settings.reconciler.audit_memory_limit_mb // 4)
        )
        for hour in sorted(self._levels):
            settled = hour.next().start_ns + lookback_ns <= now
            try:
                if settled or force:
                    files = await list_hour_files(ctx.store, hour)
                    if len(files) >= 2:
                        level = 1 + max(self._levels[hour].values(), default=0)
                        await self._merge(ctx, cataloger, hour, files, level, limits, result)
                    del self._levels[hour]
                    continue
                for _cascade in range(MAX_LEVELS):  # a merge may fill the next level
                    full = self._full_levels(hour)
                    if not full:
                        break
                    for level, files in full:
                        await self._merge(ctx, cataloger, hour, files, level + 1, limits, result)
            except (StoreError, IndexFileError, NotFound) as exc:
                result.failed += 1
                ctx.log.warning("catalog_compaction_failed", hour=hour.iso, error=str(exc))
        if result.hours_compacted or result.inputs_deleted:
            ctx.log.info("catalog_compacted", **vars(result))
        return result

    def _full_levels(self, hour: keys.UtcHour) -> list[tuple[int, list[ObjectInfo]]]:
        """Each level of the hour holding `FANOUT` or more known files (lowest first)."""
        by_level: dict[int, list[str]] = {}
        for key, level in self._levels[hour].items():
            by_level.setdefault(level, []).append(key)
        return [
            (level, [_info(key) for key in sorted(names)])
            for level, names in sorted(by_level.items())
            if len(names) >= FANOUT
        ]

    async def _merge(
        self,
        ctx: ReconcilerContext,
        cataloger: Cataloger,
        hour: keys.UtcHour,
        files: list[ObjectInfo],
        level: int,
        limits: MergeLimits,
        result: CompactionResult,
    ) -> None:
        await ctx.check_fence()
        compaction = await merge_files(
            ctx.store, ctx.catalog_writer, hour, files, level=level, limits=limits
        )
        await cataloger.mark_work(compaction.merged_key, hour, compaction.rows)
        ctx.metrics.catalog_files.labels("compacted").inc()
        known = self._levels.setdefault(hour, {})
        for name in compaction.inputs:
            known.pop(name, None)
        known[compaction.merged_key] = level
        self._merged_at[hour] = ctx.clock.now_ns()
        result.hours_compacted += 1
        result.files_merged += len(compaction.inputs)


def _info(key: str) -> ObjectInfo:
    """A file known by name only (`merge_files` reads inputs by key)."""
    return ObjectInfo(key=key, size=0, etag="", last_modified_ns=0)
