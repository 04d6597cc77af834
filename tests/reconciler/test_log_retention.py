"""Consumed index log segments are deleted (PROTOCOL §3.7): old enough, consumed, and a
completed listing audit started after they were written; nothing else. Version-registry
entries (PROTOCOL §3.10) go once their writers' segments are past that retention."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from config import GcSettings, ReconcilerSettings, Settings
from index.versions import ENTRY_TTL_S, write_entry
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.run import run_full_audit
from reconciler.gc.run import latest_listing_audit
from reconciler.log_retention import (
    REGISTRY_SWEEP_INTERVAL_S,
    Housekeeping,
    delete_consumed_segments,
    sweep_version_registry,
)
from reconciler.steady import SteadyScanner
from store.counting import CountingStore, area_of
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    catalog_keys,
    context,
    keys_under,
    log_rows,
    make_settings,
    write_batches,
)

DAY_S = 24 * 3600.0


async def test_consumed_segments_go_after_retention_and_an_audit_and_only_those(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=2)
    old = await log_rows(memory_store, clock, batches, writer_id="c1")
    settings = make_settings(lookback_s=70.0)
    ctx = await context(memory_store, clock, settings=settings)
    scanner = SteadyScanner(ctx)
    first = await scanner.run_pass()
    assert first.checkpoint is not None

    # Consumed, but no audit started after it was written: kept, however old.
    clock.advance(4 * DAY_S)
    await ctx.check_fence()
    kept = await delete_consumed_segments(
        ctx, log_through_ns=first.checkpoint.log_through_ns, audit_started_ns=None
    )
    assert kept.deleted == 0 and set(old) <= await keys_under(memory_store, keys.INDEX_LOG_PREFIX)

    await run_full_audit(ctx)
    audit = await latest_listing_audit(memory_store)
    assert audit is not None
    # A newer segment the pass has not consumed (its position is behind it): kept.
    clock.advance(10.0)
    fresh = await write_batches(
        memory_store, agents=1, per_agent=2, first_agent=1, start_ns=clock.now_ns()
    )
    young = await log_rows(memory_store, clock, fresh, writer_id="c2")
    later = await scanner.run_pass()
    assert later.checkpoint is not None
    through = later.checkpoint.log_through_ns
    counting = CountingStore(memory_store)
    ctx = await context(counting, clock, settings=settings)

    result = await delete_consumed_segments(
        ctx, log_through_ns=through, audit_started_ns=audit.started_at_unix_ns
    )

    assert result.deleted == len(old) and result.oldest_kept == young[0]
    assert await keys_under(memory_store, keys.INDEX_LOG_PREFIX) == set(young)
    assert await catalog_keys(memory_store) >= {b.key for b in [*batches, *fresh]}
    # A second sweep lists only what is left: one page, nothing deleted.
    counting.clear()
    again = await delete_consumed_segments(
        ctx, log_through_ns=through, audit_started_ns=audit.started_at_unix_ns
    )
    assert again.deleted == 0 and counting.listed[area_of(keys.INDEX_LOG_PREFIX)] <= len(young)


async def test_retention_shorter_than_the_retry_horizon_plus_a_day_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"must be >= max\(gc.retry_horizon_s \+ 1 day"):
        Settings(
            reconciler=ReconcilerSettings(segment_retention_s=DAY_S),
            gc=GcSettings(retry_horizon_s=DAY_S),
        )


async def test_version_entries_go_once_their_writers_segments_are_past_retention(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    settings = make_settings()
    ctx = await context(memory_store, clock, settings=settings)
    gone = keys.version_entry_key("collector", "c-gone")
    renewed = keys.version_entry_key("collector", "c-live")
    not_an_entry = keys.INDEX_VERSIONS_PREFIX + "README.txt"
    for key in (gone, renewed):
        await write_entry(memory_store, key, clock)
    await memory_store.put(not_an_entry, b"an operator's note")
    clock.advance(settings.reconciler.segment_retention_s + ENTRY_TTL_S - 1)
    await write_entry(memory_store, renewed, clock)  # its heartbeat
    assert await sweep_version_registry(ctx) == 0  # a second short of the retention + TTL
    clock.advance(2.0)
    assert await sweep_version_registry(ctx) == 1
    assert await keys_under(memory_store, keys.INDEX_VERSIONS_PREFIX) == {renewed, not_an_entry}


def test_the_registry_sweep_is_hourly_the_first_an_hour_after_the_start(clock: ManualClock) -> None:
    housekeeping = Housekeeping(clock)

    def stages() -> list[str]:
        return [name for name, _step in housekeeping.stages()]

    assert stages() == ["catalog_created"]
    clock.advance(REGISTRY_SWEEP_INTERVAL_S - 1)
    assert stages() == ["catalog_created"]
    clock.advance(1.0)
    assert stages() == ["catalog_created", "version_registry"]
    assert stages() == ["catalog_created"]  # the next an hour later
