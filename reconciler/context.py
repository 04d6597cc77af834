"""What every reconciler stage works with: `ReconcilerContext`, and the `Fence` on its lease.

One reconciler is active per acceptance authority: the holder of the lease at
``RECONCILER_LEASE_KEY`` (`store.lease`).

**Keeping the lease.** The daemon renews it in the background (`Fence.start_renewing`)
every third of its TTL, with If-Match on the ETag we last wrote, so phases that make no
writes for a long time (the audit's up-front listing, GC listings and counts) do not let
it lapse and hand it to the standby mid-phase. A renewal that finds the record changed
marks the fence lost; store errors are retried, bounded, and the next period tries again.

Its writes are fenced twice:

1. **Before each batch of writes** a stage calls `ReconcilerContext.check_fence`. It does
   no I/O while the lease has more than half its TTL left; past half (the background
   renewal is late or not running), it renews itself. It raises `LeaseLost` when a
   renewal found the record changed (a standby took over: we were paused, partitioned or
   slow), or when the lease is within ``margin`` of expiring and could not be renewed. A
   former leader that was paused past its expiry therefore learns it lost the lease
   before it writes again.
2. **State objects the reconciler replaces** (checkpoint, audit records) carry the
   writer's ``owner_epoch`` and are updated by compare-and-swap whose ``mutate`` refuses
   a stored epoch newer than ours. That holds even if a pause falls between the fence
   check and the write.

Everything else the reconciler writes is an If-None-Match create under a name unique to
its epoch (catalog files: verified rows of immutable records, and their rollup work
markers), a problem report, or an orphan file named after its own audit, so a stale write
that slips through both checks adds only true rows and changes nothing a newer leader
relies on. Its deletes (compacted catalog inputs, unreadable catalog files moved aside,
the version-1 index after a migration) follow a fence check too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import structlog

from config import ReconcilerSettings, Settings
from index.catalog import CatalogWriter
from protocol import keys
from protocol.clock import Clock
from protocol.keys import RECONCILER_LEASE_KEY
from reconciler.audit.inventory import InventorySource
from reconciler.metrics import ReconcilerMetrics
from store import lease as leases
from store.base import ObjectStore
from store.errors import StoreError
from store.lease import Lease, LeaseLost
from store.retry import Backoff
from store.time import store_clock

from .gc.delete import LeaseTerm

if TYPE_CHECKING:
    from reconciler.gc.raw_retention import RawRetentionAdvance

log = structlog.get_logger(__name__)

# Store calls of the reconciler: every one it repeats is a read or an If-None-Match create.
DEFAULT_BACKOFF = Backoff(attempts=5, base_s=0.05, cap_s=2.0)


def default_owner_id() -> str:
    """``<host>-<pid>-<random>``: unique per process, so a restarted reconciler on the same
    host never mistakes its predecessor's lease for its own."""
    host = socket.gethostname().split(".")[0][:64] or "host"
    return f"reconciler-{host}-{os.getpid()}-{secrets.token_hex(3)}"


