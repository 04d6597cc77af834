"""Owner leases: acquire, renew, release, expiry and takeover.

Expiries are in store time (`store.time`). Tests that drive time with a `ManualClock` run
on the stores whose clock is that clock (``clocked_store``: memory and fs); an S3
server's clock is its own, so on S3 servers (``store``) only what needs no time travel
runs, plus the store-time tests at the end: hosts whose clocks disagree with MiniStack.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protocol.clock import ManualClock
from protocol.records import LeaseRecord, RecordError
from store.base import ObjectStore
from store.errors import OutcomeUnknown, Unavailable
from store.fs import FileSystemStore
from store.lease import Lease, LeaseHeld, LeaseLost, acquire, release, renew
from store.memory import MemoryStore
from store.s3 import S3Store
from store.time import store_clock
from tests.s3_servers import RunningServer, fresh_bucket

KEY = "rollup/v1/owner.json"
TTL_S = 30.0
HOUR_NS = 3600 * 10**9


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["memory", "fs"])
async def clocked_store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[ObjectStore]:
    """A fresh store whose clock is the test's ``clock``."""
    store: ObjectStore
    if request.param == "memory":
        store = MemoryStore(clock=clock)
    else:
        store = FileSystemStore(tmp_path / "store", clock=clock)
    try:
        yield store
    finally:
        await store.close()


async def test_acquire_a_free_lease(store: ObjectStore) -> None:
    clock = ManualClock()
    lease = await acquire(store, KEY, owner="job-a", ttl_s=TTL_S, clock=clock)
    assert lease.key == KEY
    assert (lease.record.owner, lease.record.epoch) == ("job-a", 1)
    body, etag = await store.get(KEY)
    assert (LeaseRecord.from_json(body), etag) == (lease.record, lease.etag)


async def test_a_lease_expires_ttl_after_it_was_taken(
    clocked_store: ObjectStore, clock: ManualClock
) -> None:
    lease = await acquire(clocked_store, KEY, owner="job-a", ttl_s=TTL_S, clock=clock)
    assert lease.record == LeaseRecord(
        owner="job-a", epoch=1, expires_at_unix_ns=clock.now_ns() + 30_000_000_000
    )


async def test_a_held_lease_is_refused_until_it_expires(
    clocked_store: ObjectStore, clock: ManualClock
) -> None:
    store = clocked_store
    held = await acquire(store, KEY, owner="job-a", ttl_s=TTL_S, clock=clock)
    clock.advance(TTL_S - 1)
    with pytest.raises(LeaseHeld) as caught:
        await acquire(store, KEY, owner="job-b", ttl_s=TTL_S, clock=clock)
    assert (caught.value.holder, caught.value.epoch) == ("job-a", 1)
    assert caught.value.expires_at_unix_ns == held.record.expires_at_unix_ns

    clock.advance(1)
    taken = await acquire(store, KEY, owner="job-b", ttl_s=TTL_S, clock=clock)
    assert (taken.record.owner, taken.record.epoch) == ("job-b", 2)


async def test_the_old_holder_learns_it_lost_the_lease(
    clocked_store: ObjectStore, clock: ManualClock
) -> None:
    store = clocked_store
    old = await acquire(store, KEY, owner="job-a", ttl_s=TTL_S, clock=clock)
    clock.advance(TTL_S + 1)
    new = await acquire(store, KEY, owner="job-b", ttl_s=TTL_S, clock=clock)
    assert not old.is_valid(clock)
    with pytest.raises(LeaseLost) as caught:
        await renew(store, KEY, old, ttl_s=TTL_S, clock=clock)
    assert caught.value.epoch == 1
    assert not await release(store, KEY, old, clock=clock)
    stored, etag = await store.get(KEY)
    assert (LeaseRecord.from_json(stored), etag) == (new.record, new.etag)


