"""The lag gauge ``lm_reconciler_log_lag_seconds`` (`reconciler.log_lag`): how long the
oldest segment not yet consumed has waited, fresh at each scrape, also while a pass is
stuck (bench/RESULTS.md, steady_lag: it read 1-2 s while segments had waited 160 s)."""

from __future__ import annotations

import asyncio
from typing import Any

from protocol import keys
from protocol.clock import ManualClock
from reconciler.log_lag import LogLag, lag_seconds
from reconciler.steady import SteadyScanner
from store.memory import MemoryStore
from tests.reconciler.conftest import context, log_rows, write_batches

S = keys.NS_PER_S
GAUGE = "lm_reconciler_log_lag_seconds"


class StallingLogReads(MemoryStore):
    """GETs of log segments wait until ``release`` is set (a store that stopped answering)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.release = asyncio.Event()
        self.stalled = asyncio.Event()

    async def get(self, key: str) -> tuple[bytes, str]:
        if key.startswith(keys.INDEX_LOG_PREFIX) and not self.release.is_set():
            self.stalled.set()
            await self.release.wait()
        return await super().get(key)


async def test_a_pass_stuck_on_a_slow_store_makes_the_gauge_grow(clock: ManualClock) -> None:
    store = StallingLogReads(clock=clock)
    batches = await write_batches(store, agents=1, per_agent=3)
    (segment,) = await log_rows(store, clock, batches, writer_id="c1")
    first_ns = keys.parse_index_log_segment_key(segment).time_ns  # its cut time: now
    clock.advance(3)  # it waits 3 s before a pass lists it
    ctx = await context(store, clock)
    scanner = SteadyScanner(ctx)

    def gauge() -> float | None:
        return ctx.metrics.registry.get_sample_value(GAUGE)

    running = asyncio.create_task(scanner.run_pass())
    await asyncio.wait_for(store.stalled.wait(), 5)
    stuck_at = gauge()
    assert stuck_at == (clock.now_ns() - first_ns) / S > 0  # listed, not consumed
    clock.advance(160)  # the store does not answer for 160 s (store time)
    assert gauge() == stuck_at + 160

    store.release.set()
    result = await asyncio.wait_for(running, 5)
    assert result.complete and result.segments_read == 1
    # Consumed: only segments written after the listing started may wait now, so the
    # gauge is bounded by that listing's age (160 s: it started before the stall).
    assert gauge() == 160.0
    clock.advance(5)
    second = await scanner.run_pass()
    assert second.complete and second.segments_read == 0 and gauge() == 0.0


def test_lag_is_one_definition_shared_with_status() -> None:
    """`lm-reconciler status` and the gauge use `lag_seconds`; a segment from the future
    (a writer's clock ahead) has not waited."""
    assert lag_seconds(100 * S, None) == 0.0
    assert lag_seconds(100 * S, 40 * S) == 60.0
    assert lag_seconds(100 * S, 130 * S) == 0.0
    clock = ManualClock(100 * S)
    lag = LogLag(clock)
    lag.listing_started(100 * S)
    lag.listed("a", 70 * S)
    lag.listed("b", 90 * S)
    assert lag.seconds() == 30.0
    lag.consumed(["a"])
    assert lag.seconds() == 10.0  # b waits; the listing has not reached the end yet
    lag.listing_complete()
    lag.consumed(["b"])
    assert lag.seconds() == 0.0
    clock.advance(7)
    assert lag.seconds() == 7.0  # anything written since the listing started may wait
    # A pass that stopped early leaves its listed segments waiting for the next one.
    lag.listing_started(clock.now_ns())
    lag.listed("c", 104 * S)
    lag.listing_started(clock.now_ns())
    assert lag.oldest_waiting_ns() == 100 * S