class Fence(leases.LeaseHolder):
    """Our hold on the reconciler lease. Create with `Fence.acquire`."""

    def __init__(self, *, store: ObjectStore, clock: Clock, lease: Lease, ttl_s: float) -> None:
        self._store = store
        self._clock = clock
        self._lease = lease
        self._ttl_s = ttl_s
        # Stop acting this long before expiry: absorbs clock skew and the time between the
        # check and the write it guards.
        self.margin_s = ttl_s / 6
        self._lost: LeaseLost | None = None
        self._renewing = asyncio.Lock()
        self._renewer: asyncio.Task[None] | None = None
        # When we took the lease, on the clock that wrote its expiry.
        self._started_at_unix_ns = lease.record.expires_at_unix_ns - int(ttl_s * 1e9)

    @classmethod
    async def acquire(
        cls,
        store: ObjectStore,
        *,
        owner: str,
        ttl_s: float,
        clock: Clock,
        rng: random.Random,
        key: str = RECONCILER_LEASE_KEY,
    ) -> Fence:
        """Take the lease. Raises `LeaseHeld` while another owner's lease is unexpired,
        `CasExhausted`/store errors when the store did not settle it (retry later)."""
        taken = await leases.acquire(store, key, owner=owner, ttl_s=ttl_s, clock=clock, rng=rng)
        log.info("reconciler_lease_acquired", owner=owner, epoch=taken.record.epoch)
        return cls(store=store, clock=clock, lease=taken, ttl_s=ttl_s)

    @property
    def lease(self) -> Lease:
        return self._lease

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def term(self) -> LeaseTerm:
        """Our epoch, the lease's current expiry and when we took it (for the GC)."""
        return LeaseTerm(
            epoch=self.epoch,
            expires_at_unix_ns=self._lease.record.expires_at_unix_ns,
            started_at_unix_ns=self._started_at_unix_ns,
        )

    async def check(self, *, min_remaining_s: float = 0.0) -> None:
        """Return only while our lease is valid with margin (renewing it past half its TTL,
        or when less than ``min_remaining_s`` is left: a caller about to record the expiry
        as a deadline, `reconciler.gc.deletion`).

        Raises `LeaseLost`; once lost, every later call raises too."""
        if self._lost is not None:
            raise self._lost
        renew_below_s = max(self._ttl_s / 2, min_remaining_s)
        if self._remaining_s() <= renew_below_s:
            async with self._renewing:  # one renewal at a time: each needs the last ETag
                if self._lost is not None:
                    raise self._lost
                if self._remaining_s() <= renew_below_s:
                    await self._renew()
        if not self._lease.is_valid(self._clock, self.margin_s):
            self._lost = LeaseLost(
                self._lease.key, self.epoch, "expired (or about to) and could not be renewed"
            )
            raise self._lost

    def start_renewing(self, rng: random.Random) -> None:
        """Renew the lease in the background every third of its TTL until `stop_renewing`,
        `release`, or until it is lost (then the next `check` raises)."""
        if self._renewer is None and self._lost is None:
            self._renewer = asyncio.create_task(
                self._renew_periodically(rng), name=f"reconciler-lease-{self.epoch}"
            )

    async def stop_renewing(self) -> None:
        task, self._renewer = self._renewer, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def release(self) -> bool:
        """Give the lease up (best effort) so a standby need not wait for the expiry."""
        await self.stop_renewing()
        if self._lost is not None:
            return False
        self._lost = LeaseLost(self._lease.key, self.epoch, "released")
        released = await leases.release(
            self._store, self._lease.key, self._lease, clock=self._clock
        )
        log.info("reconciler_lease_released", epoch=self.epoch, released=released)
        return released

    def _remaining_s(self) -> float:
        return (self._lease.record.expires_at_unix_ns - self._clock.now_ns()) / 1e9

    async def _renew_periodically(self, rng: random.Random) -> None:
        while self._lost is None:
            # Due when a third of the TTL has passed since the last renewal (a fence check
            # may have renewed meanwhile); after a failed round, a twelfth of it later.
            # Jittered a little earlier, never later.
            due_in_s = self._remaining_s() - 2 * self._ttl_s / 3
            await self._clock.sleep(max(due_in_s, self._ttl_s / 12) * rng.uniform(0.9, 1.0))
            await self._renew_with_retries(rng)

    async def _renew_with_retries(self, rng: random.Random) -> None:
        """One background renewal, retried on store errors (bounded, jittered). Repeating
        is safe: each attempt is If-Match on the ETag we hold, so one that lands after an
        unknown outcome makes the next fail with 412, and we stand down (`LeaseLost`)
        rather than believe a lease we cannot prove."""
        delays = Backoff(attempts=4, base_s=self._ttl_s / 60, cap_s=self._ttl_s / 12).delays(rng)
        while True:
            async with self._renewing:
                if self._lost is not None or self._remaining_s() > 2 * self._ttl_s / 3:
                    return  # lost, or renewed by a fence check meanwhile
                with contextlib.suppress(LeaseLost):  # recorded in self._lost
                    if await self._renew():
                        return
                if self._lost is not None:
                    return
                if not self._lease.is_valid(self._clock, self.margin_s):
                    self._lost = LeaseLost(
                        self._lease.key, self.epoch, "expired (or about to) and not renewed"
                    )
                    log.warning("reconciler_lease_lost", epoch=self.epoch, error=str(self._lost))
                    return
            delay = next(delays, None)
            if delay is None:
                return  # the next period tries again, as long as the lease lasts
            await self._clock.sleep(delay)

    async def _renew(self) -> bool:
        """Renew once (caller holds ``_renewing``): True if it landed, False on a store
        error (not fatal while the lease lasts); `LeaseLost` if the record changed."""
        try:
            self._lease = await leases.renew(
                self._store, self._lease.key, self._lease, ttl_s=self._ttl_s, clock=self._clock
            )
        except LeaseLost as exc:
            self._lost = exc
            log.warning("reconciler_lease_lost", epoch=self.epoch, error=str(exc))
            raise
        except StoreError as exc:
            log.warning("reconciler_lease_renewal_failed", epoch=self.epoch, error=str(exc))
            return False
        return True


