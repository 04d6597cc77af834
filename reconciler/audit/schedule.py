"""When full audits run, and beside what (PROTOCOL §3.7, §3.9).

An audit is due when none ever completed (the first audit is also the migration of a
version-1 store), when one is left running (it resumes), or when the last completed one
is older than ``reconciler.max_audit_interval_s``. The GC never starts one.

The daemon starts a due audit as a background task (`start_if_due`) and goes on with its
steady passes beside it: an audit lists the whole history and must never hold back the
cataloging of new batches. With ``in_child`` (``lm-reconciler run``) that task runs the
audit in a child process (`reconciler.audit.child`, `reconciler.audit.worker`), so the
audit's listing parses, reads and joins take a core and a GIL of their own instead of the
steady pass's; without it (tests and simulations on in-memory stores) the audit runs in
the task itself. One audit runs at a time; a failed one is counted and logged, and the
next due check resumes it (audits keep their original start). `run_once` and
``lm-reconciler audit`` await it in line, in their own process (`run_if_due`). Ending
the term stops a running audit (`stop`): a child gets SIGTERM (it saves its progress)
and, after ``stop_grace_s``, SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from config import Settings
from protocol.records import AuditRecord
from reconciler.audit.child import AuditChild
from reconciler.audit.engines.spark_run import configured_audit
from reconciler.audit.inventory import InventorySource
from reconciler.audit.records import latest_audit
from reconciler.audit.run import ProgressCallback
from reconciler.context import ReconcilerContext
from reconciler.metrics import ReconcilerMetrics
from store.lease import LeaseLost

log = structlog.get_logger(__name__)
STOP_GRACE_S = 3.0
"""How long a stopped audit child may take to save its progress before SIGKILL."""


class AuditSchedule:
    def __init__(
        self,
        *,
        settings: Settings,
        metrics: ReconcilerMetrics,
        progress: ProgressCallback | None,
        inventory: InventorySource | None,
        in_child: bool = False,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        """``in_child``: background audits run in a child process, which opens the store
        from ``settings.store`` (so the daemon's store must be that one) and its inventory
        from ``settings.reconciler.inventory_url``."""
        self._settings = settings
        self._metrics = metrics
        self._progress = progress
        self._inventory = inventory
        self._in_child = in_child
        self._stop_grace_s = stop_grace_s
        self._task: asyncio.Task[AuditRecord] | None = None
        self._child: AuditChild | None = None

    @property
    def running(self) -> bool:
        """An audit of this process (or of its child) is running: it pinned the catalog
        files it reads."""
        return self._task is not None and not self._task.done()

    @property
    def child_pid(self) -> int | None:
        """The PID of the audit's child process while one runs."""
        return self._child.pid if self._child is not None else None

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
            work = self._run_child(ctx) if self._in_child else self._run(ctx)
            self._task = asyncio.create_task(work, name="reconciler-audit")

    async def run_if_due(self, ctx: ReconcilerContext) -> AuditRecord | None:
        """A due audit, awaited in line (``run --once``)."""
        if not await self.due(ctx):
            return None
        return await self._run(ctx)

    async def stop(self) -> None:
        """End a background audit with the term (it resumes later, keeping its start): a
        child gets SIGTERM and ``stop_grace_s`` to save its progress, then the task is
        cancelled (which SIGKILLs a child still alive and reaps it)."""
        task, self._task = self._task, None
        child = self._child
        if task is not None and not task.done():
            if child is not None and child.terminate():
                await asyncio.wait({task}, timeout=self._stop_grace_s)
            task.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def due(self, ctx: ReconcilerContext) -> bool:
        latest = await latest_audit(ctx.store, catalog_only=True)
        if latest is not None:
            self._metrics.observe_audit(latest)  # read each pass anyway: no extra request
        if latest is None or latest.status == "running":
            return True  # the first audit ever (or of the index: a migration), or one to resume
        # The newest audit of the index, completed, is the newest completed one
        # (`latest_completed_audit`'s answer, without finding the records again: each
        # lookup costs a LIST plus one per audit folder, and this runs every pass).
        completed = latest
        # The audit's age and the sealed hours, after restarts too.
        self._metrics.observe_completed_audit(completed, self._settings.settle_margin_s())
        if completed.completed_at_unix_ns is None:
            return True
        interval_ns = int(self._settings.reconciler.max_audit_interval_s * 1e9)
        return completed.completed_at_unix_ns <= ctx.clock.now_ns() - interval_ns

    async def _run(self, ctx: ReconcilerContext) -> AuditRecord:
        return await configured_audit(ctx, progress=self._progress, inventory=self._inventory)

    async def _run_child(self, ctx: ReconcilerContext) -> AuditRecord:
        child = self._child = AuditChild(ctx, progress=self._progress)
        try:
            return await child.run()
        finally:
            if self._child is child:
                self._child = None
