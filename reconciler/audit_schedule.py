"""When full audits run, and beside what (PROTOCOL §3.7, §3.9).

An audit is due when none ever completed (the first audit is also the migration of a
version-1 store), when one is left running (it resumes), or when the last completed one
is older than ``reconciler.max_audit_interval_s``. The GC never starts one.

The daemon starts a due audit as a background task (`start_if_due`) and goes on with its
steady passes beside it: an audit lists the whole history and must never hold back the
cataloging of new batches. One audit runs at a time; a failed one is counted and logged,
and the next due check resumes it (audits keep their original start). `run_once` and
``lm-reconciler audit`` await it in line instead (`run_if_due`). Ending the term cancels a
running audit (`stop`).
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from config import Settings
from protocol.records import AuditRecord
from store.lease import LeaseLost

from .audit import ProgressCallback, run_full_audit
from .audit_records import latest_audit, latest_completed_audit
from .context import ReconcilerContext
from .inventory import InventorySource
from .metrics import ReconcilerMetrics

log = structlog.get_logger(__name__)


class AuditSchedule:
    def __init__(
        self,
        *,
        settings: Settings,
        metrics: ReconcilerMetrics,
        progress: ProgressCallback | None,
        inventory: InventorySource | None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._progress = progress
        self._inventory = inventory
        self._task: asyncio.Task[AuditRecord] | None = None

    @property
    def running(self) -> bool:
        """An audit of this process is running (it pinned the catalog files it reads)."""
        return self._task is not None and not self._task.done()

    async def start_if_due(self, ctx: ReconcilerContext) -> None:
        """Start a due audit as a background task (one at a time); report a finished one.
        Raises `LeaseLost` when the finished audit found the lease gone."""
        task = self._task
        if task is not None and task.done():
            self._task = None
            if not task.cancelled() and (error := task.exception()) is not None:
                if isinstance(error, LeaseLost):
                    raise error
                self._metrics.stage_errors.labels("audit").inc()
                log.error("reconciler_audit_failed", error=repr(error))
        if self._task is None and await self.due(ctx):
            self._task = asyncio.create_task(self._run(ctx), name="reconciler-audit")

    async def run_if_due(self, ctx: ReconcilerContext) -> AuditRecord | None:
        """A due audit, awaited in line (``run --once``)."""
        if not await self.due(ctx):
            return None
        return await self._run(ctx)

    async def stop(self) -> None:
        """End a background audit with the term (it resumes later, keeping its start)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def due(self, ctx: ReconcilerContext) -> bool:
        latest = await latest_audit(ctx.store, catalog_only=True)
        if latest is None or latest.status == "running":
            return True  # the first audit ever (or of the index: a migration), or one to resume
        completed = await latest_completed_audit(ctx.store)
        if completed is None or completed.completed_at_unix_ns is None:
            return True
        interval_ns = int(self._settings.reconciler.max_audit_interval_s * 1e9)
        return completed.completed_at_unix_ns <= ctx.clock.now_ns() - interval_ns

    async def _run(self, ctx: ReconcilerContext) -> AuditRecord:
        return await run_full_audit(ctx, progress=self._progress, inventory=self._inventory)
