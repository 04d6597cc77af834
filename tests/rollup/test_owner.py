"""The rollup owner lease: epochs, renewal past half the TTL, and losing it."""

from __future__ import annotations

import json

import pytest

from chaos.faulty_store import Fault, FaultyStore
from protocol.clock import ManualClock
from protocol.keys import ROLLUP_OWNER_KEY
from rollup.table.owner import OwnerLease, OwnerLost
from store.lease import LeaseHeld
from store.memory import MemoryStore
from tests.rollup.dataset_builder import commit_rows


async def test_epochs_grow_with_each_owner_and_are_recorded_in_snapshots() -> None:
    store, clock = MemoryStore(), ManualClock()
    first = await OwnerLease.acquire(store, "job-1", 60, clock)
    assert (first.epoch, first.owner) == (1, "job-1")
    record = json.loads((await store.get(ROLLUP_OWNER_KEY))[0])
    assert record == {"owner": "job-1", "epoch": 1, "expires_at_unix_ns": first.expires_at_unix_ns}
    with pytest.raises(LeaseHeld):
        await OwnerLease.acquire(store, "job-2", 60, clock)
    one = await commit_rows(store, first, clock)
    assert await first.release()
    second = await OwnerLease.acquire(store, "job-2", 60, clock)  # released: no wait
    assert second.epoch == 2
    two = await commit_rows(store, second, clock)
    assert (one.snapshot.owner_epoch, two.snapshot.owner_epoch) == (1, 2)
    with pytest.raises(OwnerLost):
        await first.check()  # released leases are gone for good


async def test_check_renews_past_half_the_ttl() -> None:
    store, clock = MemoryStore(), ManualClock()
    owner = await OwnerLease.acquire(store, "job-1", 60, clock)
    expiry = owner.expires_at_unix_ns
    clock.advance(20)
    await owner.check()
    assert owner.expires_at_unix_ns == expiry  # not yet due
    clock.advance(15)
    await owner.check()
    assert owner.expires_at_unix_ns == clock.now_ns() + 60 * 10**9
    assert owner.epoch == 1


async def test_expiry_and_takeover_lose_the_lease() -> None:
    store, clock = MemoryStore(), ManualClock()
    owner = await OwnerLease.acquire(store, "job-1", 60, clock, margin_s=10)
    clock.advance(51)  # inside the margin: too close to expiry to act
    with pytest.raises(OwnerLost, match="margin"):
        await owner.check()
    with pytest.raises(OwnerLost):
        await owner.check()  # and it stays lost

    clock.advance(10)
    taken = await OwnerLease.acquire(store, "job-2", 60, clock, margin_s=10)
    assert taken.epoch == 2
    clock.advance(61)
    await OwnerLease.acquire(store, "job-3", 60, clock)  # takes over the expired lease
    other_clock = ManualClock(clock.now_ns() - 31 * 10**9)
    stale = OwnerLease(store=store, lease=taken._lease, ttl_s=60, clock=other_clock, margin_s=10)
    with pytest.raises(OwnerLost, match="changed under us"):
        await stale.check()


async def test_a_transient_renewal_failure_is_not_fatal_while_the_lease_is_valid() -> None:
    store = FaultyStore(MemoryStore())
    clock = ManualClock()
    owner = await OwnerLease.acquire(store, "job-1", 60, clock)
    clock.advance(31)
    store.script("put_if_match", ROLLUP_OWNER_KEY, Fault.UNAVAILABLE)
    expiry = owner.expires_at_unix_ns
    await owner.check()  # the renewal failed, but the lease still holds past the margin
    assert owner.expires_at_unix_ns == expiry
    await owner.check()  # renews now
    assert owner.expires_at_unix_ns > expiry


async def test_margin_must_be_below_the_ttl() -> None:
    with pytest.raises(ValueError, match="margin_s"):
        await OwnerLease.acquire(MemoryStore(), "j", 10, ManualClock(), margin_s=10)
