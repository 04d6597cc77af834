"""Consumed index log segments are deleted (PROTOCOL §3.7): old enough, consumed, and a
completed listing audit started after they were written; nothing else."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from config import GcSettings, ReconcilerSettings, Settings
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.run import run_full_audit
from reconciler.gc.run import latest_listing_audit
from reconciler.log_retention import delete_consumed_segments
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
