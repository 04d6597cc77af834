"""The reconciler's Prometheus metrics: the counters the GC reports through, and what a
steady pass and an audit count."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit import run_full_audit
from reconciler.metrics import ReconcilerMetrics
from reconciler.steady import SteadyScanner
from store.memory import MemoryStore
from tests.reconciler.conftest import T0_NS, context, log_rows, write_batches, write_conflict


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
