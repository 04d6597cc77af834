"""Catalog compaction (PROTOCOL §3.7): an hour's files merged into one, inputs deleted later.

The steady pass writes one catalog file per hour per chunk, and audits one per chunk that
found records missing, so an hour collects files. `CatalogCompactor` merges the files of
an hour the reconciler wrote to once the hour is *settled* (its end is older than the
lookback: the log will add nothing more to it but stragglers) or as soon as it holds
more than `MAX_FILES_PER_HOUR` files, so readers (the rollup planner, the GC, the live
query) open few files per hour. The merged file gets its own rollup work marker, like
every catalog file.

Inputs are deleted `reconciler.catalog_grace_s` (store time) after the merge — longer
than any reader's listing-to-read time, so a reader that listed an input either reads it
or, finding it gone, lists the hour again and finds the merged file — and only by the
names the merged file records (`index.catalog.delete_compacted_inputs`). Hours waiting
for that deletion are kept in memory; after a restart they are found again when the hour
is next compacted (the merged file still names its inputs), and until then an hour's
catalog is simply read from a few more files.
"""

from __future__ import annotations

from dataclasses import dataclass

from index.catalog import compact_hour, delete_compacted_inputs, list_hour_files
from index.rows import IndexFileError
from protocol import keys
from store.errors import NotFound, StoreError

from .cataloger import Cataloger
from .context import ReconcilerContext
from .problems import ProblemBook

MAX_FILES_PER_HOUR = 32
NS_PER_S = 1_000_000_000


@dataclass
class CompactionResult:
    hours_compacted: int = 0
    files_merged: int = 0
    inputs_deleted: int = 0
    failed: int = 0


class CatalogCompactor:
    def __init__(self) -> None:
        self._touched: dict[keys.UtcHour, int] = {}  # hour -> files written since compaction
        self._merged_at: dict[keys.UtcHour, int] = {}  # hour -> store time of the merge

    def touched(self, hour: keys.UtcHour) -> None:
        self._touched[hour] = self._touched.get(hour, 0) + 1

    @property
    def pending(self) -> int:
        return len(self._touched) + len(self._merged_at)

    async def run(
        self, ctx: ReconcilerContext, *, force: bool = False, hold_deletes: bool = False
    ) -> CompactionResult:
        """Compact the settled (or crowded) hours written to; delete inputs past the grace.
        ``hold_deletes``: a running audit pinned the catalog files it reads, so no input is
        deleted now (they wait for a later run)."""
        result = CompactionResult()
        now = ctx.clock.now_ns()
        lookback_ns = int(ctx.settings.reconciler.lookback_s * NS_PER_S)
        grace_s = ctx.settings.reconciler.catalog_grace_s
        for hour, at in sorted(self._merged_at.items()):
            if hold_deletes or (not force and now - at < grace_s * NS_PER_S):
                continue
            try:
                await ctx.check_fence()
                result.inputs_deleted += await delete_compacted_inputs(
                    ctx.store, hour, store_now_ns=now, grace_s=0 if force else grace_s
                )
                del self._merged_at[hour]
            except (StoreError, IndexFileError) as exc:
                result.failed += 1
                ctx.log.warning("catalog_input_delete_failed", hour=hour.iso, error=str(exc))
        problems = ProblemBook(ctx)
        cataloger = Cataloger(ctx, problems)
        for hour in sorted(self._touched):
            settled = hour.next().start_ns + lookback_ns <= now
            if not (settled or force) and self._touched[hour] < MAX_FILES_PER_HOUR:
                continue
            try:
                if (
                    not (settled or force)
                    and len(await list_hour_files(ctx.store, hour)) <= MAX_FILES_PER_HOUR
                ):
                    continue
                await ctx.check_fence()
                compaction = await compact_hour(ctx.store, ctx.catalog_writer, hour)
                if compaction is not None:
                    await cataloger.mark_work(compaction.merged_key, hour, compaction.rows)
                    ctx.metrics.catalog_files.labels("compacted").inc()
                    self._merged_at[hour] = now
                    result.hours_compacted += 1
                    result.files_merged += len(compaction.inputs)
                del self._touched[hour]
            except (StoreError, IndexFileError, NotFound) as exc:
                result.failed += 1
                ctx.log.warning("catalog_compaction_failed", hour=hour.iso, error=str(exc))
        if result.hours_compacted or result.inputs_deleted:
            ctx.log.info("catalog_compacted", **vars(result))
        return result
