"""The state of one full audit run and how it is saved (`reconciler.audit.run`'s base):
counts, the pin, progress saves (`checkpoint`), phases that stop when the reconciler stops
or the pin lapses (`run_phase`), and the final record (`finish`). PROTOCOL §3.7."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, TypeVar

from protocol import keys
from protocol.records import AuditRecord
from reconciler.audit.blob_verify import VERIFY_CURSOR, BlobVerifier, split_concurrency
from reconciler.audit.engines.engine import EngineJoins
from reconciler.audit.inventory import InventorySource
from reconciler.audit.progress import PROGRESS_RECORDS, AuditProgress, ProgressCallback
from reconciler.audit.records import save_audit, trim_old_audits
from reconciler.bundle_verify import BUNDLE_VERIFY_CURSOR, BundleVerifier
from reconciler.cataloger import Cataloger
from reconciler.context import ReconcilerContext
from reconciler.problems import ProblemBook
from store.errors import StoreError
from store.lease import LeaseLost

T = TypeVar("T")
SAVE_TICK_S = 1.0
"""While a phase runs (listing, joins), progress is saved (and the pin renewed) when due,
checked this often."""


class AuditState:
    ENGINE = "local"
    """The engine's name in the audit record (``audit_engine``)."""

    def __init__(
        self,
        ctx: ReconcilerContext,
        record: AuditRecord,
        resumed: bool,
        progress: ProgressCallback | None,
        progress_interval_s: float,
        inventory: InventorySource | None,
    ) -> None:
        self._ctx = ctx
        self._record = record
        self._resumed = resumed
        self._progress = progress
        self._interval = progress_interval_s
        self._inventory = inventory
        self.failed = False
        self.stopped = False
        self._cursors = dict(record.cursors)
        self._manifests = record.manifests_seen
        self._quarantines = record.quarantines_seen
        self._problem_count = record.problems
        self._ranges_done = 0
        self._last_save = ctx.clock.monotonic()
        self._cataloged_at_save = record.cataloged
        self._saving = asyncio.Lock()
        concurrency = ctx.reconciler_settings.concurrency
        self._limit, verify_limit = split_concurrency(concurrency)
        # Listing streams share the records' slots: requests in flight stay within
        # ``concurrency`` (verification has its own share).
        self._streams = max(1, min(
            ctx.settings.reconciler.audit_list_concurrency,
            concurrency - (max(1, concurrency // 8) if concurrency >= 2 else 0),
        ))  # fmt: skip
        self.problems = ProblemBook(ctx)
        self._cataloged = record.cataloged
        self._cataloger = Cataloger(ctx, self.problems, limit=self._limit)
        self._pin_s = ctx.settings.reconciler.audit_pin_s
        self._pin_expires: int | None = None
        self._pinned_through: int | None = None
        self._phantoms: int | None = None
        self._blobs: dict[str, int] | None = None
        """The blob join's counts for the record (``blobs_listed``, ``orphans``,
        ``bundles_listed``, ``bundle_bytes``, ``bundle_dead_bytes``), once done."""
        self._joins: EngineJoins | None = None
        self._phase: asyncio.Future[Any] | None = None
        self.lapsed = False
        self._input_bytes = 0
        """The joins' inputs (catalog copies and listing parts), in bytes."""
        # What the audit cost (issue 23 item 5), carried across runs by its record.
        self._keys_listed: dict[str, int] = dict(record.keys_listed)
        self._requests: dict[str, int] = dict(record.requests)
        self._spilled = record.spilled_bytes
        self.spill_dir: str | None = None
        self.ranges_total = 0
        """The listing's ranges (known once planned): ``groups_done`` of them are listed."""
        self.verifier = BlobVerifier(
            ctx,
            self.problems,
            cursor=self._cursors.get(VERIFY_CURSOR, ""),
            limit=verify_limit,
            is_referenced=self._references,
            after_wait=self.checkpoint,
        )
        self.bundle_verifier = BundleVerifier.of(
            ctx,
            self.problems,
            cursor=self._cursors.get(BUNDLE_VERIFY_CURSOR, ""),
            after_wait=self.checkpoint,
        )

    def _verify_cursors(self) -> dict[str, str]:
        """Both SHA verifications' cursors: frame blobs' and bundles' (PROTOCOL §3.10)."""
        return {
            VERIFY_CURSOR: self.verifier.cursor,
            BUNDLE_VERIFY_CURSOR: self.bundle_verifier.cursor,
        }

    def _verify_problems(self) -> int:
        return self.verifier.problems + self.bundle_verifier.problems

    def _references(self, sha: str) -> bool:
        """Blob verification's message (rare): a query over the catalog copies."""
        return self._joins is not None and self._joins.references(keys.raw_blob_key(sha))

    async def pin(self) -> bool:
        """Pin every catalog file before the catalog is listed (PROTOCOL §3.7): a new
        audit's record was created with its pin, a resumed one's pin is renewed here;
        False (the audit stops, incomplete) when that save fails. Once the catalog's
        listing is done the pin narrows to the files last modified by then (plus the clock
        skew allowed: the store's clock wrote those times). Compaction deletes no pinned
        file while the pin lasts (`audit_records.live_pin`)."""
        self._pin_expires = self._record.pin_expires_at_unix_ns
        if not self._resumed:
            return True
        self._pin_expires = self._ctx.clock.now_ns() + int(self._pin_s * 1e9)
        try:
            await save_audit(self._ctx, self._current())
        except StoreError as exc:
            self._ctx.log.warning("audit_pin_failed", error=str(exc))
            self.failed = True
            return False
        return True

    # --- the phases ---------------------------------------------------------------------

    def _going(self) -> bool:
        if self._ctx.stopping.is_set():
            self.stopped = True
        return not (self.failed or self.stopped)

    def _store_failure(self, stage: str, exc: StoreError) -> None:
        self._ctx.metrics.store_failures.labels(stage).inc()
        self._ctx.log.warning("audit_store_failure", stage=stage, error=str(exc))
        self.failed = True

    async def run_phase(
        self, work: Awaitable[T], interrupt: Callable[[], None] | None = None
    ) -> T | None:
        """``work``, unless the reconciler stops or the pin lapses first (``None``; the
        listing is cancelled: what it wrote is kept for the resume; work in a thread is
        stopped by ``interrupt``: the joins'). Errors propagate."""
        task: asyncio.Future[T] = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._ctx.stopping.wait())
        self._phase = task
        try:
            waiting: set[asyncio.Future[Any]] = {task, stop}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            self._phase = None
        if task.done() and not task.cancelled():
            try:
                return task.result()
            except BaseExceptionGroup as errors:  # a task group's: one error as itself
                raise _first_error(errors) from None
        self.stopped = True
        if interrupt is not None:
            interrupt()
        task.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await task
        return None

    # --- saving -------------------------------------------------------------------------

    @asynccontextmanager
    async def saving(self) -> AsyncIterator[None]:
        """Save progress when due (`checkpoint`) while the body runs: the listing and the
        joins take long between the acts' own checkpoints."""

        async def tick() -> None:
            while True:
                await asyncio.sleep(SAVE_TICK_S)
                await self.checkpoint()

        task = asyncio.create_task(tick())
        try:
            yield
        finally:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task

    def _current(self, **changes: object) -> AuditRecord:
        return AuditRecord.model_validate(
            {
                **self._record.model_dump(by_alias=True),
                "owner_epoch": self._ctx.epoch,
                "cursors": {**self._cursors, **self._verify_cursors()},
                "manifests_seen": self._manifests,
                "quarantines_seen": self._quarantines,
                "problems": self._problem_count + self._verify_problems(),
                "catalog": True,
                "cataloged": self._cataloged,
                "pin_expires_at_unix_ns": self._pin_expires,
                "pinned_through_unix_ns": self._pinned_through,
                "phantoms_checked": self._phantoms is not None,
                "engine": self.ENGINE,
                "keys_listed": self._keys_listed,
                "requests": self._requests,
                "spilled_bytes": self._spill_peak(),
                **changes,
            }
        )

    def count_requests(self, kind: str, n: int) -> None:
        self._requests[kind] = self._requests.get(kind, 0) + n

    def _spill_peak(self) -> int:
        """The most the spill directory held at any save so far (catalog and listing
        copies, DuckDB's spill files): what an audit needs of local disk."""
        if self.spill_dir is not None:
            held = 0
            for root, _dirs, files in os.walk(self.spill_dir):
                for name in files:
                    with contextlib.suppress(OSError):  # DuckDB removes its files as it goes
                        held += os.stat(os.path.join(root, name)).st_size
            self._spilled = max(self._spilled, held)
        return self._spilled

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
                self.lapsed = self.stopped = True
                if self._phase is not None:
                    self._phase.cancel()
                return
            self._pin_expires = now + int(self._pin_s * 1e9)
            cataloged = self._cataloged
            try:
                async with self._limit:  # a request like the acts': within concurrency
                    await save_audit(self._ctx, self._current())
            except StoreError as exc:
                # Progress only: a crash now resumes from the previous save.
                self._ctx.log.warning("audit_progress_save_failed", error=str(exc))
            self._last_save = self._ctx.clock.monotonic()
            self._cataloged_at_save = cataloged

    async def finish(self) -> AuditRecord:
        complete = not self.failed and not self.stopped and self._blobs is not None
        if complete:
            assert self._blobs is not None
            record = self._current(
                status="completed",
                completed_at_unix_ns=self._ctx.clock.now_ns(),
                cursors=self._verify_cursors(),
                **self._blobs,
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
            self._ctx.metrics.last_audit_completed.set(self._ctx.clock.now_ns() / 1e9)
        self._ctx.log.info(
            "audit_finished",
            audit_id=record.audit_id,
            status=record.status,
            manifests=record.manifests_seen,
            quarantines=record.quarantines_seen,
            cataloged=record.cataloged,
            problems=record.problems,
            stopped=self.stopped,
        )
        return record

    def _report(self) -> None:
        metrics = self._ctx.metrics
        metrics.audit_manifests.set(self._manifests)
        metrics.audit_quarantines.set(self._quarantines)
        metrics.audit_groups_done.set(self._ranges_done)
        if self._progress is not None:
            self._progress(
                AuditProgress(
                    audit_id=self._record.audit_id,
                    resumed=self._resumed,
                    manifests_seen=self._manifests,
                    quarantines_seen=self._quarantines,
                    groups_done=self._ranges_done,
                    ranges_total=self.ranges_total,
                    repaired=self._cataloged,
                    problems=self._problem_count + self._verify_problems(),
                    blobs_verified=self.verifier.verified,
                )
            )


def _first_error(errors: BaseExceptionGroup[BaseException]) -> BaseException:
    """The most important error of a task group: losing the lease first."""
    flat: list[BaseException] = []

    def walk(group: BaseExceptionGroup[BaseException]) -> None:
        for error in group.exceptions:
            if isinstance(error, BaseExceptionGroup):
                walk(error)
            else:
                flat.append(error)

    walk(errors)
    return next((e for e in flat if isinstance(e, LeaseLost)), flat[0])