async def test_renew_extends_and_keeps_the_epoch(
    clocked_store: ObjectStore, clock: ManualClock
) -> None:
    store = clocked_store
    lease = await acquire(store, KEY, owner="job-a", ttl_s=TTL_S, clock=clock)
    for _ in range(3):
        clock.advance(TTL_S / 2)
        renewed = await renew(store, KEY, lease, ttl_s=TTL_S, clock=clock)
        assert renewed.record.epoch == 1
        assert renewed.record.expires_at_unix_ns == clock.now_ns() + 30_000_000_000
        assert renewed.etag != lease.etag
        lease = renewed
    assert lease.is_valid(clock, margin_s=TTL_S - 1)
    # The renewed lease is still ours: another owner is refused.
    with pytest.raises(LeaseHeld):
        await acquire(store, KEY, owner="job-b", ttl_s=TTL_S, clock=clock)


async def test_reacquiring_our_own_lease_fences_the_earlier_one(store: ObjectStore) -> None:
    clock = ManualClock()
    first = await acquire(store, KEY, owner="job-a", ttl_s=TTL_S, clock=clock)
    second = await acquire(store, KEY, owner="job-a", ttl_s=TTL_S, clock=clock)
    assert second.record.epoch == 2
    with pytest.raises(LeaseLost):
        await renew(store, KEY, first, ttl_s=TTL_S, clock=clock)


async def test_release_lets_a_standby_in_at_once(
    clocked_store: ObjectStore, clock: ManualClock
) -> None:
    lease = await acquire(clocked_store, KEY, owner="job-a", ttl_s=TTL_S, clock=clock)
    assert await release(clocked_store, KEY, lease, clock=clock)
    standby = await acquire(clocked_store, KEY, owner="job-b", ttl_s=TTL_S, clock=clock)
    assert (standby.record.owner, standby.record.epoch) == ("job-b", 2)


async def test_release_lets_a_standby_in_long_before_the_ttl(store: ObjectStore) -> None:
    # On an S3 server store time is only known to about a second (`store.time`).
    clock = ManualClock()
    lease = await acquire(store, KEY, owner="job-a", ttl_s=TTL_S, clock=clock)
    assert await release(store, KEY, lease, clock=clock)
    clock.advance(1)
    standby = await acquire(store, KEY, owner="job-b", ttl_s=TTL_S, clock=clock)
    assert (standby.record.owner, standby.record.epoch) == ("job-b", 2)


async def test_racing_acquirers_have_one_winner(concurrent_store: ObjectStore) -> None:
    clock = ManualClock()

    async def try_acquire(owner: str) -> Lease | None:
        try:
            return await acquire(concurrent_store, KEY, owner=owner, ttl_s=TTL_S, clock=clock)
        except LeaseHeld:
            return None

    results = await asyncio.gather(*(try_acquire(f"job-{i}") for i in range(16)))
    winners = [lease for lease in results if lease is not None]
    assert len(winners) == 1
    assert winners[0].record.epoch == 1


def test_is_valid_honours_the_margin() -> None:
    clock = ManualClock()
    lease = Lease(
        KEY, LeaseRecord(owner="a", epoch=1, expires_at_unix_ns=clock.now_ns() + 10**10), '"e"'
    )
    assert lease.is_valid(clock) and lease.is_valid(clock, margin_s=9.5)
    assert not lease.is_valid(clock, margin_s=10)
    clock.advance(10)
    assert not lease.is_valid(clock)


async def test_a_corrupt_record_is_not_taken_over() -> None:
    store = MemoryStore()
    await store.put(KEY, b"not a lease")
    with pytest.raises(RecordError):
        await acquire(store, KEY, owner="job-a", ttl_s=TTL_S, clock=ManualClock())
    assert (await store.get(KEY))[0] == b"not a lease"


async def test_bad_arguments_are_refused() -> None:
    store, clock = MemoryStore(), ManualClock()
    with pytest.raises(ValueError):
        await acquire(store, KEY, owner="job-a", ttl_s=0, clock=clock)
    lease = await acquire(store, KEY, owner="job-a", ttl_s=TTL_S, clock=clock)
    with pytest.raises(ValueError):
        await renew(store, "other/key", lease, ttl_s=TTL_S, clock=clock)
    with pytest.raises(ValueError):
        await renew(store, KEY, lease, ttl_s=-1, clock=clock)


