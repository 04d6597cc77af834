"""One active reconciler per store: the lease, standby takeover, and the fence that keeps a
paused former leader from writing (on a `ManualClock`: expiry without waiting)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from chaos.faulty_store import Fault, FaultyStore
from chaos.sim.runtime import SimClock, run_virtual
from index.audits import audit_keys, read_audit
from protocol import keys
from protocol.clock import ManualClock
from protocol.records import LeaseRecord
from reconciler.audit.records import latest_completed_audit
from reconciler.context import Fence
from reconciler.daemon import Reconciler
from reconciler.steady import SteadyScanner, read_checkpoint
from store.base import ObjectInfo
from store.lease import LeaseHeld, LeaseLost
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    catalog_keys,
    context,
    keys_under,
    log_rows,
    make_settings,
    write_batches,
)

TTL_S = 30.0
NS = 1_000_000_000


async def test_a_second_reconciler_is_refused_while_the_first_holds_the_lease(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    first = await context(memory_store, clock, owner="reconciler-a")
    with pytest.raises(LeaseHeld) as held:
        await context(memory_store, clock, owner="reconciler-b")
    assert held.value.holder == "reconciler-a"

    standby = Reconciler(
        store=memory_store,
        settings=make_settings(),
        clock=clock,
        rng=random.Random(3),
        owner="reconciler-b",
    )
    with pytest.raises(LeaseHeld):
        await standby.run_once(lease_wait_s=0)
    assert not standby.active
    await first.check_fence()  # untouched by the refused attempts


async def test_standby_takes_over_after_expiry_and_the_former_leader_cannot_write(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=3)
    await log_rows(memory_store, clock, batches)
    leader = await context(memory_store, clock, owner="reconciler-a")
    await SteadyScanner(leader).run_pass()
    assert {b.key for b in batches} <= await catalog_keys(memory_store)
    clock.advance(TTL_S + 1)  # the leader is paused past its expiry

    successor = await context(memory_store, clock, owner="reconciler-b")
    assert successor.epoch == leader.epoch + 1

    # New work for a steady pass: batches whose log rows arrive after the takeover.
    later = await write_batches(memory_store, agents=1, per_agent=2, first_agent=5)
    await log_rows(memory_store, clock, later, seed=4)
    before = await keys_under(memory_store)
    checkpoint = await read_checkpoint(memory_store)
    assert checkpoint is not None and checkpoint.owner_epoch == leader.epoch
    with pytest.raises(LeaseLost):
        await leader.check_fence()
    with pytest.raises(LeaseLost):
        await SteadyScanner(leader).run_pass()
    assert await keys_under(memory_store) == before  # it wrote no catalog file, no marker
    assert await read_checkpoint(memory_store) == checkpoint
    assert not {b.key for b in later} & await catalog_keys(memory_store)

    await SteadyScanner(successor).run_pass()
    assert {b.key for b in later} <= await catalog_keys(memory_store)
    moved = await read_checkpoint(memory_store)
    assert moved is not None and moved.owner_epoch == successor.epoch


async def test_fence_renews_past_half_ttl_and_stays_valid(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    ctx = await context(memory_store, clock)
    first_expiry = ctx.fence.lease.record.expires_at_unix_ns
    clock.advance(TTL_S * 0.6)

    await ctx.check_fence()

    assert ctx.fence.lease.record.expires_at_unix_ns > first_expiry
    assert ctx.fence.lease.record.epoch == 1
    clock.advance(TTL_S * 0.6)
    await ctx.check_fence()  # renewed again, never lost


async def test_daemon_waits_as_standby_then_takes_over(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    await log_rows(memory_store, clock, await write_batches(memory_store, agents=1, per_agent=2))
    holder = await context(memory_store, clock, owner="reconciler-a")  # never renews
    standby = Reconciler(
        store=memory_store,
        settings=make_settings(),
        clock=clock,
        rng=random.Random(4),
        owner="reconciler-b",
    )
    task = asyncio.create_task(standby.run())
    for _ in range(10_000):  # the manual clock makes every wait instant: just yield
        if await read_checkpoint(memory_store) is not None:
            break
        await asyncio.sleep(0)
    checkpoint = await read_checkpoint(memory_store)
    assert checkpoint is not None and checkpoint.owner_epoch == holder.epoch + 1
    assert clock.now_ns() > holder.fence.lease.record.expires_at_unix_ns

    await standby.stop(grace_s=5.0)
    await task
    assert not standby.active
    lease_body, _ = await memory_store.get(keys.RECONCILER_LEASE_KEY)
    assert b"reconciler-b" in lease_body  # released: expired now, still naming its last owner
    await context(memory_store, clock, owner="reconciler-c")  # free at once after release


# --- background renewal, on virtual time (chaos.sim.runtime) ------------------------------


class SlowListings:
    """A store whose listings of ``slow_prefix`` take ``delay_s`` before the first page
    (a big bucket's listing), and which records every lease record written."""

    def __init__(self, inner: MemoryStore, *, slow_prefix: str, delay_s: float) -> None:
        self.inner = inner
        self.url = inner.url
        self.slow_prefix = slow_prefix
        self.delay_s = delay_s
        self.leases_written: list[LeaseRecord] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        etag = await self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)
        if key == keys.RECONCILER_LEASE_KEY:
            self.leases_written.append(LeaseRecord.from_json(body))
        return etag

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        if prefix.startswith(self.slow_prefix):
            await asyncio.sleep(self.delay_s)
        async for info in self.inner.list(prefix, start_after):
            yield info

    async def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        if prefix.startswith(self.slow_prefix):
            await asyncio.sleep(self.delay_s)
        async for folder in self.inner.common_prefixes(prefix):
            yield folder


