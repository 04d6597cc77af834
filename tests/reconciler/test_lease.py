"""One active reconciler per store: the lease, standby takeover, and the fence that keeps a
paused former leader from writing (on a `ManualClock`: expiry without waiting)."""

from __future__ import annotations

import asyncio
import random

import pytest

from protocol import keys
from protocol.clock import ManualClock
from reconciler.daemon import Reconciler
from reconciler.steady import SteadyScanner, read_checkpoint
from store.lease import LeaseHeld, LeaseLost
from store.memory import MemoryStore
from tests.reconciler.conftest import context, derived_keys_in, make_settings, write_batches

TTL_S = 30.0


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
    leader = await context(memory_store, clock, owner="reconciler-a")
    await SteadyScanner(leader).run_pass()
    clock.advance(TTL_S + 1)  # the leader is paused past its expiry

    successor = await context(memory_store, clock, owner="reconciler-b")
    assert successor.epoch == leader.epoch + 1

    missing = batches[0].entry_key("accepted-by-blob")
    await memory_store.delete(missing)
    before = await derived_keys_in(memory_store)
    checkpoint = await read_checkpoint(memory_store)
    with pytest.raises(LeaseLost):
        await leader.check_fence()
    with pytest.raises(LeaseLost):
        await SteadyScanner(leader).run_pass()
    assert await derived_keys_in(memory_store) == before  # it wrote nothing
    assert await read_checkpoint(memory_store) == checkpoint

    await SteadyScanner(successor).run_pass()
    assert missing in await derived_keys_in(memory_store)


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
    await write_batches(memory_store, agents=1, per_agent=2)
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
