"""The benchmark's fleet: 1,000 series of 50 targets (5 jobs x 10 instances, 20 series
each: two request counters, CPU and network counters, memory and load gauges, ``up``, and
a classic histogram of 10 buckets with ``_sum`` and ``_count``), and their samples as a
closed form of (series, grid index), so any hour of any history is computed column-wise
without the samples before it (and the day and month stores hold the same last day).

Times: series ``i`` is sampled at ``MONTH0 + i % 15 + 15 k`` seconds (whole seconds, so
the OpenMetrics text the reference is backfilled from carries them exactly). Counters
are ``a k + b (1 - cos w k)`` with ``b w <= a`` (never decreasing), the histogram's
buckets ``floor(count(k) F_le)`` (monotone in time and in ``le``), gauges a sine plus a
hashed noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from rollup.table.series import canonical_series

T_END_S = int(datetime(2026, 11, 28, tzinfo=UTC).timestamp())
"""The end of every history (fixed, never the clock): 2026-11-28 00:00 UTC."""
DAY_S = 86_400
DAY0_S = T_END_S - DAY_S
MONTH_DAYS = 30
MONTH0_S = T_END_S - MONTH_DAYS * DAY_S
STEP_S = 15
JOBS = ("api", "web", "db", "cache", "queue")
INSTANCES = 10
LE = ("0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "+Inf")
_LE_SHARE = np.array([0.05, 0.12, 0.25, 0.42, 0.6, 0.78, 0.9, 0.96, 0.99, 1.0])

# kinds
COUNTER, GAUGE, BUCKET, HSUM, HCOUNT = range(5)

DENSE_MONTH = ("process_cpu_seconds_total", "api")
"""The 10 series sampled every 15 s over the whole month: ``process_cpu_seconds_total``
of job ``api`` (the 30-day panel's selector)."""


@dataclass(frozen=True)
class Fleet:
    """The series, in canonical series-string order (a ``points`` file's order)."""

    metric: list[str]
    labels: list[dict[str, str]]
    series: list[str]
    kind: np.ndarray  # int8
    param: np.ndarray  # (n, 4) float64: a, b, w, phase (or the bucket's share in a)
    offset_s: np.ndarray  # int64, 0..14
    dense_month: np.ndarray  # bool

    @property
    def size(self) -> int:
        return len(self.series)

    def values(self, index: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Sample values of series ``index`` (per row) at grid index ``k`` (per row)."""
        kf = k.astype(np.float64)
        a, b, w, phase = (self.param[index, j] for j in range(4))
        kind = self.kind[index]
        cumulative = a * kf + b * (1.0 - np.cos(w * kf))
        noise = np.modf(np.abs(np.sin(kf * 12.9898 + index * 78.233)) * 43758.5453)[0]
        gauge = a + b * np.sin(w * kf + phase) + b * 0.2 * noise
        out = np.where(kind == GAUGE, gauge, np.floor(cumulative))
        bucket = (kind == BUCKET) | (kind == HCOUNT)
        share = np.where(kind == BUCKET, phase, 1.0)
        out = np.where(bucket, np.floor(np.floor(cumulative) * share), out)
        result: np.ndarray = np.where(kind == HSUM, np.floor(cumulative) * 0.137, out)
        return result

    def prefixes(self) -> list[str]:
        """Each series as OpenMetrics writes it before the value."""
        out = []
        for metric, labels in zip(self.metric, self.labels, strict=True):
            body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            out.append(f"{metric}{{{body}}}" if body else metric)
        return out

    def labels_array(self) -> pa.Array:
        return pa.array([list(d.items()) for d in self.labels], pa.map_(pa.string(), pa.string()))


def make_fleet() -> Fleet:
    rng = np.random.default_rng(32)
    rows: list[tuple[str, dict[str, str], int, tuple[float, float, float, float]]] = []
    for job in JOBS:
        for n in range(INSTANCES):
            target = {"job": job, "instance": f"{job}-{n:02d}:9100"}
            rate = float(rng.uniform(5, 50))
            wave = (rate * 0.5, 2 * np.pi / 240, 0.0)

            def counter(a: float) -> tuple[float, float, float, float]:
                return (a, a * 0.5 / (2 * np.pi / 240), 2 * np.pi / 240, 0.0)

            rows.append(("http_requests_total", {**target, "code": "200"}, COUNTER, counter(rate)))
            rows.append(("http_requests_total", {**target, "code": "500"}, COUNTER, counter(1.0)))
            rows.append(("process_cpu_seconds_total", target, COUNTER, counter(3.0)))
            for name in ("node_network_receive_bytes_total", "node_network_transmit_bytes_total"):
                rows.append((name, {**target, "device": "eth0"}, COUNTER, counter(rate * 900)))
            rows.append(("process_resident_memory_bytes", target, GAUGE, (3e8, 5e7, *wave[1:])))
            rows.append(("node_load1", target, GAUGE, (1.5, 0.8, 2 * np.pi / 2880, rate)))
            rows.append(("up", target, GAUGE, (1.0, 0.0, 0.0, 0.0)))
            for le, share in zip(LE, _LE_SHARE, strict=True):
                name = "http_request_duration_seconds_bucket"
                rows.append((name, {**target, "le": le}, BUCKET, (*counter(rate)[:3], share)))
            rows.append(("http_request_duration_seconds_sum", target, HSUM, counter(rate)))
            rows.append(("http_request_duration_seconds_count", target, HCOUNT, counter(rate)))
    series = [canonical_series(m, lab) for m, lab, _, _ in rows]
    order = sorted(range(len(rows)), key=lambda i: series[i])
    return Fleet(
        metric=[rows[i][0] for i in order],
        labels=[rows[i][1] for i in order],
        series=[series[i] for i in order],
        kind=np.array([rows[i][2] for i in order], np.int8),
        param=np.array([rows[i][3] for i in order], np.float64),
        offset_s=np.array([i % STEP_S for i in order], np.int64),
        dense_month=np.array(
            [
                (rows[i][0], rows[i][1].get("job")) == DENSE_MONTH and len(rows[i][1]) == 2
                for i in order
            ]
        ),
    )


@dataclass(frozen=True)
class HourRows:
    """One hour's samples, sorted by series then time: fleet index, grid index, time."""

    index: np.ndarray
    k: np.ndarray
    ts_s: np.ndarray


def hour_rows(fleet: Fleet, hour_start_s: int, *, sparse_step_s: int | None) -> HourRows:
    """The samples of the hour starting at ``hour_start_s``: every series at 15 s, or
    (``sparse_step_s``) the dense-month series at 15 s and the rest every
    ``sparse_step_s`` (a multiple of 15)."""
    steps = np.full(fleet.size, STEP_S, np.int64)
    if sparse_step_s is not None:
        steps[~fleet.dense_month] = sparse_step_s
    counts = 3600 // steps
    index = np.repeat(np.arange(fleet.size, dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    within = np.arange(len(index), dtype=np.int64) - np.repeat(first, counts)
    ts_s = hour_start_s + fleet.offset_s[index] + within * steps[index]
    k = (ts_s - fleet.offset_s[index] - MONTH0_S) // STEP_S
    return HourRows(index, k, ts_s)
