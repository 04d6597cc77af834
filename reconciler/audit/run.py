"""Full audit of ``accepted/v1/`` and ``quarantine/v1/`` against the catalog: an anti-join,
then the blob join; resumable after a crash from its `AuditRecord` (PROTOCOL §3.7).

1. `CatalogScan.load` (`reconciler.audit.join`): per cataloged key its newest row's ETag
   hash, hashes and time, and the referenced hashes, in compact sorted arrays, read from
   the catalog files the audit pinned (``pin_expires_at_unix_ns`` in its record, renewed
   at each save; compaction deletes no pinned file: PROTOCOL §3.7).
2. The walk (`reconciler.audit.walks`: a listing, or an S3 Inventory report's data files,
   which also holds the cursors' meaning) hands chunks of listed records to `process`
   (`reconciler.audit.checks`): keys the catalog lacks are read and cataloged, keys whose
   ETag differs or whose rows disagree are read and superseded, before the chunk's cursor
   moves. A version-1 store is migrated this way: every record is missing once.
3. `join_blobs`: one listing of ``raw-blobs/v1/`` joined with the references: orphans
   older than the retry horizon go to the audit's orphan file
   (``reconciler/v1/audit-orphans/...``) for the GC; referenced blobs neither listed nor
   found by a HEAD become ``missing-blob`` problems (resolved when seen again). Accepted
   rows of hours raw retention retired (`reconciler.gc.raw_retention`) keep no blob alive:
   their blobs are orphans flagged ``raw_retention``, never missing.
4. A listing audit that walked everything in one run then reports ``phantom-row``s.
SHA-256 verification of blobs (`reconciler.audit.blob_verify`) runs alongside in rate-limited rounds.

**What a completed audit promises** (what the GC's rules 1, 2 and 5 rely on, PROTOCOL
§3.5): every accepted manifest and quarantine record that existed when the audit started
(``started_at_unix_ns``, the original start if it was resumed) is in the catalog — it was
there when the scan read it, or this audit cataloged it; every blob the listing showed
unreferenced and older than the horizon is in its orphan file; the listing was taken
after the start. A listed record that is unreadable or not well-formed is a problem
record, and the GC deletes nothing while such problems exist.

**Cost**: the catalog's files (one GET each), the listings (one LIST per 1,000 keys), and
one GET per record the catalog lacks or holds otherwise: known records cost nothing more.

`run_full_audit` resumes the newest running audit of the index when it may
(`audit_records.resume_or_start`): same ``audit_id``, same original start, counts carried
on. It is marked ``completed`` only if every record was seen and cataloged and the blob
join finished; otherwise it stays ``running`` and the next call resumes it (a resumed
audit scans the catalog again: rows cataloged before the crash are then known).
"""

from __future__ import annotations

import asyncio

from protocol import keys
from protocol.records import AuditRecord
from reconciler.audit.blob_verify import VERIFY_CURSOR, BlobVerifier, split_concurrency
from reconciler.audit.checks import RecordJoin, check_phantoms
from reconciler.audit.inventory import InventorySource
from reconciler.audit.join import BlobJoin, CatalogScan, join_blobs, record_missing_blobs
from reconciler.audit.orphans import encode_orphans
from reconciler.audit.progress import PROGRESS_INTERVAL_S as PROGRESS_INTERVAL_S
from reconciler.audit.progress import PROGRESS_RECORDS as PROGRESS_RECORDS
from reconciler.audit.progress import AuditProgress as AuditProgress
from reconciler.audit.progress import ProgressCallback as ProgressCallback
from reconciler.audit.records import (
    latest_audit,
    latest_completed_audit,
    resume_or_start,
    save_audit,
    trim_old_audits,
)
from reconciler.audit.walks import DONE, FRONTIER, InventoryWalk, Listed, ListingWalk, WalkState
from reconciler.cataloger import Cataloger
from reconciler.context import ReconcilerContext
from reconciler.gc.raw_retention import retired_for_audit
from reconciler.problems import ProblemBook
from store.errors import StoreError

