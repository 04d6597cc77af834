"""bench.ingest: the results model, the load driver and the measured window."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import _common as c
from bench.delay_proxy import DelayProxy
from chaos.s3_server import (
    RunningServer,
)

RSS_LIMIT_BYTES = 200 * c.MiB  # peak VmRSS per worker (issue 15 item 4)
ANON_LIMIT_BYTES = 100 * c.MiB  # peak RssAnon per worker
THROUGHPUT_TARGET = 0.8
P50_TARGET = 1.25
DRAIN_TIMEOUT_S = 120.0
NOISY_CORES = 0.2
Send = Callable[[c.BenchFrame], Awaitable[float | None]]


@dataclass
class PhaseResult:
    path: str  # "baseline" or "collector"
    batches: int = 0
    points: int = 0
    failures: int = 0
    retries: int = 0
    elapsed_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    # Collector only:
    ops_per_batch: float | None = None  # ack-path store ops per accepted batch (histogram)
    ops_by_kind: dict[str, float] = field(default_factory=dict)
    index_backlog: float = 0.0  # index log rows still buffered when the window closed
    index_drain_s: float = 0.0
    index_drain_estimated: bool = False  # drain time extrapolated past the bounded wait
    index_rows: dict[str, float] = field(default_factory=dict)
    peak_rss_mib: list[float] = field(default_factory=list)
    quiet_before: float = 0.0  # busy cores on the machine just before the window
    load_avg: list[float] = field(default_factory=list)  # `uptime` at the window's start
    retry_reasons: dict[str, int] = field(default_factory=dict)
    cpu_incl_drain_s: dict[str, float] = field(default_factory=dict)  # window + index log flush
    frames_per_raw_put: float | None = None  # bundles on: lm_collector_frames_per_raw_put mean
    slot_wait_ms: float | None = None  # bundles on: lm_collector_bundle_slot_wait_seconds mean

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def sustained_per_s(self) -> float:
        """Batches per second counting the time the index log flushes needed to catch up."""
        total = self.elapsed_s + self.index_drain_s
        return self.batches / total if total else 0.0

    def total_cpu_per_batch(self, *, incl_drain: bool = False) -> float | None:
        """CPU seconds per batch of every process of the benchmark (not others, not irq)."""
        cpu = self.cpu_incl_drain_s if incl_drain and self.cpu_incl_drain_s else self.cpu_s
        ours = sum(v for role, v in cpu.items() if role not in ("others", "irq"))
        return ours / self.batches if self.batches else None

    @property
    def others_cores(self) -> float:
        """Cores used by processes outside the benchmark during the window."""
        return self.cpu_s.get("others", 0.0) / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def points_per_s(self) -> float:
        return self.points / self.elapsed_s if self.elapsed_s else 0.0

    def cpu_per_1k(self, role: str, *, incl_drain: bool = False) -> float | None:
        cpu = self.cpu_incl_drain_s if incl_drain else self.cpu_s
        if role not in cpu or not self.batches:
            return None
        return cpu[role] / self.batches * 1000


@dataclass
class Scenario:
    store: str
    latency_ms: float
    concurrency: int
    baseline: PhaseResult  # in-process: two PUTs, no HTTP
    collector: PhaseResult
    http: PhaseResult  # `bench.http_baseline`: HTTP + the same two PUTs, no checks
    baseline_runs: list[float] = field(default_factory=list)  # batches/s of every repeat
    collector_runs: list[float] = field(default_factory=list)
    http_runs: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.store}/{self.latency_ms:g}ms/c{self.concurrency}"

    @property
    def throughput_ratio(self) -> float:
        """Collector / HTTP baseline batches per second (the target)."""
        return self.collector.batches_per_s / self.http.batches_per_s

    @property
    def p50_ratio(self) -> float:
        """Collector / HTTP baseline ack p50 (the target)."""
        return self.collector.p50_ms / self.http.p50_ms

    @property
    def server_cpu_ratio(self) -> float | None:
        """Batches per CPU second of the serving process, collector / HTTP baseline (index
        log flushes included): the throughput ratio when the server's CPU is the limit."""
        base = self.http.cpu_per_1k("collector")
        col = self.collector.cpu_per_1k("collector", incl_drain=True)
        return base / col if base and col else None

    @property
    def raw_throughput_ratio(self) -> float:
        """Collector / in-process two-PUT baseline (no HTTP)."""
        return self.collector.batches_per_s / self.baseline.batches_per_s

    @property
    def raw_p50_ratio(self) -> float:
        return self.collector.p50_ms / self.baseline.p50_ms

    @property
    def cpu_ratio(self) -> float | None:
        """In-process baseline / collector CPU per batch of every benchmark process (index
        log flushes included)."""
        base = self.baseline.total_cpu_per_batch()
        col = self.collector.total_cpu_per_batch(incl_drain=True)
        return base / col if base and col else None