def test_a_listing_longer_than_the_ttl_keeps_the_lease_and_the_audit_completes_once() -> None:
    """An active and a standby reconciler; the audit's listing of ``accepted/v1/`` takes
    1.5 TTL. The lease never changes hands, and exactly one audit completes."""

    async def main() -> tuple[list[str], list[LeaseRecord], bool]:
        clock = SimClock()
        memory = MemoryStore(clock=clock)
        await write_batches(memory, agents=2, per_agent=3, start_ns=clock.now_ns())
        store = SlowListings(memory, slow_prefix=keys.ACCEPTED_PREFIX, delay_s=1.5 * TTL_S)

        def reconciler(owner: str, seed: int) -> Reconciler:
            return Reconciler(
                store=store,  # type: ignore[arg-type]
                settings=make_settings(),
                clock=clock,
                rng=random.Random(seed),
                owner=owner,
            )

        active, standby = reconciler("reconciler-a", 1), reconciler("reconciler-b", 2)
        tasks = [asyncio.create_task(active.run())]
        for _ in range(100):  # virtual seconds: the active one takes the free lease at once
            if active.active:
                break
            await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(standby.run()))
        for _ in range(int(20 * TTL_S)):
            if await latest_completed_audit(memory) is not None:
                break
            await asyncio.sleep(1.0)
        await asyncio.sleep(3 * TTL_S)  # the standby keeps trying meanwhile
        still_active = active.active
        await standby.stop(grace_s=5.0)
        await active.stop(grace_s=5.0)
        await asyncio.gather(*tasks)
        completed = [
            key
            for key in await audit_keys(memory)
            if (record := await read_audit(memory, key)) and record.status == "completed"
        ]
        return completed, store.leases_written, still_active

    completed, leases, still_active = run_virtual(main)
    assert len(completed) == 1
    assert still_active
    assert {(lease.owner, lease.epoch) for lease in leases} == {("reconciler-a", 1)}
    assert len(leases) > 4  # taken, renewed in the background, released


def test_a_background_renewal_that_finds_the_lease_taken_makes_the_next_check_raise() -> None:
    async def main() -> None:
        clock = SimClock()
        store = FaultyStore(MemoryStore(clock=clock))
        fence = await Fence.acquire(
            store, owner="reconciler-a", ttl_s=TTL_S, clock=clock, rng=random.Random(1)
        )
        fence.start_renewing(random.Random(2))
        # Two renewals fail (503, then an unknown outcome that did not land): retried.
        store.script(
            "put_if_match",
            keys.RECONCILER_LEASE_KEY,
            Fault.UNAVAILABLE,
            Fault.UNKNOWN_NOT_APPLIED,
        )
        await asyncio.sleep(3 * TTL_S)
        await fence.check()  # renewed in the background: no fence check renewed it
        assert fence.lease.record.expires_at_unix_ns > clock.now_ns() + TTL_S * 0.6 * NS
        taken = LeaseRecord(
            owner="reconciler-b", epoch=2, expires_at_unix_ns=clock.now_ns() + int(TTL_S * NS)
        )
        await store.inner.put(keys.RECONCILER_LEASE_KEY, taken.to_json())
        await asyncio.sleep(TTL_S / 2)
        assert fence.lost
        with pytest.raises(LeaseLost):
            await fence.check()
        await fence.stop_renewing()
        assert not await fence.release()  # lost: nothing written
        stored = LeaseRecord.from_json((await store.inner.get(keys.RECONCILER_LEASE_KEY))[0])
        assert stored == taken

    run_virtual(main)