__all__ = [
    "DONE",
    "FRONTIER",
    "VERIFY_CURSOR",
    "AuditProgress",
    "latest_audit",
    "latest_completed_audit",
    "run_full_audit",
]


async def run_full_audit(
    ctx: ReconcilerContext,
    *,
    progress: ProgressCallback | None = None,
    inventory: InventorySource | None = None,
    progress_interval_s: float = PROGRESS_INTERVAL_S,
) -> AuditRecord:
    """Run (or resume) a full audit and return its final record.

    ``status == "completed"`` only when it finished with every catalog write done; otherwise
    ``running`` (call again to resume). Raises `LeaseLost` (stop: no longer the leader),
    `InventoryError`, and store errors met while creating the record."""
    record, resumed = await resume_or_start(ctx, inventory)
    run = _AuditRun(ctx, record, resumed, progress, progress_interval_s)
    ctx.metrics.audit_running.set(1)
    try:
        await run.problems.load()
        if not await run.pin():
            return await run.finish()
        await run.scan_catalog()
        async with run.verifier.running():
            if inventory is not None:
                await InventoryWalk(ctx, run.state, run.process, run.checkpoint, inventory).run()
            else:
                await ListingWalk(
                    ctx,
                    run.state,
                    run.process,
                    run.checkpoint,
                    born_before_ns=run.record.started_at_unix_ns
                    + int(ctx.settings.settle_margin_s() * 1e9),
                ).run()
        if not run.state.failed and not run.state.stopped and not ctx.stopping.is_set():
            await run.join_blobs()
            if inventory is None and not resumed and run.blobs_joined:
                await run.check_phantoms()
        return await run.finish()
    finally:
        ctx.metrics.audit_running.set(0)


