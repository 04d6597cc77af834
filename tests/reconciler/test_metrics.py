"""The reconciler's Prometheus metrics, including the counters the GC reports through."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from protocol.clock import ManualClock
from reconciler.metrics import ReconcilerMetrics


def test_exposition_names_and_gc_counters() -> None:
    clock = ManualClock()
    metrics = ReconcilerMetrics(clock=clock)
    metrics.record_gc(candidates=5, marked=3, vetoed=1, deleted=2)
    metrics.record_gc(deleted=1)
    metrics.repairs.labels("accepted-by-blob").inc()

    text = generate_latest(metrics.registry).decode()

    for line in (
        "lm_reconciler_gc_candidates_total 5.0",
        "lm_reconciler_gc_marks_total 3.0",
        "lm_reconciler_gc_vetoes_total 1.0",
        "lm_reconciler_gc_deletions_total 3.0",
        'lm_reconciler_repairs_total{kind="accepted-by-blob"} 1.0',
        "lm_reconciler_lag_hours 0.0",
        "lm_reconciler_checkpoint_age_seconds -1.0",
        "lm_reconciler_audit_running 0.0",
    ):
        assert line in text
    with pytest.raises(ValueError):
        metrics.record_gc(deleted=-1)


def test_checkpoint_age_follows_the_clock() -> None:
    clock = ManualClock()
    metrics = ReconcilerMetrics(clock=clock)
    metrics.note_checkpoint(clock.now_ns())
    clock.advance(42)
    assert "lm_reconciler_checkpoint_age_seconds 42.0" in generate_latest(metrics.registry).decode()
