"""A single-owner lease on one object (PROTOCOL §4 owner lease; the reconciler's lease too).

The object holds a `LeaseRecord` ``{"owner", "epoch", "expires_at_unix_ns"}``. A lease is
taken with ``If-None-Match: *`` (epoch 1) or, once the holder's lease has expired, by
replacing its record with ``If-Match`` and epoch + 1; it is renewed and released with
``If-Match`` on the ETag the holder last wrote. Because every change is conditional on the
exact record it replaces, two owners can never both believe a write of theirs succeeded.

The epoch fences: work an owner commits carries its epoch, so a holder that was paused
past its expiry and taken over is recognisably stale even if it acts before it notices.

Expiries are written and compared in store time (PROTOCOL §3.8, `store.time`): `acquire`,
`renew` and `release` turn the clock they are given into the store's with
`store.time.store_clock`, so two hosts whose clocks disagree still agree on when a lease
ends. `Lease.is_valid` must be given a store clock too (`OwnerLease` and the reconciler's
`Fence` hold one). A holder should still stop acting a safety margin before
``expires_at`` (see `Lease.is_valid`): its last request may take a while to land.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from protocol.clock import Clock
from protocol.records import LeaseRecord
from store.base import ObjectStore
from store.cas import update_object
from store.errors import NotFound, OutcomeUnknown, PreconditionFailed, StoreError, Unavailable
from store.retry import Backoff
from store.time import StoreClock, store_clock

# Losing a takeover race means someone else now holds a fresh lease, so the next read
# settles it: a few attempts are plenty.
_ACQUIRE_BACKOFF = Backoff(attempts=4, base_s=0.05, cap_s=0.5)


class LeaseHeld(Exception):
    """Another owner holds an unexpired lease. Stay standby; try again after ``expires_at``.

    ``holder``, ``epoch`` and ``expires_at_unix_ns`` describe the lease that was found.
    """

    def __init__(self, key: str, record: LeaseRecord) -> None:
        self.key = key
        self.holder = record.owner
        self.epoch = record.epoch
        self.expires_at_unix_ns = record.expires_at_unix_ns
        super().__init__(
            f"lease {key!r} is held by {record.owner!r} (epoch {record.epoch}) "
            f"until {record.expires_at_unix_ns} ns"
        )


class LeaseLost(Exception):
    """Our lease was taken over (or removed). Stop work that needs it now, commit nothing
    more under its epoch, and `acquire` again if the role is still wanted."""

    def __init__(self, key: str, epoch: int, detail: str) -> None:
        self.key = key
        self.epoch = epoch
        super().__init__(f"lease {key!r} (epoch {epoch}) lost: {detail}")


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease we hold: the record we wrote, and its ETag (what the next write must match)."""

    key: str
    record: LeaseRecord
    etag: str

    def is_valid(self, clock: Clock, margin_s: float = 0.0) -> bool:
        """True while ``now + margin_s`` is before the expiry: act only while this holds.

        ``clock`` should be a `StoreClock` (`store.time.store_clock`); "now" is then the
        latest the store's clock may read, so an imprecise measurement shortens our lease
        rather than stretching it past the expiry a successor waits for."""
        now_ns = clock.latest_ns() if isinstance(clock, StoreClock) else clock.now_ns()
        return now_ns + int(margin_s * 1e9) < self.record.expires_at_unix_ns


class LeaseHolder:
    """What a holder of a lease shows of the one it holds now (``_lease``, replaced at
    each renewal): the base of `rollup.table.owner.OwnerLease` and the reconciler's
    `Fence`."""

    _lease: Lease

    @property
    def epoch(self) -> int:
        return self._lease.record.epoch

    @property
    def owner(self) -> str:
        return self._lease.record.owner

    @property
    def expires_at_unix_ns(self) -> int:
        return self._lease.record.expires_at_unix_ns


