"""The reconciler daemon: `Reconciler` with ``run()``, ``run_once()`` and ``stop(grace)``.

The holder of the lease at ``RECONCILER_LEASE_KEY`` is the one active instance per acceptance
authority; others are standbys: they sleep until the holder's lease expires and try again (a
standby takes over within about one TTL). The active one loops, every ``loop_interval_s``:

1. a steady pass over the index log (`reconciler.steady`);
2. a full audit (`reconciler.audit.run`) when one is due: no audit of the index has completed
   within ``max_audit_interval_s`` (so the first run ever always audits, and so does the first run
   on a version-1 store: that audit is its migration), or one is still running (it is resumed).
   `run` starts it beside the loop (`reconciler.audit.schedule`: in a child process with
   ``audit_in_child``, as ``lm-reconciler run`` does), `run_once` awaits it;
3. catalog compaction (`reconciler.compaction`) of the hours written to;
4. every ``LOG_SWEEP_INTERVAL_S``, housekeeping, GC enabled or not (`reconciler.log_retention`):
   the consumed log segments, ``catalog-created`` and version-registry entries no rule reads;
5. the GC (``reconciler.gc.run.run_gc``) when ``gc.enabled``, at most once per
   ``max(loop_interval_s, gc.mark_grace_s)``; disabled, only its resolution of stale ``deleting``
   marks (which would otherwise keep collectors waiting);
6. in ``run()`` only, the rollup's progress gauges (`reconciler.rollup_progress`).

While active, the lease is renewed in the background every third of its TTL
(`Fence.start_renewing`), however long a stage runs; between passes it sleeps in slices of a
third of the TTL, checking the fence after each. Losing the lease (`LeaseLost`) ends the term at
the next fence check (a standby again). In ``run()`` an error in one stage is logged and counted
and the loop goes on; ``run_once()`` lets it propagate.

`stop(grace_s)` stops intake: long stages finish the item in hand and return (an audit stays
resumable), the lease is released, and after ``grace_s`` the loop is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from config import Settings
from protocol import keys
from protocol.clock import Clock
from protocol.records import AuditRecord, RecordError
from reconciler.audit.inventory import InventorySource
from reconciler.audit.run import ProgressCallback, run_full_audit
from reconciler.audit.schedule import AuditSchedule
from reconciler.compaction import CatalogCompactor, CompactionBeside
from reconciler.context import Fence, GcMemory, ReconcilerContext, default_owner_id
from reconciler.log_retention import Housekeeping, sweep_log
from reconciler.metrics import ReconcilerMetrics
from reconciler.pass_report import PassReport as PassReport
from reconciler.pass_report import Stopped as Stopped
from reconciler.rollup_progress import RollupProgress
from reconciler.steady import OrphanSuspects, SteadyScanner
from reconciler.v1_index import V1DropResult, drop_v1_index
from store.base import ObjectStore
from store.cas import CasExhausted
from store.errors import StoreError
from store.etag_check import check_etags
from store.lease import LeaseHeld, LeaseLost
from store.time import store_clock

from .gc.run import run_gc, settle_stale_deletions

log = structlog.get_logger(__name__)
LOG_SWEEP_INTERVAL_S = 600.0  # consumed log segments and entries are looked for this often
T = TypeVar("T")


class Reconciler:
    def __init__(
        self,
        *,
        store: ObjectStore,
        settings: Settings,
        clock: Clock,
        rng: random.Random,
        metrics: ReconcilerMetrics | None = None,
        owner: str | None = None,
        inventory: InventorySource | None = None,
        audit_progress: ProgressCallback | None = None,
        gc_store: ObjectStore | None = None,
        audit_in_child: bool = False,
    ) -> None:
        """``gc_store``: the GC role's store (`ReconcilerContext.gc_store`); by default
        opened from ``store.gc_credentials_profile`` for each GC run. ``audit_in_child``:
        `run` audits in a child process (`AuditSchedule`; ``store`` must then be the store
        ``settings.store`` opens)."""
        self._store = store
        self._gc_store = gc_store
        self._settings = settings
        self._clock = store_clock(store, clock)  # leases, audits, GC: store time (§3.8)
        self._rng = rng
        self.metrics = metrics or ReconcilerMetrics(clock=self._clock)
        self.metrics.watch_store_clock(self._clock)
        self.rollup_progress = RollupProgress(self.metrics)
        self.owner = owner or default_owner_id()
        self._inventory = inventory
        self._audit_progress = audit_progress
        self._stopping = asyncio.Event()
        self._done = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None
        self._fence: Fence | None = None
        self._last_gc: float | None = None
        self.compactor = CatalogCompactor()
        self.compaction_beside = CompactionBeside(self.compactor)
        self.suspects = OrphanSuspects()
        self.gc_memory = GcMemory()
        self._etags_attest: bool | None = None
        self._last_log_sweep: float | None = None
        self.housekeeping = Housekeeping(self._clock)
        self.audits = AuditSchedule(
            settings=settings,
            metrics=self.metrics,
            progress=audit_progress,
            inventory=inventory,
            in_child=audit_in_child,
        )

    @property
    def active(self) -> bool:
        """True while this instance holds the lease (as far as it knows)."""
        return self._fence is not None and not self._fence.lost

    @property
    def _ttl_s(self) -> float:
        return self._settings.reconciler.lease_ttl_s

    # --- the daemon loop ----------------------------------------------------------------

    async def run(self) -> None:
        """Run until `stop`: standby while another instance holds the lease."""
        self._task = asyncio.current_task()
        try:
            while not self._stopping.is_set():
                fence = await self._acquire(wait_s=None)
                if fence is None:
                    return
                ctx = await self._context_checked(fence)
                scanner = SteadyScanner(ctx, self.suspects)
                try:
                    while not self._stopping.is_set():
                        started = self._clock.monotonic()
                        await self._pass(ctx, scanner, isolate_errors=True, background_audit=True)
                        await self.rollup_progress.refresh(ctx)  # never raises
                        interval = self._settings.reconciler.loop_interval_s
                        await self._idle(ctx, interval - (self._clock.monotonic() - started))
                except LeaseLost as exc:
                    log.warning("reconciler_now_standby", reason=str(exc))
                finally:
                    await self.compaction_beside.stop()
                    await self.audits.stop()
                    await self._end_term(fence)
        finally:
            self._done.set()

    async def stop(self, grace_s: float) -> None:
        """Stop intake, let the item in hand finish within ``grace_s``, then cancel."""
        self._stopping.set()
        task = self._task
        if task is None or task.done() or task is asyncio.current_task():
            return
        try:
            await asyncio.wait_for(self._done.wait(), grace_s)
        except TimeoutError:
            log.warning("reconciler_stop_grace_exceeded", grace_s=grace_s)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- one-shot work (CLI, cron, tests) -----------------------------------------------

    async def run_once(self, *, lease_wait_s: float | None = None) -> PassReport:
        """One pass of everything due. Raises `LeaseHeld` if another instance stays active
        for ``lease_wait_s`` (default 1.5 TTL: a crashed holder's lease runs out in one)."""
        return await self.one_shot(
            lambda ctx: self._pass(ctx, SteadyScanner(ctx, self.suspects), isolate_errors=False),
            lease_wait_s,
        )

    async def audit_once(self, *, lease_wait_s: float | None = None) -> AuditRecord:
        """A full audit now (resuming a running one). Raises `LeaseHeld` like `run_once`."""
        return await self.one_shot(
            lambda ctx: run_full_audit(
                ctx, progress=self._audit_progress, inventory=self._inventory
            ),
            lease_wait_s,
        )

    async def gc_once(self, *, dry_run: bool, lease_wait_s: float | None = None) -> Any:
        """One GC run (`reconciler.gc.run.run_gc`). Raises `GcRefused` when the guard trips."""
        return await self.one_shot(lambda ctx: run_gc(ctx, dry_run=dry_run), lease_wait_s)

    async def drop_v1_index_once(
        self, *, dry_run: bool, lease_wait_s: float | None = None
    ) -> V1DropResult:
        """Delete a migrated version-1 store's old index (`reconciler.v1_index`). Raises
        `V1DropRefused` before a completed audit of the index, `LeaseHeld` like `run_once`."""
        return await self.one_shot(lambda ctx: drop_v1_index(ctx, dry_run=dry_run), lease_wait_s)

    async def one_shot(
        self, work: Callable[[ReconcilerContext], Awaitable[T]], lease_wait_s: float | None
    ) -> T:
        wait = lease_wait_s if lease_wait_s is not None else 1.5 * self._ttl_s
        fence = await self._acquire(wait_s=wait)
        if fence is None:
            raise Stopped("stopped before the lease was acquired")
        try:
            return await work(await self._context_checked(fence))
        finally:
            await self._end_term(fence)

    # --- stages -------------------------------------------------------------------------

    async def _pass(
        self,
        ctx: ReconcilerContext,
        scanner: SteadyScanner,
        *,
        isolate_errors: bool,
        background_audit: bool = False,
    ) -> PassReport:
        """One pass: the steady pass, the audit when due, compaction, the GC when due.

        ``background_audit`` (the daemon): a due audit starts as a task of its own and the
        loop goes on cataloging beside it (PROTOCOL §3.9: an audit never blocks the
        steady pass); `run_once` awaits it in line instead."""
        report = PassReport(epoch=ctx.epoch)
        report.steady = await self._stage("steady", scanner.run_pass, isolate_errors)
        if not self._stopping.is_set():
            if background_audit:
                await self._stage("audit", lambda: self.audits.start_if_due(ctx), isolate_errors)
            else:
                report.audit = await self._stage(
                    "audit", lambda: self.audits.run_if_due(ctx), isolate_errors
                )
        if not self._stopping.is_set():
            # An audit running here pinned the catalog files it will read: compaction
            # merges, but deletes no input until it is done (PROTOCOL §3.7 pins).
            hold = self.audits.running
            report.compaction = await self._stage(
                "compaction",
                (lambda: self.compaction_beside.step(ctx, hold_deletes=hold))
                if background_audit  # the daemon: merges beside the steady pass
                else (lambda: self.compactor.run(ctx, hold_deletes=hold)),
                isolate_errors,
            )
        if not self._stopping.is_set() and self._log_sweep_due():
            self._last_log_sweep = self._clock.monotonic()
            report.log_retention = await self._stage(
                "log_retention", lambda: sweep_log(ctx, report.steady), isolate_errors
            )
            for name, step in self.housekeeping.stages():
                await self._stage(name, functools.partial(step, ctx), isolate_errors)
        if not self._stopping.is_set() and self._gc_due():
            self._last_gc = self._clock.monotonic()
            if self._settings.gc.enabled:
                report.gc = await self._stage(
                    "gc", lambda: run_gc(ctx, dry_run=self._settings.gc.dry_run), isolate_errors
                )
            else:
                await self._stage("gc", lambda: settle_stale_deletions(ctx), isolate_errors)
        return report

    async def _stage(
        self, name: str, work: Callable[[], Awaitable[T]], isolate_errors: bool
    ) -> T | None:
        try:
            return await work()
        except LeaseLost:
            raise
        except Exception:
            self.metrics.stage_errors.labels(name).inc()
            if not isolate_errors:
                raise
            log.exception("reconciler_stage_failed", stage=name)
            return None

    def _log_sweep_due(self) -> bool:
        return (
            self._last_log_sweep is None
            or self._clock.monotonic() - self._last_log_sweep >= LOG_SWEEP_INTERVAL_S
        )

    def _gc_due(self) -> bool:
        if self._last_gc is None:
            return True
        every = max(self._settings.reconciler.loop_interval_s, self._settings.gc.mark_grace_s)
        return self._clock.monotonic() - self._last_gc >= every

    # --- lease --------------------------------------------------------------------------

    async def _acquire(self, *, wait_s: float | None) -> Fence | None:
        """Take the lease, waiting as a standby (forever when ``wait_s`` is None): ``None``
        when stopped; the last `LeaseHeld` (or store error) raised when ``wait_s`` runs out."""
        deadline = None if wait_s is None else self._clock.monotonic() + wait_s
        last_seen: tuple[str, int] | None = None  # log the holder once, not every poll
        while not self._stopping.is_set():
            try:
                fence = await Fence.acquire(
                    self._store,
                    owner=self.owner,
                    ttl_s=self._ttl_s,
                    clock=self._clock,
                    rng=self._rng,
                )
            except LeaseHeld as held:
                error: Exception = held
                remaining_s = (held.expires_at_unix_ns - self._clock.now_ns()) / 1e9
                pause = min(self._ttl_s, max(0.05, remaining_s)) + self._rng.uniform(
                    0, self._ttl_s / 20
                )
                if (held.holder, held.epoch) != last_seen:
                    last_seen = (held.holder, held.epoch)
                    log.info("reconciler_standby", holder=held.holder, epoch=held.epoch)
            except (CasExhausted, StoreError, RecordError) as exc:
                # RecordError: the lease object is not a lease. An operator must look; until
                # then nobody can hold it, and we keep trying rather than exit.
                error = exc
                pause = self._rng.uniform(0.5, 1.0) * min(self._ttl_s / 3, 5.0)
                log.warning("reconciler_lease_unavailable", error=str(exc))
            else:
                fence.start_renewing(self._rng)
                self._fence = fence
                self.metrics.active.set(1)
                self.metrics.lease_epoch.set(fence.epoch)
                return fence
            self.metrics.active.set(0)
            if deadline is not None:
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    raise error
                pause = min(pause, left)
            await self._sleep(pause)
        return None

    async def _end_term(self, fence: Fence) -> None:
        self._fence = None
        self.metrics.active.set(0)
        await fence.stop_renewing()
        if not fence.lost:
            await fence.release()

    async def _context_checked(self, fence: Fence) -> ReconcilerContext:
        """`_context`, after checking (once per process) whether the store's ETags attest a
        record (PROTOCOL §3.6); unknown (the store did not answer) counts as no."""
        if self._etags_attest is None:
            try:
                check = await check_etags(self._store, keys.PROBE_PREFIX + "reconciler-")
            except StoreError as exc:
                log.warning("etag_check_failed", error=str(exc))
                return self._context(fence, etags_attest=False)
            self._etags_attest = check.agree
            if not check.agree:
                log.warning("store_etags_cannot_attest", detail=check.detail)
        return self._context(fence, etags_attest=self._etags_attest)

    def _context(self, fence: Fence, *, etags_attest: bool = True) -> ReconcilerContext:
        return ReconcilerContext(
            store=self._store,
            clock=self._clock,
            rng=self._rng,
            settings=self._settings,
            metrics=self.metrics,
            fence=fence,
            log=structlog.get_logger("reconciler").bind(epoch=fence.epoch),
            stopping=self._stopping,
            inventory=self._inventory,
            on_catalog_written=self.compactor.touched,
            gc_suspects=self.suspects.take_older_than,
            gc_memory=self.gc_memory,
            recently_referenced=self.suspects.recently_referenced,
            etags_attest=etags_attest,
            gc_store=self._gc_store,
        )

    # --- waiting ------------------------------------------------------------------------

    async def _idle(self, ctx: ReconcilerContext, seconds: float) -> None:
        """Sleep ``seconds`` (or until stopped) in slices, keeping the lease renewed."""
        end = self._clock.monotonic() + max(0.0, seconds)
        while not self._stopping.is_set():
            await ctx.check_fence()
            left = end - self._clock.monotonic()
            if left <= 0:
                return
            await self._sleep(min(left, self._ttl_s / 3))

    async def _sleep(self, seconds: float) -> None:
        """`Clock.sleep`, cut short by `stop`."""
        if self._stopping.is_set():
            return
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        stopper = asyncio.ensure_future(self._stopping.wait())
        _done, pending = await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