@dataclass
class GcMemory:
    """``audits_marked``: audits whose orphans a GC run of this process already marked
    (each audit's orphans are marked once; a restart marks the latest one's again)."""

    audits_marked: set[str] = field(default_factory=set)
    raw_retention: RawRetentionAdvance | None = None
    """Raw retention's progress step (`reconciler.gc.raw_retention`), made at the first GC
    run that has ``retention.raw_days``."""


@dataclass(frozen=True, kw_only=True)
class ReconcilerContext:
    """Dependencies of every reconciler stage (steady pass, audit, GC)."""

    store: ObjectStore
    clock: Clock
    rng: random.Random
    settings: Settings
    metrics: ReconcilerMetrics
    fence: Fence
    log: Any = field(default_factory=lambda: structlog.get_logger("reconciler"))
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by `Reconciler.stop`: long stages finish the item in hand and return early."""
    backoff: Backoff = DEFAULT_BACKOFF
    inventory: InventorySource | None = None
    """The configured S3 Inventory report, if any (the GC may read ``raw-blobs/v1/`` from
    it instead of listing)."""
    on_catalog_written: Callable[[keys.UtcHour, str], None] = field(
        default=lambda _hour, _key: None
    )
    """Told the hour of every catalog file written (the daemon's compactor listens)."""
    gc_suspects: Callable[[int], list[tuple[str, int, str]]] = field(default=lambda _before: [])
    """GC candidates from the log, handed over once (`OrphanSuspects.take_older_than`)."""
    gc_memory: GcMemory = field(default_factory=lambda: GcMemory())
    """What GC runs of this process remember between runs."""
    recently_referenced: Callable[[str], bool] = field(default=lambda _sha: False)
    etags_attest: bool = True
    """Whether the store's ETags attest a record (PROTOCOL §3.6: PUT, HEAD and LIST give
    one object the same ETag; `reconciler.etag_check`). False: the steady pass reads back
    every record row."""
    """Whether a record row named this blob hash lately (`OrphanSuspects.recently_referenced`)."""
    gc_store: ObjectStore | None = None
    """The GC role's store, through which the GC makes every delete (blobs, marks,
    vetoes; `reconciler.gc.run`). None: opened per run from
    ``store.gc_credentials_profile``, or ``store`` itself without one."""

    @property
    def epoch(self) -> int:
        return self.fence.epoch

    @cached_property
    def catalog_writer(self) -> CatalogWriter:
        """The one catalog writer of this term: every stage writes through it, so its
        sequence never repeats a name within the epoch — not even the name of a file that
        was moved aside or compacted away (a repeated name could make the compaction's
        "delete my inputs by name" delete new rows)."""
        return CatalogWriter(store=self.store, clock=self.clock, rng=self.rng, epoch=self.epoch)

    @property
    def reconciler_settings(self) -> ReconcilerSettings:
        return self.settings.reconciler

    async def check_fence(self, *, min_remaining_s: float = 0.0) -> None:
        """Call before each batch of writes; raises `LeaseLost` (see the module docstring).
        ``min_remaining_s``: renew now unless the lease runs at least that much longer."""
        await self.fence.check(min_remaining_s=min_remaining_s)


async def open_context(
    store: ObjectStore,
    *,
    settings: Settings,
    clock: Clock,
    rng: random.Random,
    metrics: ReconcilerMetrics | None = None,
    owner: str | None = None,
) -> ReconcilerContext:
    """Acquire the lease and build a context (tests, one-shot tools). Raises `LeaseHeld`."""
    clock = store_clock(store, clock)  # leases, audits, GC: store time (PROTOCOL §3.8)
    fence = await Fence.acquire(
        store,
        owner=owner or default_owner_id(),
        ttl_s=settings.reconciler.lease_ttl_s,
        clock=clock,
        rng=rng,
    )
    return ReconcilerContext(
        store=store,
        clock=clock,
        rng=rng,
        settings=settings,
        metrics=metrics or ReconcilerMetrics(clock=clock),
        fence=fence,
    )
