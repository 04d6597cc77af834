"""The rollup's single-owner lease (PROTOCOL §4 owner lease) on ``rollup/v1/owner.json``.

Built on `store.lease`: taken with If-None-Match (epoch 1) or, once expired, by replacing
the record with If-Match and epoch + 1; renewed with If-Match. The epoch is the
``owner_epoch`` every snapshot records. A job calls `OwnerLease.check` before each commit
(`rollup.table.commit.commit` does) and between long steps: it renews once half the TTL has
passed and raises `OwnerLost` when the lease is gone or too close to expiry to act.

Expiry is written and judged in store time (PROTOCOL §3.8, `store.time`), so owners whose
clocks disagree still agree on it. Why a margin: a commit's last request can take a while
to land. An owner therefore stops acting ``margin_s`` before its expiry, so a successor
(who waits for the expiry itself) never overlaps with it. The pointer CAS
keeps even overlapping owners from double counting; the lease keeps them from wasting
work and fences stale ones by epoch.
"""

from __future__ import annotations

import random
from typing import NoReturn

import structlog

from protocol.clock import Clock
from protocol.keys import ROLLUP_OWNER_KEY
from store import lease as leases
from store.base import ObjectStore
from store.errors import ConditionConflict, Unavailable
from store.time import store_clock

log = structlog.get_logger(__name__)

VACUUM_OWNER_PREFIX = "vacuum-"
"""`rollup.lifecycle.vacuum` holds the owner lease as ``vacuum-<uuid>``: a reader that sees such an
unexpired holder waits for it before trusting its reader lease (`rollup.read.reader_lease`)."""


class OwnerLost(Exception):
    """The owner lease is lost or expired: stop before the next commit, commit nothing
    more under this epoch. Another job may be (or soon be) the owner."""


class OwnerLease(leases.LeaseHolder):
    """The lease this job holds. Create with `OwnerLease.acquire`."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        lease: leases.Lease,
        ttl_s: float,
        clock: Clock,
        margin_s: float,
    ) -> None:
        self._store = store
        self._lease = lease
        self._ttl_s = ttl_s
        self._clock = store_clock(store, clock)  # expiries are in store time
        self._margin_s = margin_s
        self._lost: str | None = None

    @classmethod
    async def acquire(
        cls,
        store: ObjectStore,
        job_id: str,
        ttl_s: float,
        clock: Clock,
        *,
        margin_s: float | None = None,
        rng: random.Random | None = None,
    ) -> OwnerLease:
        """Take the owner lease for ``job_id`` for ``ttl_s`` seconds (epoch + 1).

        ``margin_s`` (default a fifth of the TTL) is how long before expiry the owner
        stops acting. Raises `store.lease.LeaseHeld` while another owner's lease is
        unexpired (stay idle and retry after its ``expires_at_unix_ns``), `CasExhausted`
        when racing acquirers never settled, store errors as they come.
        """
        margin = ttl_s / 5 if margin_s is None else margin_s
        if not 0 <= margin < ttl_s:
            raise ValueError(f"margin_s must be in [0, ttl_s), got {margin} for ttl {ttl_s}")
        held = await leases.acquire(
            store, ROLLUP_OWNER_KEY, owner=job_id, ttl_s=ttl_s, clock=clock, rng=rng
        )
        log.info("rollup_owner_acquired", owner=job_id, epoch=held.record.epoch)
        return cls(store=store, lease=held, ttl_s=ttl_s, clock=clock, margin_s=margin)

    async def check(self) -> None:
        """Make sure we may act now: renew past half the TTL; `OwnerLost` if we may not.

        A renewal that fails for a transient reason (store unavailable, 409, unknown
        outcome) is not fatal while the current lease is still valid beyond the margin:
        the next check renews again. A renewal refused because the record changed (taken
        over, or released) is final.
        """
        if self._lost is not None:
            raise OwnerLost(self._lost)
        now_ns = self._clock.now_ns()
        if not self._lease.is_valid(self._clock, self._margin_s):
            self._lose(f"lease epoch {self.epoch} expires within the {self._margin_s}s margin")
        remaining_s = (self.expires_at_unix_ns - now_ns) / 1e9
        if remaining_s > self._ttl_s / 2:
            return
        try:
            self._lease = await leases.renew(
                self._store, ROLLUP_OWNER_KEY, self._lease, ttl_s=self._ttl_s, clock=self._clock
            )
        except leases.LeaseLost as exc:
            self._lose(str(exc))
        except (Unavailable, ConditionConflict) as exc:
            # Transient: the lease we hold is still good past the margin (checked above).
            log.warning("rollup_owner_renew_failed", epoch=self.epoch, error=str(exc))

    async def release(self) -> bool:
        """Give the lease up so the next job need not wait for expiry (best effort; True
        if the release landed). Never raises store errors."""
        if self._lost is not None:
            return False
        released = await leases.release(
            self._store, ROLLUP_OWNER_KEY, self._lease, clock=self._clock
        )
        self._lost = "released"
        return released

    def _lose(self, detail: str) -> NoReturn:
        self._lost = f"rollup owner lease lost: {detail}"
        raise OwnerLost(self._lost)