class _AuditRun:
    def __init__(
        self,
        ctx: ReconcilerContext,
        record: AuditRecord,
        resumed: bool,
        progress: ProgressCallback | None,
        progress_interval_s: float,
    ) -> None:
        self._ctx = ctx
        self._record = record
        self._resumed = resumed
        self._progress = progress
        self._interval = progress_interval_s
        self.state = WalkState(cursors=dict(record.cursors))
        self._manifests = record.manifests_seen
        self._quarantines = record.quarantines_seen
        self._problem_count = record.problems
        self._last_save = ctx.clock.monotonic()
        self._cataloged_at_save = record.cataloged
        self._saving = asyncio.Lock()
        self._limit, verify_limit = split_concurrency(ctx.reconciler_settings.concurrency)
        self.problems = ProblemBook(ctx)
        self.scan = CatalogScan()
        self._blobs: BlobJoin | None = None
        self._cataloged = record.cataloged
        self._cataloger = Cataloger(ctx, self.problems, limit=self._limit)
        self._join = RecordJoin(ctx, self.scan, self._cataloger, self.problems)
        self._pin_s = ctx.settings.reconciler.audit_pin_s
        self._pin_expires: int | None = None
        self._pinned_through: int | None = None
        self._phantoms: int | None = None
        self.lapsed = False
        self.verifier = BlobVerifier(
            ctx,
            self.problems,
            cursor=self.state.cursors.get(VERIFY_CURSOR, ""),
            limit=verify_limit,
            is_referenced=lambda sha: self.scan.references(sha),
        )

    # --- before the walk ----------------------------------------------------------------

    async def pin(self) -> bool:
        """Pin every catalog file before the catalog is listed (PROTOCOL §3.7): a new
        audit's record was created with its pin, a resumed one's pin is renewed here;
        False (the audit stops, incomplete) when that save fails. Once the scan's listing
        is done the pin narrows to the files last modified by then (plus the clock skew
        allowed: the store's clock wrote those times). Compaction deletes no pinned file
        while the pin lasts (`audit_records.live_pin`)."""
        self._pin_expires = self._record.pin_expires_at_unix_ns
        if not self._resumed:
            return True
        self._pin_expires = self._ctx.clock.now_ns() + int(self._pin_s * 1e9)
        try:
            await save_audit(self._ctx, self._current())
        except StoreError as exc:
            self._ctx.log.warning("audit_pin_failed", error=str(exc))
            self.state.failed = True
            return False
        return True

    async def scan_catalog(self) -> None:
        """Read the pinned catalog's keys and references (`CatalogScan`)."""
        ctx = self._ctx
        started = ctx.clock.monotonic()
        self.scan = await CatalogScan.load(ctx, self.problems, await retired_for_audit(ctx.store))
        self._join = RecordJoin(ctx, self.scan, self._cataloger, self.problems)
        skew_ns = int(ctx.settings.store.max_clock_skew_s * 1e9)
        self._pinned_through = ctx.clock.now_ns() + skew_ns
        self._last_save = float("-inf")  # save the narrowed pin at the first checkpoint
        ctx.log.info(
            "audit_catalog_scanned",
            files=self.scan.files,
            rows=self.scan.rows,
            moved_aside=self.scan.moved_aside,
            retired_batches=self.scan.retired_batches,
            memory_bytes=self.scan.record_keys.nbytes + self.scan.referenced.nbytes,
            seconds=round(ctx.clock.monotonic() - started, 3),
        )

    # --- records ------------------------------------------------------------------------

    async def process(self, chunk: list[Listed], quarantine: bool) -> bool:
        """Catalog the listed records the catalog lacks or holds otherwise
        (`reconciler.audit.checks`); True if all went well."""
        result = await self._join.process(chunk)  # each GET takes one of our slots
        batch = result.batch
        try:
            async with self._limit:
                await self._cataloger.commit(batch.rows)
        except StoreError as exc:
            self._ctx.metrics.store_failures.labels("catalog_write").inc()
            self._ctx.log.warning("audit_catalog_write_failed", error=str(exc))
            self.state.failed = True
            return False
        await self._join.written(result)
        self.scan.cataloged(batch.rows)
        if quarantine:
            self._quarantines += len(chunk) - batch.missing
        else:
            self._manifests += len(chunk) - batch.missing
        self._cataloged += len(batch.rows)
        self._problem_count += batch.problems
        self._report()
        if batch.failed:
            self.state.failed = True
            return False
        return True

    async def join_blobs(self) -> None:
        """List the raw blobs, supersede the rows whose blob is missing but whose record
        names another (`RecordJoin.supersede_for_missing`), write the orphan file, record
        missing blobs."""
        ctx = self._ctx
        try:
            joined = await join_blobs(ctx, self.scan, store_now_ns=ctx.clock.now_ns())
            result = await self._join.supersede_for_missing(joined)
            async with self._limit:
                await self._cataloger.commit(result.batch.rows)
            await self._join.written(result)
            self.scan.cataloged(result.batch.rows)
            await ctx.check_fence()
            await ctx.store.put(
                keys.audit_orphans_key(self._record.started_at_unix_ns, self._record.audit_id),
                encode_orphans(joined.orphans),
            )
        except StoreError as exc:
            ctx.metrics.store_failures.labels("audit_blobs").inc()
            ctx.log.warning("audit_blob_join_failed", error=str(exc))
            self.state.failed = True
            return
        self._problem_count += await record_missing_blobs(ctx.store, self.problems, joined.missing)
        self._blobs = joined

    @property
    def record(self) -> AuditRecord:
        return self._record

    @property
    def blobs_joined(self) -> bool:
        return self._blobs is not None

    async def check_phantoms(self) -> None:
        """Cataloged keys this run's listing lacked (`reconciler.audit.checks`)."""
        self._phantoms = await check_phantoms(
            self._ctx, self.scan, self.problems, started_ns=self._record.started_at_unix_ns
        )
        self._problem_count += self._phantoms

    # --- saving -------------------------------------------------------------------------

    def _current(self, **changes: object) -> AuditRecord:
        return AuditRecord.model_validate(
            {
                **self._record.model_dump(by_alias=True),
                "owner_epoch": self._ctx.epoch,
                "cursors": {**self.state.cursors, VERIFY_CURSOR: self.verifier.cursor},
                "manifests_seen": self._manifests,
                "quarantines_seen": self._quarantines,
                "problems": self._problem_count + self.verifier.problems,
                "catalog": True,
                "cataloged": self._cataloged,
                "pin_expires_at_unix_ns": self._pin_expires,
                "pinned_through_unix_ns": self._pinned_through,
                "phantoms_checked": self._phantoms is not None,
                **changes,
            }
        )

    def _save_due(self) -> bool:
        renew = self._pin_expires is not None and (
            self._ctx.clock.now_ns() >= self._pin_expires - int(self._pin_s * 1e9) // 2
        )
        return (
            self._ctx.clock.monotonic() - self._last_save >= self._interval
            or self._cataloged - self._cataloged_at_save >= PROGRESS_RECORDS
            or renew
        )

    async def checkpoint(self) -> None:
        """Save progress (renewing the pin) if the last save is `PROGRESS_INTERVAL_S` old,
        `PROGRESS_RECORDS` records were cataloged since, or half the pin has passed. A
        pin that lapsed meanwhile stops the audit: it starts again with a new start time
        (`audit_records.resume_or_start`), as the files it read may be gone."""
        if not self._save_due():
            return
        async with self._saving:
            if not self._save_due():
                return
            now = self._ctx.clock.now_ns()
            if self._pin_expires is not None and now >= self._pin_expires:
                if not self.lapsed:
                    self._ctx.log.warning("audit_pin_lapsed", audit_id=self._record.audit_id)
                self.lapsed = self.state.stopped = True
                return
            self._pin_expires = now + int(self._pin_s * 1e9)
            cataloged = self._cataloged
            try:
                async with self._limit:  # a request like the walk's: within concurrency
                    await save_audit(self._ctx, self._current())
            except StoreError as exc:
                # Progress only: a crash now resumes from the previous save.
                self._ctx.log.warning("audit_progress_save_failed", error=str(exc))
            self._last_save = self._ctx.clock.monotonic()
            self._cataloged_at_save = cataloged

    async def finish(self) -> AuditRecord:
        complete = not self.state.failed and not self.state.stopped and self._blobs is not None
        if complete:
            assert self._blobs is not None
            record = self._current(
                status="completed",
                completed_at_unix_ns=self._ctx.clock.now_ns(),
                cursors={VERIFY_CURSOR: self.verifier.cursor},
                blobs_listed=self._blobs.listed,
                orphans=len(self._blobs.orphans),
                pin_expires_at_unix_ns=None,  # the joins are done: the pin is released
                pinned_through_unix_ns=None,
            )
        else:
            record = self._current()
        try:
            async with self._saving:
                await save_audit(self._ctx, record)
        except StoreError as exc:
            self._ctx.log.warning("audit_save_failed", error=str(exc))
            record = self._current()
            complete = False
        self._ctx.metrics.audits.labels("completed" if complete else "incomplete").inc()
        if complete:
            try:
                await trim_old_audits(self._ctx)
            except StoreError as exc:  # old records only cost a longer listing: next time
                self._ctx.log.warning("audit_trim_failed", error=str(exc))
        if complete:
            self._ctx.metrics.last_audit_completed.set(self._ctx.clock.now_ns() / 1e9)
        self._ctx.log.info(
            "audit_finished",
            audit_id=record.audit_id,
            status=record.status,
            manifests=record.manifests_seen,
            quarantines=record.quarantines_seen,
            cataloged=record.cataloged,
            problems=record.problems,
            stopped=self.state.stopped,
        )
        return record

    def _report(self) -> None:
        metrics = self._ctx.metrics
        metrics.audit_manifests.set(self._manifests)
        metrics.audit_quarantines.set(self._quarantines)
        metrics.audit_groups_done.set(self.state.groups_done)
        if self._progress is not None:
            self._progress(
                AuditProgress(
                    audit_id=self._record.audit_id,
                    resumed=self._resumed,
                    manifests_seen=self._manifests,
                    quarantines_seen=self._quarantines,
                    groups_done=self.state.groups_done,
                    repaired=self._cataloged,
                    problems=self._problem_count + self.verifier.problems,
                    blobs_verified=self.verifier.verified,
                )
            )
