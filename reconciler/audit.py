"""Full audit of ``accepted/v1/`` and ``quarantine/v1/``: every record repaired and its blob
verified; resumable after a crash from its `AuditRecord`.

Input is a listing of the store, or an S3 Inventory report (`reconciler.inventory`).

How records are visited is `reconciler.audit_walks`: a listing (agent groups found by
skip-listing, ``concurrency`` at a time, each in chunks) or an inventory's data files.

**Progress** lives in ``AuditRecord.cursors`` (saved at the start, every
`PROGRESS_INTERVAL_S`, and at the end):
- ``cursors["accepted/v1/"]``: the frontier: every agent group up to and including it is
  done. Discovery after a crash restarts past it, so finished groups are not re-listed.
- ``cursors[<group>]``: for groups past the frontier, the last key whose repairs all
  succeeded, or ``"done"``. A chunk's cursor moves only when every write of every record in
  it succeeded; a group that hits a failure stops there.
- inventory audits: ``cursors["inventory:manifest"]`` names the report, and
  ``cursors["file:<data file key>"]`` holds the next row to read, or ``"done"``.

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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

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
from .problems import ProblemBook
from .rate import TokenBucket
from .repair import BlobCheck, Repairer, RepairOutcome

__all__ = [
    "DONE",
    "FRONTIER",
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
    record = AuditRecord(
        audit_id=f"{ctx.rng.getrandbits(64):016x}",
        # An inventory shows the bucket as of its creation: the audit counts from then.
        started_at_unix_ns=report.created_at_unix_ns if report else ctx.clock.now_ns(),
        source=source,
        owner_epoch=ctx.epoch,
        cursors={INVENTORY_CURSOR: report.manifest_key} if report else {},
    )
    await create_audit(ctx, record)
    ctx.log.info("audit_started", audit_id=record.audit_id, source=source)
    return record, False


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
        self._limit = asyncio.Semaphore(ctx.reconciler_settings.concurrency)
        self.problems = ProblemBook(ctx)
        self._repairer = Repairer(
            ctx,
            self.problems,
            verify=TokenBucket(
                rate_per_s=ctx.reconciler_settings.verify_rate_per_s, clock=ctx.clock
            ),
        )

    # --- records ------------------------------------------------------------------------

    async def process(self, record_keys: list[str], quarantine: bool) -> bool:
        """Repair every record in ``record_keys`` concurrently; True if all succeeded."""

        async def one(key: str) -> RepairOutcome:
            async with self._limit:
                if quarantine:
                    return await self._repairer.quarantine_at(key, blob_check=BlobCheck.VERIFY)
                return await self._repairer.manifest_at(key, blob_check=BlobCheck.VERIFY)

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
                "cursors": dict(self.state.cursors),
                "manifests_seen": self._manifests,
                "quarantines_seen": self._quarantines,
                "repaired": dict(self._repaired),
                "problems": self._problem_count,
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
                status="completed", completed_at_unix_ns=self._ctx.clock.now_ns(), cursors={}
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
                    problems=self._problem_count,
                )
            )
