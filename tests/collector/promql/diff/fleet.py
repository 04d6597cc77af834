"""The generated fleet of the differential test (issue 32): deterministic, seeded, at fixed
times (never today's date), small enough for CI.

Two hours at 15 s from `T0_MS` (2025-11-21T10:00:00Z), 49 series, 22,694 samples:

- ``http_requests_total{instance,method,code}``: 12 counters, some with resets;
- ``cpu_usage_ratio{instance,mode}`` and ``node_memory_bytes{instance,dc}``: 8 gauges;
- ``request_duration_seconds`` (``_bucket{le}``, ``_sum``, ``_count``) on 2 instances:
  a classic histogram, 12 series;
- ``rpc_latency_seconds`` (``{quantile}``, ``_sum``, ``_count``) on 2 services: a
  summary, 10 series;
- ``http.server.duration{service.name,http.method}``: a dotted OTLP-style counter, stored
  with its dots and presented as ``http_server_duration{service_name,http_method}``
  (PROTOCOL §5 ``lm_escape``);
- ``batch_progress{worker}`` and ``batch_items_total{worker}``: series that stop, with an
  explicit stale marker (the NaN ``0x7ff0000000000002``) one scrape after their last
  sample; one of them starts late.

**Every sample has a millisecond of its own** across the whole fleet: series ``i`` scrapes
at ``T0 + 15 s * k + 11 ms * i + jitter`` with a seeded jitter of 0..10 ms, so the slots
of two series never meet. A Prometheus TSDB refuses a second value at one millisecond
(a duplicate), while our store keeps both and lets the last win: with unique
milliseconds the reference and our collectors hold exactly the same samples. Each
sample also has a seeded microsecond within its millisecond (`Series.us`), which the
native frames carry and the read path floors away.

Samples are numpy columns per series, never a Python object per sample.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from protocol.prom_names import present_labels

T0_MS = 1_763_719_200_000  # 2025-11-21T10:00:00Z
STEP_MS = 15_000
STEPS = 481  # 10:00:00 through 12:00:00 inclusive: two hours
END_MS = T0_MS + (STEPS - 1) * STEP_MS
SLOT_MS = 11  # series i owns [11 i, 11 i + 10] ms within each scrape interval
SEED = 32
STALE_NAN_BITS = 0x7FF0000000000002
STALE_NAN = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]

HISTOGRAM_LE = ("0.1", "0.5", "1", "+Inf")
SUMMARY_QUANTILES = ("0.5", "0.9", "0.99")


@dataclass(frozen=True, eq=False)
class Series:
    """One stored series and its samples (ms, µs within the ms, float64 bits as stored)."""

    metric: str
    labels: dict[str, str]
    ts_ms: np.ndarray  # int64, strictly increasing
    us: np.ndarray  # int64 in 0..999: the microsecond within each millisecond
    values: np.ndarray  # float64; a stale marker where the series stops
    channel: str  # "remote_write" or "frame": how our collectors get it
    presented: tuple[tuple[str, str], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "presented", present_labels(self.metric, self.labels)[0])

    @property
    def ts_ns(self) -> np.ndarray:
        ns: np.ndarray = self.ts_ms * 1_000_000 + self.us * 1_000
        return ns


@dataclass(frozen=True)
class Fleet:
    series: tuple[Series, ...]

    @property
    def samples(self) -> int:
        return sum(len(s.ts_ms) for s in self.series)

    def all_ts_ms(self) -> np.ndarray:
        return np.concatenate([s.ts_ms for s in self.series])


class _Builder:
    def __init__(self) -> None:
        self.rng = np.random.default_rng(SEED)
        self.series: list[Series] = []

    def times(self, first: int = 0, last: int = STEPS - 1) -> tuple[np.ndarray, np.ndarray]:
        """(ms, µs) of scrape steps first..last of the next series' slot."""
        index = len(self.series)
        steps = np.arange(first, last + 1, dtype=np.int64)
        jitter = self.rng.integers(0, SLOT_MS, size=steps.size, dtype=np.int64)
        ts = T0_MS + steps * STEP_MS + index * SLOT_MS + jitter
        us = self.rng.integers(0, 1000, size=steps.size, dtype=np.int64)
        return ts, us

    def add(self, metric: str, labels: dict[str, str], values: np.ndarray, **kw: int) -> None:
        ts, us = self.times(**kw)
        assert ts.size == values.size, (metric, ts.size, values.size)
        channel = "frame" if len(self.series) % 2 else "remote_write"
        if "." in metric:
            channel = "frame"  # a dotted name is what OTLP (native frames) brings
        self.series.append(Series(metric, labels, ts, us, values.astype(np.float64), channel))

    def counter(self, n: int, rate: float, resets: int = 0) -> np.ndarray:
        """A counter of ``n`` samples (whole increments) that resets ``resets`` times."""
        increments = self.rng.poisson(rate, size=n).astype(np.float64)
        values = np.cumsum(increments)
        for at in sorted(self.rng.choice(np.arange(20, n - 20), size=resets, replace=False)):
            values[at:] -= values[at] - increments[at]  # restarts from its increment
        return values

    def gauge(self, n: int, start: float, scale: float) -> np.ndarray:
        return np.round(start + np.cumsum(self.rng.normal(0.0, scale, size=n)), 6)