class _LostAnswer(MemoryStore):
    """Loses the answer of the next put; ``lands`` says whether the put was applied."""

    def __init__(self, *, lands: bool) -> None:
        super().__init__()
        self.lands = lands
        self.armed = False

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if not self.armed:
            return await super().put(key, body, if_none_match=if_none_match, if_match=if_match)
        self.armed = False
        if self.lands:
            await super().put(key, body, if_none_match=if_none_match, if_match=if_match)
        raise OutcomeUnknown("put", key, "answer lost")


async def test_a_renewal_whose_answer_was_lost_is_settled_by_a_read() -> None:
    clock = ManualClock()
    landed = _LostAnswer(lands=True)
    lease = await acquire(landed, KEY, owner="job-a", ttl_s=TTL_S, clock=clock)
    landed.armed = True
    clock.advance(1)
    renewed = await renew(landed, KEY, lease, ttl_s=TTL_S, clock=clock)
    assert renewed.etag == (await landed.get(KEY))[1]

    lost = _LostAnswer(lands=False)
    lease = await acquire(lost, KEY, owner="job-a", ttl_s=TTL_S, clock=clock)
    lost.armed = True
    clock.advance(1)
    with pytest.raises(Unavailable) as caught:
        await renew(lost, KEY, lease, ttl_s=TTL_S, clock=clock)
    assert not isinstance(caught.value, OutcomeUnknown)  # known: it did not land
    assert await renew(lost, KEY, lease, ttl_s=TTL_S, clock=clock)  # and may be retried


# --- store time: hosts whose clocks disagree with the store's (MiniStack) ------------------


def host_store(server: RunningServer, bucket: str, clock: ManualClock) -> S3Store:
    """One host's view of the shared bucket: its own client, on its own clock."""
    return S3Store(bucket=bucket, prefix="lease", endpoint_url=server.endpoint_url, clock=clock)


@pytest.mark.s3
async def test_a_host_an_hour_ahead_still_sees_a_fresh_lease_held(
    ministack_server: RunningServer,
) -> None:
    bucket = fresh_bucket(ministack_server)
    behind = ManualClock(time.time_ns() - HOUR_NS)
    ahead = ManualClock(time.time_ns() + HOUR_NS)
    async with (
        host_store(ministack_server, bucket, behind) as holder_store,
        host_store(ministack_server, bucket, ahead) as other_store,
    ):
        held = await acquire(holder_store, KEY, owner="job-a", ttl_s=60, clock=behind)
        # Local clocks two hours apart; in store time the lease has a minute left.
        with pytest.raises(LeaseHeld):
            await acquire(other_store, KEY, owner="job-b", ttl_s=60, clock=ahead)
        assert held.is_valid(store_clock(holder_store, behind), margin_s=30)
        assert not held.is_valid(store_clock(holder_store, behind), margin_s=61)


@pytest.mark.s3
async def test_a_lease_taken_on_a_host_an_hour_ahead_expires_after_its_ttl(
    ministack_server: RunningServer,
) -> None:
    bucket = fresh_bucket(ministack_server)
    ahead = ManualClock(time.time_ns() + HOUR_NS)
    local = ManualClock(time.time_ns())
    async with (
        host_store(ministack_server, bucket, ahead) as holder_store,
        host_store(ministack_server, bucket, local) as other_store,
    ):
        await acquire(holder_store, KEY, owner="job-a", ttl_s=60, clock=ahead)
        # The holder died. A standby's clock 61 s on from its store's (`store.time`: it sees
        # store time 61 s later) finds the lease expired, not an hour away.
        later = ManualClock(local.now_ns() + 61 * 10**9)
        taken = await acquire(other_store, KEY, owner="job-b", ttl_s=60, clock=later)
        assert (taken.record.owner, taken.record.epoch) == ("job-b", 2)
