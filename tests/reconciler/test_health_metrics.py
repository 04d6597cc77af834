"""The reconciler's health gauges that the Grafana dashboard reads (issue 32 item 5): the
audit's age and the sealed hours from the store (also after a restart), the rollup's
progress (`reconciler.rollup_progress`), raw retention's state, and the store latency
histogram of ``lm-reconciler``'s store."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry

from index.audits import sealed_limit_ns
from protocol import keys
from protocol.clock import ManualClock
from protocol.records import RawRetention
from reconciler.audit.records import latest_completed_audit
from reconciler.daemon import Reconciler
from reconciler.metrics import ReconcilerMetrics, with_store_latency
from reconciler.rollup_progress import REFRESH_INTERVAL_S, RollupProgress
from rollup.table.ledger import LedgerRow
from rollup.table.owner import OwnerLease
from store.counting import CountingStore
from store.memory import MemoryStore
from tests.reconciler.conftest import T0_NS, context, make_batch, make_settings, write_batch
from tests.rollup.dataset_builder import commit_rows

NS = 1_000_000_000


def gauge(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name)


async def test_a_restarted_reconciler_shows_the_audit_age_and_sealed_hours_from_the_store() -> None:
    store = MemoryStore()
    clock = ManualClock(T0_NS)
    settings = make_settings()
    first = Reconciler(store=store, settings=settings, clock=clock, rng=random.Random(1))
    await first.run_once()  # the first run ever audits
    clock.advance(30)

    restarted = Reconciler(store=store, settings=settings, clock=clock, rng=random.Random(2))
    registry = restarted.metrics.registry
    assert gauge(registry, "lm_reconciler_last_audit_completed_timestamp_seconds") == 0
    await restarted.run_once()

    record = await latest_completed_audit(store)
    assert record is not None and record.completed_at_unix_ns is not None
    completed = gauge(registry, "lm_reconciler_last_audit_completed_timestamp_seconds")
    assert completed == record.completed_at_unix_ns / NS
    margin_ns = int(settings.settle_margin_s() * NS)
    sealed = gauge(registry, "lm_reconciler_sealed_through_timestamp_seconds")
    assert sealed == sealed_limit_ns(record.started_at_unix_ns, margin_ns) / NS
    assert sealed is not None and sealed > 0


async def test_the_rollup_gauges_follow_its_commits_at_one_conditional_get_a_minute() -> None:
    store = CountingStore(MemoryStore())
    clock = ManualClock(T0_NS)
    ctx = await context(store, clock)
    progress = RollupProgress(ctx.metrics)
    registry = ctx.metrics.registry

    await progress.refresh(ctx)  # no commit yet: nothing to show, nothing fails
    assert gauge(registry, "lm_reconciler_rollup_snapshot_version") == 0

    batch = make_batch(1, 0, T0_NS)
    await write_batch(store, batch)
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    await commit_rows(store, owner, clock, ledger=[LedgerRow.of_manifest(batch.manifest)])
    await progress.refresh(ctx)  # within the interval: not read yet
    assert gauge(registry, "lm_reconciler_rollup_snapshot_version") == 0

    clock.advance(REFRESH_INTERVAL_S)
    await progress.refresh(ctx)
    assert gauge(registry, "lm_reconciler_rollup_snapshot_version") == 1
    assert gauge(registry, "lm_reconciler_rollup_committed_timestamp_seconds") == T0_NS // NS
    hour_end = keys.UtcHour.from_unix_ns(T0_NS).next().start_ns
    assert gauge(registry, "lm_reconciler_rollup_included_through_timestamp_seconds") == (
        hour_end / NS
    )

    store.clear()
    clock.advance(REFRESH_INTERVAL_S)
    await progress.refresh(ctx)  # nothing committed since: one conditional GET, no snapshot
    assert store.requests == [("get", keys.ROLLUP_POINTER_KEY)]
    await owner.release()


def test_raw_retention_state_is_exported() -> None:
    metrics = ReconcilerMetrics(clock=ManualClock(T0_NS))
    metrics.observe_raw_retention(None)
    assert gauge(metrics.registry, "lm_reconciler_raw_retention_retired_batches") == 0
    state = RawRetention(
        retired_before="2025-10-08T05", retired_batches=42, updated_at_unix_ns=T0_NS, raw_days=1
    )
    metrics.observe_raw_retention(state)
    assert gauge(metrics.registry, "lm_reconciler_raw_retention_retired_batches") == 42
    before = keys.UtcHour.parse_iso("2025-10-08T05").start_ns / NS
    assert (
        gauge(metrics.registry, "lm_reconciler_raw_retention_retired_before_timestamp_seconds")
        == before
    )


async def test_the_daemons_store_is_timed_into_its_metrics() -> None:
    timed, metrics = with_store_latency(MemoryStore(), ManualClock(T0_NS))
    await timed.put("k", b"v", if_none_match=True)
    count = metrics.registry.get_sample_value(
        "lm_store_request_seconds_count", {"op": "put_if_none_match", "result": "ok"}
    )
    assert count == 1
