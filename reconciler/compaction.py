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

import asyncio
from dataclasses import dataclass

import structlog

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

log = structlog.get_logger(__name__)
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
        """Delete inputs past the grace, then merge full levels and settled hours (in line:
        `run_once`, tests). ``hold_deletes``: a running audit pinned the catalog files it
        reads, so no input is deleted now (they wait for a later run)."""
        result = await self.delete_inputs(ctx, force=force, hold_deletes=hold_deletes)
        merged = await self.merge(ctx, force=force)
        merged.inputs_deleted, merged.failed = result.inputs_deleted, result.failed + merged.failed
        return merged

    async def delete_inputs(
        self, ctx: ReconcilerContext, *, force: bool = False, hold_deletes: bool = False
    ) -> CompactionResult:
        """Delete the inputs of merges older than the grace (a few DELETEs an hour: the
        daemon runs this in line, so it never overlaps the start of an audit)."""
        result = CompactionResult()
        if hold_deletes:
            return result
        now = ctx.clock.now_ns()
        grace_s = ctx.settings.reconciler.catalog_grace_s
        due = [
            (hour, at)
            for hour, at in sorted(self._merged_at.items())
            if force or now - at >= grace_s * NS_PER_S
        ]
        if not due:
            return result
        try:
            pinned = await live_pin(ctx.store, now)
        except StoreError as exc:
            ctx.log.warning("catalog_pin_read_failed", error=str(exc))
            return result  # the audits' pins are unknown: delete nothing now
        for hour, at in due:
            try:
                await ctx.check_fence()
                result.inputs_deleted += await delete_compacted_inputs(
                    ctx.store,
                    hour,
                    store_now_ns=now,
                    grace_s=0 if force else grace_s,
                    pinned_through_ns=pinned,
                )
                # Else pinned inputs wait for a later run; and a merge of the hour that
                # finished meanwhile (`merge` runs beside this in the daemon) keeps its entry.
                if pinned is None and self._merged_at.get(hour) == at:
                    del self._merged_at[hour]
            except (StoreError, IndexFileError) as exc:
                result.failed += 1
                ctx.log.warning("catalog_input_delete_failed", hour=hour.iso, error=str(exc))
        if result.inputs_deleted:
            ctx.log.info("catalog_inputs_deleted", **vars(result))
        return result

    async def merge(self, ctx: ReconcilerContext, *, force: bool = False) -> CompactionResult:
        """Merge full levels and settled hours. Deletes nothing, so the daemon runs it as a
        task beside the steady pass (`CompactionBeside`); `touched` may add files meanwhile."""
        result = CompactionResult()
        now = ctx.clock.now_ns()
        lookback_ns = int(ctx.settings.reconciler.lookback_s * NS_PER_S)
        cataloger = Cataloger(ctx, ProblemBook(ctx))
        limits = MergeLimits(
            memory_limit_mb=max(64, ctx.settings.reconciler.audit_memory_limit_mb // 4)
        )
        for hour in sorted(self._levels):
            settled = hour.next().start_ns + lookback_ns <= now
            try:
                if settled or force:
                    covered = set(self._levels[hour])  # what `touched` added so far
                    files = await list_hour_files(ctx.store, hour)
                    covered.update(info.key for info in files)
                    if len(files) >= 2:
                        level = 1 + max(self._levels[hour].values(), default=0)
                        covered.add(
                            await self._merge(ctx, cataloger, hour, files, level, limits, result)
                        )
                    self._forget(hour, covered)
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
        if result.hours_compacted:
            ctx.log.info("catalog_compacted", **vars(result))
        return result

    def _forget(self, hour: keys.UtcHour, merged: set[str]) -> None:
        """A settled hour was merged whole: forget the files known before its listing, the
        files listed and the merged output; a file `touched` while it ran stays, for the
        next run to merge with that output."""
        known = self._levels.get(hour, {})
        for name in merged:
            known.pop(name, None)
        if not known:
            self._levels.pop(hour, None)

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
    ) -> str:
        """Merge ``files`` into one of ``level``; returns the merged file's key."""
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
        return compaction.merged_key


def _info(key: str) -> ObjectInfo:
    """A file known by name only (`merge_files` reads inputs by key)."""
    return ObjectInfo(key=key, size=0, etag="", last_modified_ns=0)


class CompactionBeside:
    """The daemon's compaction (PROTOCOL §3.9: nothing holds the steady pass for long): the
    deletes due run in line, each pass, where they cannot overlap the start of an audit;
    the merges — one DuckDB merge can take seconds to minutes while an audit writes many
    small files — run as one task beside the loop, a new run started when the last one
    finished. Merges delete nothing, and check the fence before each merge."""

    def __init__(self, compactor: CatalogCompactor) -> None:
        self._compactor = compactor
        self._task: asyncio.Task[CompactionResult] | None = None

    async def step(self, ctx: ReconcilerContext, *, hold_deletes: bool) -> CompactionResult:
        """The deletes due now, plus what the merge run that finished since the last step
        did (its error, such as `LeaseLost`, is raised here); starts the next merge run."""
        result = await self._compactor.delete_inputs(ctx, hold_deletes=hold_deletes)
        task = self._task
        if task is not None and task.done():
            self._task = None
            merged = task.result()
            result.hours_compacted, result.files_merged = (
                merged.hours_compacted,
                merged.files_merged,
            )
            result.failed += merged.failed
        if self._task is None:
            self._task = asyncio.create_task(self._compactor.merge(ctx), name="catalog-compaction")
        return result

    async def stop(self) -> None:
        """Let a running merge run finish (a lost lease ends it at its next merge); its
        error is logged, not raised: the term is over either way."""
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await task
        except Exception as exc:  # logged: the loop ends or goes standby either way
            log.warning("catalog_compaction_ended", error=f"{type(exc).__name__}: {exc}")
