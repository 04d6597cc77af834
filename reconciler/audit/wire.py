"""The lines the daemon and its audit worker exchange (`reconciler.audit.child`,
`reconciler.audit.worker`): one JSON object per line, on the worker's standard input and
output. Also the worker's counters, relayed as snapshots so the daemon's metrics count
the audit's work as they did when it ran in the daemon's own process."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from prometheus_client import Counter

from reconciler.audit.progress import AuditProgress
from reconciler.metrics import ReconcilerMetrics

LINE_LIMIT = 64 * 1024 * 1024
"""Longest line either side reads (a catalog file, base64): an audit chunk's file is far
smaller; a longer line is an error, never an unbounded buffer."""
METRICS_INTERVAL_S = 1.0
"""The worker sends a counter snapshot at most this often (and at its end)."""
RELAYED_GAUGES = ("audit_manifests", "audit_quarantines", "audit_groups_done")
COMPLETED_GAUGE = "last_audit_completed"

Snapshot = dict[str, list[tuple[dict[str, str], float]]]


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def progress_doc(progress: AuditProgress) -> dict[str, Any]:
    return dataclasses.asdict(progress)


def progress_of(doc: dict[str, Any]) -> AuditProgress:
    fields = {f.name for f in dataclasses.fields(AuditProgress)}
    return AuditProgress(**{k: v for k, v in doc.items() if k in fields})


def metric_snapshot(metrics: ReconcilerMetrics) -> Snapshot:
    """Every counter's totals by labels, and the audit's gauges."""
    snapshot: Snapshot = {}
    for name, metric in vars(metrics).items():
        if isinstance(metric, Counter):
            values = [
                (dict(sample.labels), sample.value)
                for family in metric.collect()
                for sample in family.samples
                if sample.name.endswith("_total")
            ]
            if any(value for _labels, value in values):
                snapshot[name] = values
        elif name in (*RELAYED_GAUGES, COMPLETED_GAUGE):
            snapshot[name] = [
                ({}, sample.value) for family in metric.collect() for sample in family.samples
            ]
    return snapshot


class MetricRelay:
    """Applies a worker's snapshots to the daemon's metrics: counters by the increase
    since the previous snapshot (a new worker starts from zero), gauges as they are."""

    def __init__(self, metrics: ReconcilerMetrics) -> None:
        self._metrics = metrics
        self._seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def apply(self, snapshot: dict[str, Any]) -> None:
        for name, values in snapshot.items():
            metric = getattr(self._metrics, name, None)
            for labels, value in values:
                if name == COMPLETED_GAUGE:
                    if value:
                        self._metrics.last_audit_completed.set(value)
                elif name in RELAYED_GAUGES:
                    getattr(self._metrics, name).set(value)
                elif isinstance(metric, Counter):
                    key = (name, tuple(sorted(labels.items())))
                    increase = value - self._seen.get(key, 0.0)
                    self._seen[key] = value
                    if increase > 0:
                        (metric.labels(**labels) if labels else metric).inc(increase)
