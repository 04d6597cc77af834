"""Steady-state discovery: the checkpoint advances (by CAS, fenced by epoch), the lookback
re-scans late entries, hours older than the lookback are left to the audit, lag."""

from __future__ import annotations

import pytest

from protocol import keys
from protocol.clock import ManualClock
from protocol.records import ReconcilerCheckpoint
from reconciler.steady import (
    CLOSED_HOUR_RESCAN_PASSES,
    SteadyScanner,
    lag_hours,
    read_checkpoint,
)
from store.lease import LeaseLost
from store.memory import MemoryStore
from tests.reconciler.conftest import HOUR_NS, context, make_batch, write_batch

H = keys.UtcHour.parse_iso


async def test_checkpoint_advances_to_the_current_hour_and_never_back(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    ctx = await context(memory_store, clock)
    scanner = SteadyScanner(ctx)
    now_hour = keys.UtcHour.from_unix_ns(clock.now_ns())

    first = await scanner.run_pass()
    assert first.complete and first.checkpoint is not None
    assert first.checkpoint.next_hour == now_hour.iso and first.checkpoint.owner_epoch == 1

    clock.advance(3 * 3600)
    second = await scanner.run_pass()
    assert second.checkpoint is not None and second.checkpoint.next_hour == now_hour.shifted(3).iso
    stored = await read_checkpoint(memory_store)
    assert stored == second.checkpoint


async def test_lookback_rescans_late_entries_but_not_older_hours(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    ctx = await context(memory_store, clock, settings=None)
    scanner = SteadyScanner(ctx)
    await scanner.run_pass()  # checkpoint: the current hour H
    now_ns = clock.now_ns()
    # Written late into hour H-1 (inside the 2 h lookback) and H-5 (outside it); both
    # without their accepted-by-blob entry.
    late = make_batch(1, 1, now_ns - HOUR_NS)
    old = make_batch(1, 2, now_ns - 5 * HOUR_NS)
    for batch in (late, old):
        await write_batch(memory_store, batch)
        await memory_store.delete(batch.entry_key("accepted-by-blob"))

    result = await scanner.run_pass()

    assert dict(result.outcome.created) == {"accepted-by-blob": 1}
    assert await memory_store.head(late.entry_key("accepted-by-blob"))
    assert [info.key async for info in memory_store.list(old.entry_key("accepted-by-blob"))] == []


async def test_a_pass_remembers_what_it_checked(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batch = make_batch(1, 1, clock.now_ns())
    await write_batch(memory_store, batch)
    ctx = await context(memory_store, clock)
    scanner = SteadyScanner(ctx)

    first = await scanner.run_pass()
    second = await scanner.run_pass()

    assert (first.entries_seen, first.entries_checked) == (1, 1)
    assert (second.entries_seen, second.entries_checked) == (1, 0)


async def test_a_checkpoint_written_by_a_newer_epoch_refuses_our_update(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    ctx = await context(memory_store, clock)
    newer = ReconcilerCheckpoint(
        next_hour=keys.UtcHour.from_unix_ns(clock.now_ns()).iso,
        updated_at_unix_ns=clock.now_ns(),
        owner_epoch=ctx.epoch + 1,
    )
    await memory_store.put(keys.RECONCILER_CHECKPOINT_KEY, newer.to_json())

    with pytest.raises(LeaseLost):
        await SteadyScanner(ctx).run_pass()
    assert await read_checkpoint(memory_store) == newer


def test_lag_counts_hours_past_the_checkpoint() -> None:
    assert lag_hours(H("2025-10-09T08"), None, None) == 0
    assert lag_hours(H("2025-10-09T08"), H("2025-10-09T01"), H("2025-10-09T08")) == 0
    assert lag_hours(H("2025-10-09T08"), None, H("2025-10-09T06")) == 0
    assert lag_hours(H("2025-10-09T08"), None, H("2025-10-10T01")) == 17
    assert lag_hours(None, H("2025-10-09T06"), H("2025-10-09T08")) == 3
    assert lag_hours(None, None, None) == 0


async def test_a_closed_hour_is_rescanned_every_few_passes(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    ctx = await context(memory_store, clock)
    scanner = SteadyScanner(ctx)
    await write_batch(memory_store, make_batch(1, 1, clock.now_ns() - HOUR_NS))
    first = await scanner.run_pass()
    assert (first.hours_scanned, first.hours_skipped) == (1, 0)
    late = make_batch(1, 2, clock.now_ns() - HOUR_NS)
    await write_batch(memory_store, late)
    await memory_store.delete(late.entry_key("accepted-by-blob"))

    passes = [await scanner.run_pass() for _ in range(CLOSED_HOUR_RESCAN_PASSES)]

    assert [p.hours_skipped for p in passes] == [1] * (CLOSED_HOUR_RESCAN_PASSES - 1) + [0]
    assert dict(passes[-1].outcome.created) == {"accepted-by-blob": 1}