@dataclass
class RssResult:
    store: str
    latency_ms: float
    concurrency: int
    frame_bytes: int
    accepted: int
    retries: int
    max_in_flight_seen: float
    in_flight_limit: int
    idle_rss_mib: list[float]  # after start-up (store probe done, no batch yet)
    warm_rss_mib: list[float]  # after a few batches (lazy imports done)
    peak_rss_mib: list[float]  # VmHWM at the end
    peak_anon_mib: list[float]  # highest RssAnon sampled (private heap, not shared libraries)
    retry_reasons: dict[str, int]
    listen_overflows: int  # machine-wide TcpExt ListenOverflows during the load


@dataclass
class Bench:
    """Settings of one run and the shared parts (frames, work directory, servers)."""

    args: argparse.Namespace
    frames: c.FrameSource
    work_dir: Path
    retry_tally: c.RetryTally = field(default_factory=c.RetryTally)
    ministack: RunningServer | None = None
    proxies: dict[float, DelayProxy] = field(default_factory=dict)

    def store_pids(self, latency_ms: float) -> dict[str, list[int]]:
        pids: dict[str, list[int]] = {"driver": [os.getpid()]}
        if self.ministack is not None and self.ministack.pid is not None:
            pids["store"] = [self.ministack.pid]
        if latency_ms in self.proxies:
            pids["proxy"] = [self.proxies[latency_ms].pid]
        return pids

    def endpoint(self, latency_ms: float) -> str:
        assert self.ministack is not None
        if latency_ms:
            return self.proxies[latency_ms].endpoint_url
        return self.ministack.endpoint_url


# --- load -----------------------------------------------------------------------------------


async def run_load(
    frames: c.FrameSource, send: Send, *, concurrency: int, total: int, max_s: float
) -> PhaseResult:
    """``concurrency`` tasks send frames until ``total`` are sent or ``max_s`` passed.
    ``send`` returns the batch's latency in seconds, or None when it was not accepted."""
    result = PhaseResult(path="")
    latencies: list[float] = []
    started = time.monotonic()
    deadline = started + max_s
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while issued < total and time.monotonic() < deadline:
            issued += 1
            frame = frames.take()
            latency = await send(frame)
            if latency is None:
                result.failures += 1
            else:
                latencies.append(latency)
                result.points += frame.points

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.elapsed_s = time.monotonic() - started
    latencies.sort()
    result.batches = len(latencies)
    result.p50_ms = c.percentile(latencies, 50) * 1000
    result.p99_ms = c.percentile(latencies, 99) * 1000
    return result


async def warm_up(bench: Bench, send: Send, concurrency: int) -> None:
    """Connections opened, clients and caches built, lazy imports done."""
    total = min(4 * concurrency, max(bench.args.batches // 4, concurrency))
    await run_load(bench.frames, send, concurrency=concurrency, total=total, max_s=30.0)


async def measure_window(
    bench: Bench, send: Send, concurrency: int, pids: dict[str, list[int]]
) -> tuple[PhaseResult, c.CpuMeter]:
    """The measured window: waits (bounded) for the machine to be quiet, then sends with
    CPU accounting of every process in ``pids`` and of everything else."""
    quiet = await asyncio.to_thread(c.wait_for_quiet, max_wait_s=bench.args.quiet_wait_s)
    reasons = bench.retry_tally.snapshot()
    meter = c.CpuMeter(pids)
    load_avg = [round(v, 2) for v in os.getloadavg()]
    meter.start()
    result = await run_load(
        bench.frames,
        send,
        concurrency=concurrency,
        total=bench.args.batches,
        max_s=bench.args.phase_s,
    )
    result.cpu_s = meter.stop()
    result.quiet_before = quiet
    result.load_avg = load_avg
    result.retry_reasons = dict(bench.retry_tally.snapshot() - reasons)
    return result, meter
