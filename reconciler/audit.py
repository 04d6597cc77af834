"""Full audit of ``accepted/v1/`` and ``quarantine/v1/``: every record repaired and its blob
checked; resumable after a crash from its `AuditRecord`.

Input is a listing of the store, or an S3 Inventory report (`reconciler.inventory`).

**What a completed audit promises** (what the GC's rule 5 relies on, PROTOCOL §3.5):
every accepted manifest and quarantine record that existed when the audit started
(``started_at_unix_ns``, the original start if it was resumed) was read, and every
derived entry `reconciler.repair` keeps for it (``accepted-by-blob``, ``accepted-by-time``,
``quarantine-by-blob``, ``raw-blobs-by-time`` for records younger than
``gc.retry_horizon_s``) existed at some point after that start: either a listing taken
after the start returned its key (such entries are never deleted; see
`reconciler.listed`) or the audit created it, or its If-None-Match create was answered 412.
Each record's raw blob was seen to exist (for manifests: with the manifest's size) by the
listing or a HEAD, or a ``missing-blob``/``corrupt-blob`` problem was recorded, or the
check met a store error (logged and counted; as before, that does not keep the audit from
completing: the steady state and the next audit look again). It does **not** promise that
every blob's SHA-256 was checked in this audit: verification (`reconciler.verify`) runs
alongside the walk, at most ``verify_rate_per_s``, from a cursor carried from audit to
audit, so a full round over ``raw-blobs/v1/`` may span several audits. Corrupt blobs are
recorded as ``corrupt-blob`` problems when the round reaches them.

**Cost per record** (listing audits): the record's GET, its share of the listings, and
only the writes and HEADs the up-front listing (`reconciler.listed.ListedKeys`) could not
rule out. With a complete listing and nothing to repair that is one GET per record.

How records are visited is `reconciler.audit_walks`: a listing (agent groups found by
one skip-listing of ``accepted/v1/``, ``concurrency`` at a time, each in chunks) or an
inventory's data files. Blob verification has an eighth of ``concurrency`` to itself.

**Progress** lives in ``AuditRecord.cursors`` (saved at the start, every
`PROGRESS_INTERVAL_S`, and at the end):
- ``cursors["accepted/v1/"]``: the frontier: every agent group up to and including it is
  done. Discovery after a crash restarts past it, so finished groups are not re-listed.
- ``cursors[<group>]``: for groups past the frontier, the last key whose repairs all
  succeeded, or ``"done"``. A chunk's cursor moves only when every write of every record in
  it succeeded; a group that hits a failure stops there.
- inventory audits: ``cursors["inventory:manifest"]`` names the report, and
  ``cursors["file:<data file key>"]`` holds the next row to read, or ``"done"``.
- ``cursors[VERIFY_CURSOR]``: where blob verification stands (`reconciler.verify`); the
  only cursor a completed record keeps, and the one a new audit's record starts with.

`run_full_audit` resumes the newest audit if it is still ``running`` and of the same
source (and, for inventories, the same report): same ``audit_id``, same original
``started_at_unix_ns`` (what the GC relies on: "an audit that started after X" saw every
record that existed at X), counts carried on. It is marked ``completed`` only if every
record was seen and every repair write succeeded; otherwise it stays ``running`` and the
next call resumes it. Problems (missing or corrupt blobs, unparseable records) do not
keep it from completing: they are recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from protocol import keys
from protocol.records import AuditRecord
from store.errors import StoreError

from .audit_records import (
    create_audit,
    latest_audit,
    latest_completed_audit,
    save_audit,
)
from .audit_walks import DONE, FRONTIER, INVENTORY_CURSOR, InventoryWalk, ListingWalk, WalkState
from .context import ReconcilerContext
from .inventory import InventorySource
from .listed import ListedKeys
from .problems import ProblemBook
from .repair import BlobCheck, Repairer, RepairOutcome
from .verify import VERIFY_CURSOR, BlobVerifier

__all__ = [
    "DONE",
    "FRONTIER",
    "VERIFY_CURSOR",
    "AuditProgress",
    "latest_audit",
    "latest_completed_audit",
    "run_full_audit",
]

PROGRESS_INTERVAL_S = 2.0


@dataclass(frozen=True, slots=True)
class AuditProgress:
    """Handed to the ``progress`` callback after every chunk."""

    audit_id: str
    resumed: bool
    manifests_seen: int
    quarantines_seen: int
    groups_done: int
    repaired: int
    problems: int
    blobs_verified: int = 0


ProgressCallback = Callable[[AuditProgress], None]


async def run_full_audit(
    ctx: ReconcilerContext,
    *,
    progress: ProgressCallback | None = None,
    inventory: InventorySource | None = None,
    progress_interval_s: float = PROGRESS_INTERVAL_S,
) -> AuditRecord:
    """Run (or resume) a full audit and return its final record.

    ``status == "completed"`` only when it finished with every repair written; otherwise
    ``running`` (call again to resume). Raises `LeaseLost` (stop: no longer the leader),
    `InventoryError`, and store errors met while creating the record."""
    record, resumed = await _resume_or_start(ctx, inventory)
    run = _AuditRun(ctx, record, resumed, progress, progress_interval_s)
    ctx.metrics.audit_running.set(1)
    try:
        await run.problems.load()
        await run.load_listed()
        async with run.verifying():
            if inventory is not None:
                await InventoryWalk(ctx, run.state, run.process, run.checkpoint, inventory).run()
            else:
                await ListingWalk(ctx, run.state, run.process, run.checkpoint).run()
        return await run.finish()
    finally:
        ctx.metrics.audit_running.set(0)


async def _resume_or_start(
    ctx: ReconcilerContext, inventory: InventorySource | None
) -> tuple[AuditRecord, bool]:
    await ctx.check_fence()
    source = "listing" if inventory is None else "inventory"
    report = await inventory.report() if inventory is not None else None
    latest = await latest_audit(ctx.store)
    if (
        latest is not None
        and latest.status == "running"
        and latest.source == source
        and (report is None or latest.cursors.get(INVENTORY_CURSOR) == report.manifest_key)
    ):
        ctx.log.info("audit_resumed", audit_id=latest.audit_id, cursors=len(latest.cursors))
        return latest, True
    cursors = {INVENTORY_CURSOR: report.manifest_key} if report else {}
    if latest is not None and VERIFY_CURSOR in latest.cursors:
        cursors[VERIFY_CURSOR] = latest.cursors[VERIFY_CURSOR]  # verification goes on
    record = AuditRecord(
        audit_id=f"{ctx.rng.getrandbits(64):016x}",
        # An inventory shows the bucket as of its creation: the audit counts from then.
        started_at_unix_ns=report.created_at_unix_ns if report else ctx.clock.now_ns(),
        source=source,
        owner_epoch=ctx.epoch,
        cursors=cursors,
    )
    await create_audit(ctx, record)
    ctx.log.info("audit_started", audit_id=record.audit_id, source=source)
    return record, False


def _split_concurrency(concurrency: int) -> tuple[asyncio.Semaphore, asyncio.Semaphore]:
    """Slots for the records' requests and for blob verification, ``concurrency`` in all.
    Verification gets its own eighth (at least one), so the walk's queue of requests cannot
    starve it; with a single slot both share it."""
    if concurrency < 2:
        shared = asyncio.Semaphore(concurrency)
        return shared, shared
    verify = max(1, concurrency // 8)
    return asyncio.Semaphore(concurrency - verify), asyncio.Semaphore(verify)


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
        self._repaired: Counter[str] = Counter(record.repaired)
        self._problem_count = record.problems
        self._last_save = ctx.clock.monotonic()
        self._saving = asyncio.Lock()
        self._limit, verify_limit = _split_concurrency(ctx.reconciler_settings.concurrency)
        self.problems = ProblemBook(ctx)
        self.listed = ListedKeys(cap=0)
        self._repairer = Repairer(ctx, self.problems)
        self._verifier = BlobVerifier(
            ctx,
            self.problems,
            cursor=self.state.cursors.get(VERIFY_CURSOR, ""),
            limit=verify_limit,
        )

    # --- before the walk ----------------------------------------------------------------

    async def load_listed(self) -> None:
        """List what the records' repairs would otherwise probe one by one (see
        `reconciler.listed`). Without it (cap 0, store errors) every create is attempted."""
        ctx = self._ctx
        cap = ctx.reconciler_settings.audit_listed_keys_max
        if cap <= 0:
            return
        horizon_ns = int(ctx.settings.gc.retry_horizon_s * 1e9)
        started = ctx.clock.monotonic()
        try:
            self.listed = await ListedKeys.load(
                ctx.store,
                cap=cap,
                raw_blobs_by_time_from=keys.UtcHour.from_unix_ns(ctx.clock.now_ns() - horizon_ns),
                parallel=ctx.reconciler_settings.concurrency,
            )
        except StoreError as exc:
            ctx.metrics.store_failures.labels("audit_listed").inc()
            ctx.log.warning("audit_listing_failed", error=str(exc))
            self.listed = ListedKeys(cap=0)
        stats = self.listed.stats
        (ctx.log.warning if stats.capped_at else ctx.log.info)(
            "audit_listed",
            keys=stats.keys,
            prefixes_complete=stats.prefixes_complete,
            capped_at=stats.capped_at,
            seconds=round(ctx.clock.monotonic() - started, 3),
        )
        self._repairer = Repairer(ctx, self.problems, listed=self.listed)

    @contextlib.asynccontextmanager
    async def verifying(self) -> AsyncIterator[None]:
        """Verify blobs (`reconciler.verify`) while the body runs; stop when it ends."""
        task = asyncio.create_task(self._verifier.run())
        try:
            yield
            if not self._ctx.stopping.is_set():
                await self._verifier.moved_or_ended(task)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # LeaseLost propagates
            self._ctx.log.info(
                "audit_blobs_verified",
                verified=self._verifier.verified,
                problems=self._verifier.problems,
                round_complete=self._verifier.round_complete,
            )

    # --- records ------------------------------------------------------------------------

    async def process(self, record_keys: list[str], quarantine: bool) -> bool:
        """Repair every record in ``record_keys`` concurrently; True if all succeeded."""

        async def one(key: str) -> RepairOutcome:
            async with self._limit:
                if quarantine:
                    return await self._repairer.quarantine_at(key, blob_check=BlobCheck.LISTED)
                return await self._repairer.manifest_at(key, blob_check=BlobCheck.LISTED)

        total = RepairOutcome()
        for outcome in await asyncio.gather(*(one(key) for key in record_keys)):
            total.add(outcome)
        seen = len(record_keys) - total.missing_source
        if quarantine:
            self._quarantines += seen
        else:
            self._manifests += seen
        self._repaired.update(total.created)
        self._problem_count += sum(total.problems.values())
        self._report()
        if total.failed:
            self.state.failed = True
            return False
        return True

    # --- saving -------------------------------------------------------------------------

    def _current(self, **changes: object) -> AuditRecord:
        return AuditRecord.model_validate(
            {
                **self._record.model_dump(by_alias=True),
                "owner_epoch": self._ctx.epoch,
                "cursors": {**self.state.cursors, VERIFY_CURSOR: self._verifier.cursor},
                "manifests_seen": self._manifests,
                "quarantines_seen": self._quarantines,
                "repaired": dict(self._repaired),
                "problems": self._problem_count + self._verifier.problems,
                **changes,
            }
        )

    async def checkpoint(self) -> None:
        """Save progress if the last save is `PROGRESS_INTERVAL_S` old."""
        if self._ctx.clock.monotonic() - self._last_save < self._interval:
            return
        async with self._saving:
            if self._ctx.clock.monotonic() - self._last_save < self._interval:
                return
            try:
                await save_audit(self._ctx, self._current())
            except StoreError as exc:
                # Progress only: a crash now resumes from the previous save.
                self._ctx.log.warning("audit_progress_save_failed", error=str(exc))
            self._last_save = self._ctx.clock.monotonic()

    async def finish(self) -> AuditRecord:
        complete = not self.state.failed and not self.state.stopped
        if complete:
            record = self._current(
                status="completed",
                completed_at_unix_ns=self._ctx.clock.now_ns(),
                cursors={VERIFY_CURSOR: self._verifier.cursor},
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
            self._ctx.metrics.last_audit_completed.set(self._ctx.clock.now_ns() / 1e9)
        self._ctx.log.info(
            "audit_finished",
            audit_id=record.audit_id,
            status=record.status,
            manifests=record.manifests_seen,
            quarantines=record.quarantines_seen,
            repaired=record.repaired,
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
                    repaired=sum(self._repaired.values()),
                    problems=self._problem_count + self._verifier.problems,
                    blobs_verified=self._verifier.verified,
                )
            )