async def acquire(
    store: ObjectStore,
    key: str,
    *,
    owner: str,
    ttl_s: float,
    clock: Clock,
    backoff: Backoff = _ACQUIRE_BACKOFF,
    rng: random.Random | None = None,
) -> Lease:
    """Take the lease at ``key`` for ``owner`` for ``ttl_s`` seconds from now.

    Free (absent) → created with epoch 1. Expired, or already ``owner``'s → replaced with
    epoch + 1 (re-acquiring our own lease fences our earlier incarnation too).

    Raises `LeaseHeld` if another owner's lease is unexpired; `CasExhausted` if the races
    never settled (treat as held: retry later); `RecordError` if the stored record is not a
    lease (an operator must look); store errors (`Unavailable`, ...) as they come.
    """
    ttl_ns = _ttl_ns(ttl_s)
    clock = store_clock(store, clock)

    def take(body: bytes | None) -> bytes:
        now_ns = clock.now_ns()
        epoch = 1
        if body is not None:
            current = LeaseRecord.from_json(body)
            if current.owner != owner and current.expires_at_unix_ns > now_ns:
                raise LeaseHeld(key, current)
            epoch = current.epoch + 1
        return LeaseRecord(owner=owner, epoch=epoch, expires_at_unix_ns=now_ns + ttl_ns).to_json()

    result = await update_object(
        store, key, take, backoff=backoff, rng=rng or random.Random(), clock=clock
    )
    assert result.body is not None and result.etag is not None  # take() always writes
    return Lease(key, LeaseRecord.from_json(result.body), result.etag)


async def renew(store: ObjectStore, key: str, lease: Lease, *, ttl_s: float, clock: Clock) -> Lease:
    """Extend ``lease`` to ``ttl_s`` seconds from now; return the new lease to hold.

    Raises `LeaseLost` if the record is no longer the one we wrote (taken over, or
    released); `Unavailable`/`ConditionConflict` when this renewal did not land (retry
    while ``lease.is_valid``); `OutcomeUnknown` only if even the follow-up read failed.
    """
    _check_key(key, lease)
    record = _expiring(lease.record, store_clock(store, clock).now_ns() + _ttl_ns(ttl_s))
    body = record.to_json()
    try:
        etag = await store.put(key, body, if_match=lease.etag)
    except PreconditionFailed as exc:
        raise LeaseLost(key, lease.record.epoch, "the record changed under us") from exc
    except OutcomeUnknown as exc:
        # The answer was lost: a read tells whether the renewal landed.
        try:
            stored, etag = await store.get(key)
        except NotFound:
            raise LeaseLost(key, lease.record.epoch, "the record is gone") from exc
        except Unavailable:
            raise exc from None
        if stored != body:
            if etag != lease.etag:
                raise LeaseLost(key, lease.record.epoch, "the record changed under us") from exc
            raise Unavailable("renew", key, "renewal did not land") from exc
    return Lease(key, record, etag)


async def release(store: ObjectStore, key: str, lease: Lease, *, clock: Clock) -> bool:
    """Give the lease up early by marking it expired now, so a standby need not wait.

    Best effort: returns True if our release landed; False if the lease was already lost
    or the store failed or lost the answer (the lease then simply runs out at its expiry).
    Never raises store errors.
    """
    _check_key(key, lease)
    record = _expiring(lease.record, store_clock(store, clock).now_ns())
    try:
        await store.put(key, record.to_json(), if_match=lease.etag)
    except StoreError:
        return False
    return True


def _expiring(record: LeaseRecord, expires_at_unix_ns: int) -> LeaseRecord:
    return LeaseRecord(
        owner=record.owner, epoch=record.epoch, expires_at_unix_ns=expires_at_unix_ns
    )


def _ttl_ns(ttl_s: float) -> int:
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
    return int(ttl_s * 1e9)


def _check_key(key: str, lease: Lease) -> None:
    if key != lease.key:
        raise ValueError(f"lease for {lease.key!r} used on {key!r}")
