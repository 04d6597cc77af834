"""The reconciler's Prometheus metrics: the counters the GC reports through, and what a
steady pass and an audit count."""

from __future__ import annotations

import random
from email.utils import formatdate

import pytest
from prometheus_client import generate_latest

from protocol import keys
from protocol.clock import ManualClock, SystemClock
from protocol.records import AuditRecord, LeaseRecord
from reconciler.audit.run import run_full_audit
from reconciler.daemon import Reconciler
from reconciler.metrics import ReconcilerMetrics
from reconciler.steady import SteadyScanner
from store.memory import MemoryStore
from store.s3 import S3Store
from store.time import ClockOffset, StoreClock
from tests.reconciler.conftest import (
    T0_NS,
    context,
    log_rows,
    make_settings,
    write_batches,
    write_conflict,
)
from tests.s3_servers import RunningServer, fresh_bucket

NS = 1_000_000_000

HOUR_NS = 3600 * 10**9


def test_exposition_names_and_gc_counters() -> None:
    clock = ManualClock()
    metrics = ReconcilerMetrics(clock=clock)
    metrics.record_gc(candidates=5, marked=3, vetoed=1, deleted=2)
    metrics.record_gc(deleted=1)

    text = generate_latest(metrics.registry).decode()

    for line in (
        "lm_reconciler_gc_candidates_total 5.0",
        "lm_reconciler_gc_marks_total 3.0",
        "lm_reconciler_gc_vetoes_total 1.0",
        "lm_reconciler_gc_deletions_total 3.0",
        "lm_reconciler_checkpoint_age_seconds -1.0",
        "lm_reconciler_audit_running 0.0",
    ):
        assert line in text
    with pytest.raises(ValueError):
        metrics.record_gc(deleted=-1)


def test_the_newest_audits_cost_is_exported() -> None:
    metrics = ReconcilerMetrics(clock=ManualClock())
    record = AuditRecord(
        audit_id="00c0ffee",
        started_at_unix_ns=1_000 * NS,
        ran_from_unix_ns=2_000 * NS,
        completed_at_unix_ns=2_812 * NS,
        status="completed",
        owner_epoch=1,
        engine="spark",
        keys_listed={"accepted": 7, "raw-blobs": 9},
        requests={"LIST": 3, "GET": 5},
        spilled_bytes=4096,
    )
    metrics.observe_audit(record)
    text = generate_latest(metrics.registry).decode()
    for line in (
        'lm_reconciler_audit_info{engine="spark",source="listing"} 1.0',
        "lm_reconciler_last_audit_duration_seconds 812.0",
        'lm_reconciler_audit_keys_listed{prefix="raw-blobs"} 9.0',
        'lm_reconciler_audit_requests{kind="LIST"} 3.0',
        "lm_reconciler_audit_spilled_bytes 4096.0",
    ):
        assert line in text, line


async def test_a_pass_and_an_audit_count_what_they_read_and_cataloged(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=5)
    await write_conflict(memory_store, batches[0], T0_NS)
    await log_rows(memory_store, clock, batches[:3])
    ctx = await context(memory_store, clock)
    await SteadyScanner(ctx).run_pass()
    clock.advance(42)
    await run_full_audit(ctx)

    text = generate_latest(ctx.metrics.registry).decode()

    for line in (
        "lm_reconciler_log_segments_read_total 1.0",
        "lm_reconciler_records_read_total 6.0",  # 3 by the pass, 3 by the audit
        'lm_reconciler_cataloged_rows_total{kind="accepted"} 5.0',
        'lm_reconciler_cataloged_rows_total{kind="quarantine"} 1.0',
        'lm_reconciler_steady_passes_total{result="complete"} 1.0',
        'lm_reconciler_audits_total{result="completed"} 1.0',
        "lm_reconciler_checkpoint_age_seconds 42.0",
    ):
        assert line in text
    files = len([k async for k in memory_store.list(keys.INDEX_CATALOG_PREFIX)])
    assert f'lm_reconciler_catalog_files_total{{origin="cataloged"}} {float(files)}' in text


def test_store_clock_skew_is_exported_from_the_store_clock() -> None:
    local = ManualClock(start_ns=1000 * 10**9)
    offset = ClockOffset()
    metrics = ReconcilerMetrics(clock=local)
    metrics.watch_store_clock(StoreClock(local, offset))
    assert (
        "lm_reconciler_store_clock_skew_seconds 0.0" in generate_latest(metrics.registry).decode()
    )
    # The store's clock read 100.x s when ours read 1000 s: we run 899.5 s ahead.
    offset.observe(formatdate(100, usegmt=True), sent_ns=1000 * 10**9, answered_ns=1000 * 10**9)
    text = generate_latest(metrics.registry).decode()
    assert "lm_reconciler_store_clock_skew_seconds 899.5" in text


class ShiftedClock(SystemClock):
    """The system clock, ``shift_ns`` off: a host whose clock is wrong by that much."""

    def __init__(self, shift_ns: int) -> None:
        self.shift_ns = shift_ns

    def now_ns(self) -> int:
        return super().now_ns() + self.shift_ns


@pytest.mark.s3
async def test_a_daemon_on_a_host_ahead_exports_its_skew_and_works_in_store_time(
    ministack_server: RunningServer,
) -> None:
    # A real clock two hours ahead: it must keep running in real time (a ManualClock would
    # race ahead as the background lease renewal sleeps on it, instantly, TTL/3 at a time).
    ahead = ShiftedClock(2 * HOUR_NS)
    async with S3Store(
        bucket=fresh_bucket(ministack_server),
        prefix="reconciler",
        endpoint_url=ministack_server.endpoint_url,
        clock=ahead,
    ) as store:
        reconciler = Reconciler(
            store=store, settings=make_settings(), clock=ahead, rng=random.Random(1)
        )
        report = await reconciler.run_once()

        text = generate_latest(reconciler.metrics.registry).decode()
        skew = next(
            float(line.split()[1])
            for line in text.splitlines()
            if line.startswith("lm_reconciler_store_clock_skew_seconds ")
        )
        assert skew == pytest.approx(7200, abs=5)
        # The released lease expired at the store's "now", not two hours after it; the
        # audit started in store time too (GC rule 5 compares it with its marks).
        body, _ = await store.get(keys.RECONCILER_LEASE_KEY)
        written_ns = (await store.head(keys.RECONCILER_LEASE_KEY)).last_modified_ns
        assert abs(LeaseRecord.from_json(body).expires_at_unix_ns - written_ns) < 5 * 10**9
        assert report.audit is not None
        assert abs(report.audit.started_at_unix_ns - written_ns) < 60 * 10**9