def _histogram(b: _Builder, instance: str) -> None:
    observed = b.rng.poisson([3.0, 5.0, 2.0, 0.5], size=(STEPS, 4)).astype(np.float64)
    cumulative = np.cumsum(np.cumsum(observed, axis=1), axis=0)
    for i, le in enumerate(HISTOGRAM_LE):
        labels = {"instance": instance, "le": le}
        b.add("request_duration_seconds_bucket", labels, cumulative[:, i])
    total = np.cumsum(np.round(b.rng.uniform(0.5, 4.0, size=STEPS) * observed.sum(axis=1), 3))
    b.add("request_duration_seconds_sum", {"instance": instance}, total)
    b.add("request_duration_seconds_count", {"instance": instance}, cumulative[:, -1])


def _summary(b: _Builder, service: str) -> None:
    base = b.rng.uniform(0.05, 0.2)
    for i, quantile in enumerate(SUMMARY_QUANTILES):
        values = np.round(base * (1 + i) + np.abs(b.rng.normal(0.0, 0.02, size=STEPS)), 6)
        b.add("rpc_latency_seconds", {"service": service, "quantile": quantile}, values)
    counts = b.counter(STEPS, 40.0)
    b.add("rpc_latency_seconds_sum", {"service": service}, np.round(counts * base * 1.3, 6))
    b.add("rpc_latency_seconds_count", {"service": service}, counts)


def _stopping(b: _Builder, metric: str, worker: str, first: int, last: int, gauge: bool) -> None:
    """Samples at steps first..last, then a stale marker at step last + 1."""
    n = last - first + 1
    values = b.gauge(n, 50.0, 2.0) if gauge else b.counter(n, 7.0)
    b.add(metric, {"worker": worker}, np.append(values, STALE_NAN), first=first, last=last + 1)


@cache
def fleet() -> Fleet:
    """The fleet (built once per process; every call returns the same object)."""
    b = _Builder()
    for instance in ("i0", "i1", "i2"):
        for method in ("GET", "POST"):
            for code in ("200", "500"):
                rate = 20.0 if code == "200" else 1.5
                resets = 1 if (instance, code) in {("i1", "200"), ("i2", "500")} else 0
                labels = {"instance": instance, "method": method, "code": code, "job": "api"}
                b.add("http_requests_total", labels, b.counter(STEPS, rate, resets))
    for instance, dc in (("i0", "eu"), ("i1", "eu"), ("i2", "us")):
        b.add("node_memory_bytes", {"instance": instance, "dc": dc}, b.gauge(STEPS, 4e9, 5e6))
    for instance in ("i0", "i1"):
        for mode in ("user", "system"):
            values = np.clip(b.gauge(STEPS, 0.3, 0.02), 0.0, 1.0)
            b.add("cpu_usage_ratio", {"instance": instance, "mode": mode}, values)
    b.add("cpu_usage_ratio", {"instance": "i2", "mode": "user"}, b.gauge(STEPS, 0.5, 0.02))
    for instance in ("i0", "i1"):
        _histogram(b, instance)
    for service in ("auth", "cart"):
        _summary(b, service)
    for method in ("GET", "POST"):
        labels = {"service.name": "checkout", "http.method": method}
        b.add("http.server.duration", labels, b.counter(STEPS, 12.0, resets=1))
    _stopping(b, "batch_progress", "w0", 0, 200, gauge=True)  # stops at 10:50
    _stopping(b, "batch_progress", "w1", 0, 430, gauge=True)  # stops at 11:47:30
    _stopping(b, "batch_progress", "w2", 160, 330, gauge=True)  # 10:40 to 11:22:30
    _stopping(b, "batch_items_total", "w0", 0, 250, gauge=False)
    _stopping(b, "batch_items_total", "w1", 0, 470, gauge=False)
    built = Fleet(tuple(b.series))
    ts = built.all_ts_ms()
    assert np.unique(ts).size == ts.size, "two samples share a millisecond"
    return built
