"""Ingest benchmark: collectors against their in-run baseline, at equal concurrency.

    .venv/bin/python -m bench.ingest [--quick] [--store fs|ministack|both]
                                     [--latency-ms 0 20] [--concurrency 1 32 64] ...

For each scenario (store, injected latency, concurrency) it runs, one after the other
against the same store server:

- **baseline**: what the acceptance protocol costs with nothing in front of it. Per
  batch, two sequential create-if-absent PUTs (the frame at its content-addressed key,
  then the accepted-manifest JSON), ``IfNoneMatch='*'`` on both: on MiniStack through
  raw aiobotocore, on the fs store through `store.fs.FileSystemStore.put(...,
  if_none_match=True)`. No HTTP.
- **collector**: a fresh ``lm-collector serve`` per scenario, driven over HTTP with the
  agent's synthetic frames through `agent.uploader.Uploader.send` (no spool; see
  bench/README.md for why).

Then an RSS check per store: a fresh collector under ``--rss-concurrency`` (500)
concurrent ~64 KiB uploads. Every phase is bounded by a batch count and a time cap;
every process started here is stopped by PID in ``finally`` blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import math
import os
import platform
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession
from botocore.exceptions import BotoCoreError, ClientError

from agent.load import LoadSpec, SyntheticLoad
from agent.uploader import Outcome, Uploader, UploadPolicy
from bench import _common as c
from chaos.s3_server import (
    AWS_ENV_TO_REMOVE,
    CREDENTIALS,
    REGION,
    RunningServer,
    create_bucket,
    dummy_aws_env,
    start_ministack,
    unique_bucket_name,
)
from config import LoggingSettings, configure_logging
from protocol import keys, records
from protocol.frame import decode_frame
from store.errors import StoreError
from store.fs import FileSystemStore
from store.retry import Backoff

RSS_LIMIT_BYTES = 150 * c.MiB
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
    retry_reasons: dict[str, int] = field(default_factory=dict)
    cpu_incl_drain_s: dict[str, float] = field(default_factory=dict)  # window + index log flush

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
    baseline: PhaseResult
    collector: PhaseResult
    baseline_runs: list[float] = field(default_factory=list)  # batches/s of every repeat
    collector_runs: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.store}/{self.latency_ms:g}ms/c{self.concurrency}"

    @property
    def throughput_ratio(self) -> float:
        return self.collector.batches_per_s / self.baseline.batches_per_s

    @property
    def p50_ratio(self) -> float:
        return self.collector.p50_ms / self.baseline.p50_ms

    @property
    def cpu_ratio(self) -> float | None:
        """Baseline / collector CPU per batch (index log flushes included): the throughput
        ratio a CPU-bound machine gives when nothing else runs on it."""
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
    proxies: dict[float, c.DelayProxy] = field(default_factory=dict)

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
    result.retry_reasons = dict(bench.retry_tally.snapshot() - reasons)
    return result, meter


# --- the baseline: two sequential conditional PUTs per batch --------------------------------


def manifest_json(frame: c.BenchFrame) -> tuple[str, bytes]:
    """The accepted manifest the collector would write for ``frame`` (same size and cost)."""
    identity = frame.identity
    manifest = records.AcceptedManifest(
        agent_id=identity.agent_id,
        boot_id=str(identity.boot_id),
        seq_start=identity.seq_start,
        seq_end=identity.seq_end,
        record_count=frame.points,
        frame_sha256=frame.frame_sha256,
        frame_bytes=len(frame.frame),
        raw_blob_key=keys.raw_blob_key(frame.frame_sha256),
        accepted_at_unix_ns=time.time_ns(),
        collector_id="bench-baseline",
    )
    return manifest.manifest_key, manifest.to_json()


async def s3_baseline(bench: Bench, latency_ms: float, concurrency: int) -> PhaseResult:
    assert bench.ministack is not None
    bucket = unique_bucket_name("lm-bench-base")
    create_bucket(bench.ministack.endpoint_url, bucket)
    config = AioConfig(
        region_name=REGION,
        max_pool_connections=max(concurrency, 64),  # as many as the collector's store pool
        connect_timeout=5.0,
        read_timeout=30.0,
        retries={"total_max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": "path"},
    )
    async with AioSession().create_client(
        "s3",
        endpoint_url=bench.endpoint(latency_ms),
        region_name=REGION,
        aws_access_key_id=CREDENTIALS[0],
        aws_secret_access_key=CREDENTIALS[1],
        config=config,
    ) as s3:

        async def send(frame: c.BenchFrame) -> float | None:
            started = time.monotonic()
            try:
                await s3.put_object(
                    Bucket=bucket,
                    Key="lm/" + keys.raw_blob_key(frame.frame_sha256),
                    Body=frame.frame,
                    IfNoneMatch="*",
                )
                manifest_key, body = manifest_json(frame)
                await s3.put_object(
                    Bucket=bucket, Key="lm/" + manifest_key, Body=body, IfNoneMatch="*"
                )
            except (ClientError, BotoCoreError, aiohttp.ClientError, TimeoutError):
                return None  # counted as a failure, like a collector answer other than 200
            return time.monotonic() - started

        await warm_up(bench, send, concurrency)
        result, _ = await measure_window(bench, send, concurrency, bench.store_pids(latency_ms))
    result.path = "baseline"
    return result


async def expect_continue_cost(bench: Bench, latency_ms: float, puts: int = 30) -> str:
    """p50 of one 64 KiB PutObject with aiobotocore's default ``Expect: 100-continue`` and
    without it: the header costs each PUT a second round trip to the store."""
    assert bench.ministack is not None
    from botocore.handlers import add_expect_header

    bucket = unique_bucket_name("lm-bench-expect")
    create_bucket(bench.ministack.endpoint_url, bucket)
    medians = []
    for expect in (True, False):
        async with AioSession().create_client(
            "s3",
            endpoint_url=bench.endpoint(latency_ms),
            region_name=REGION,
            aws_access_key_id=CREDENTIALS[0],
            aws_secret_access_key=CREDENTIALS[1],
            config=AioConfig(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
        ) as s3:
            if not expect:
                s3.meta.events.unregister("before-call.s3", add_expect_header)
            took = []
            for _ in range(puts):
                frame = bench.frames.take()
                started = time.monotonic()
                await s3.put_object(
                    Bucket=bucket, Key=frame.frame_sha256, Body=frame.frame, IfNoneMatch="*"
                )
                took.append(time.monotonic() - started)
            medians.append(c.percentile(sorted(took), 50) * 1000)
    return (
        f"one 64 KiB PutObject at {latency_ms:g} ms injected latency, p50 of {puts}: "
        f"{medians[0]:.1f} ms with aiobotocore's Expect: 100-continue, "
        f"{medians[1]:.1f} ms without"
    )


def validation_cpu(frames: c.FrameSource, rounds: int = 200) -> str:
    """CPU the collector spends per frame before any store call: decode + validate, hash."""
    frame = frames.take().frame
    decode_frame(frame)  # lazy imports and caches first
    started = time.process_time()
    for _ in range(rounds):
        decode_frame(frame)
    decode_ms = (time.process_time() - started) / rounds * 1000
    started = time.process_time()
    for _ in range(rounds):
        hashlib.sha256(frame).hexdigest()
    sha_ms = (time.process_time() - started) / rounds * 1000
    return (
        f"per {len(frame)} B frame, CPU in this process: decode_frame {decode_ms:.2f} ms, "
        f"SHA-256 {sha_ms:.3f} ms"
    )


async def fs_baseline(bench: Bench, concurrency: int) -> PhaseResult:
    store = FileSystemStore(Path(tempfile.mkdtemp(prefix="fs-base-", dir=bench.work_dir)))

    async def send(frame: c.BenchFrame) -> float | None:
        started = time.monotonic()
        try:
            await store.put(keys.raw_blob_key(frame.frame_sha256), frame.frame, if_none_match=True)
            manifest_key, body = manifest_json(frame)
            await store.put(manifest_key, body, if_none_match=True)
        except StoreError:
            return None  # counted as a failure
        return time.monotonic() - started

    await warm_up(bench, send, concurrency)
    result, _ = await measure_window(bench, send, concurrency, {"driver": [os.getpid()]})
    result.path = "baseline"
    return result


# --- the collector ----------------------------------------------------------------------------


def collector_env(bench: Bench, store: str, latency_ms: float, in_flight: int) -> dict[str, str]:
    env = {
        **dummy_aws_env(),
        "LM_INGEST__COLLECTOR_ID": "bench-collector",
        "LM_LOGGING__LEVEL": "warning",
        "LM_HTTP__HOST": "127.0.0.1",
        "LM_HTTP__MAX_IN_FLIGHT_REQUESTS": str(in_flight),
        # Stopping a collector waits this long for in-flight requests and the index log
        # queue; the benchmark has measured (or extrapolated) the drain already.
        "LM_HTTP__SHUTDOWN_GRACE_S": "3",
    }
    if store == "ministack":
        assert bench.ministack is not None
        bucket = unique_bucket_name("lm-bench-coll")
        create_bucket(bench.ministack.endpoint_url, bucket)
        env["LM_STORE__URL"] = f"s3://{bucket}/lm"
        env["LM_STORE__ENDPOINT_URL"] = bench.endpoint(latency_ms)
    else:
        env["LM_STORE__URL"] = "file://" + tempfile.mkdtemp(prefix="fs-coll-", dir=bench.work_dir)
    if bench.args.hide_pandas:
        # An experiment, not a deployment: pyarrow imports pandas (when installed) on the
        # first Python-to-Arrow conversion; a package that fails to import hides it.
        shim = bench.work_dir / "hide-pandas"
        (shim / "pandas").mkdir(parents=True, exist_ok=True)
        (shim / "pandas" / "__init__.py").write_text('raise ImportError("hidden by bench")\n')
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))
    return env


def uploader_for(url: str, concurrency: int) -> Uploader:
    policy = UploadPolicy(
        concurrency=concurrency,
        request_timeout_s=60.0,
        backoff=Backoff(attempts=4, base_s=0.05, cap_s=1.0),
    )
    return Uploader(urls=[url], token=None, policy=policy)


def uploader_send(uploader: Uploader, retries: list[int]) -> Send:
    async def send(frame: c.BenchFrame) -> float | None:
        answer = await uploader.send(frame.frame, frame.identity, frame.frame_sha256)
        retries[0] += answer.retries
        return answer.ack_latency_s if answer.outcome is Outcome.ACCEPTED else None

    return send


async def index_flushed(
    http: aiohttp.ClientSession, urls: list[str], max_s: float = DRAIN_TIMEOUT_S
) -> tuple[float, float, float]:
    """Wait until no index log row is buffered, or ``max_s``; returns (seconds waited,
    queue depth at the start, queue depth at the end)."""
    started = time.monotonic()
    first = depth = (await c.scrape(http, urls)).value("lm_collector_index_log_buffered_rows")
    while depth and time.monotonic() - started < max_s:
        await asyncio.sleep(0.1)  # polling a gauge, bounded by max_s
        depth = (await c.scrape(http, urls)).value("lm_collector_index_log_buffered_rows")
    return time.monotonic() - started, first, depth


def extrapolate_drain(
    result: PhaseResult, waited: dict[str, float], drain: tuple[float, float, float]
) -> None:
    """Fill in the drain time and CPU as if the backlog had been waited out: the part not
    waited for is estimated at the rate (and CPU per entry) of the part that was."""
    seconds, first, last = drain
    done = first - last
    scale = first / done if last and done > 0 else 1.0
    result.index_drain_s = seconds * scale if done > 0 or not last else math.inf
    result.index_drain_estimated = scale != 1.0
    result.cpu_incl_drain_s = {
        role: result.cpu_s[role] + (used - result.cpu_s[role]) * scale
        for role, used in waited.items()
    }


async def collector_phase(
    bench: Bench,
    store: str,
    latency_ms: float,
    concurrency: int,
    *,
    command_prefix: tuple[str, ...] = (),
) -> PhaseResult:
    env = collector_env(bench, store, latency_ms, bench.args.max_in_flight)
    name = f"collector-{store}-{latency_ms:g}-{concurrency}"
    workers = c.start_collector_workers(
        work_dir=bench.work_dir,
        name=name,
        env=env,
        workers=bench.args.workers,
        command_prefix=command_prefix,
    )
    try:
        pids = {**bench.store_pids(latency_ms), "collector": workers.worker_pids}
        async with aiohttp.ClientSession() as http, uploader_for(workers.url, concurrency) as up:
            retries = [0]
            send = uploader_send(up, retries)
            before_warmup = await c.scrape(http, workers.metrics_urls)
            await warm_up(bench, send, concurrency)
            # The warm-up's index log flushes must not run into the window.
            await index_flushed(http, workers.metrics_urls)
            retries[0] = 0
            before = await c.scrape(http, workers.metrics_urls)
            result, meter = await measure_window(bench, send, concurrency, pids)
            after = await c.scrape(http, workers.metrics_urls)
            result.index_backlog = after.value("lm_collector_index_log_buffered_rows")
            # Bounded: at high store latency the backlog takes minutes to write.
            drain = await index_flushed(http, workers.metrics_urls, bench.args.phase_s)
            extrapolate_drain(result, meter.stop(), drain)
            final = await c.scrape(http, workers.metrics_urls)
        result.retries = retries[0]
        in_window = after.minus(before)
        per_batch_sum = in_window.value(
            "lm_collector_store_operations_per_batch_sum", outcome="accepted"
        )
        per_batch_count = in_window.value(
            "lm_collector_store_operations_per_batch_count", outcome="accepted"
        )
        result.ops_per_batch = per_batch_sum / per_batch_count if per_batch_count else None
        result.ops_by_kind = {
            k: v
            for k, v in in_window.by_label("lm_collector_store_operations_total", "*").items()
            if v
        }
        result.index_rows = final.minus(before_warmup).by_label(
            "lm_collector_index_log_rows_total", "fate"
        )
        result.peak_rss_mib = [c.peak_rss_bytes(pid) / c.MiB for pid in workers.worker_pids]
    finally:
        workers.stop()
    result.path = "collector"
    return result


async def rss_check(bench: Bench, store: str, latency_ms: float, in_flight: int) -> RssResult:
    """A fresh collector under ``--rss-concurrency`` concurrent uploads; ``in_flight`` is
    its ``http.max_in_flight_requests`` (beyond it: 429, and the uploader retries)."""
    concurrency = bench.args.rss_concurrency
    env = collector_env(bench, store, latency_ms, in_flight)
    workers = c.start_collector_workers(
        work_dir=bench.work_dir,
        name=f"rss-{store}-{in_flight}",
        env=env,
        workers=bench.args.workers,
    )
    pids = workers.worker_pids
    try:
        idle = [c.rss_bytes(pid) / c.MiB for pid in pids]
        highest = 0.0
        anon = [0.0 for _ in pids]
        done = asyncio.Event()

        async def sample(http: aiohttp.ClientSession) -> None:
            nonlocal highest
            while not done.is_set():
                snapshot = await c.scrape(http, workers.metrics_urls)
                highest = max(highest, snapshot.value("lm_collector_in_flight_requests"))
                for i, pid in enumerate(pids):
                    anon[i] = max(anon[i], c.rss_split_bytes(pid)[0] / c.MiB)
                await asyncio.sleep(0.05)  # sampling while the load runs

        async with aiohttp.ClientSession() as http, uploader_for(workers.url, concurrency) as up:
            retries = [0]
            send = uploader_send(up, retries)
            await run_load(bench.frames, send, concurrency=1, total=8 * len(pids), max_s=30.0)
            warm = [c.rss_bytes(pid) / c.MiB for pid in pids]
            retries[0] = 0
            reasons = bench.retry_tally.snapshot()
            overflows = c.listen_overflows()
            sampler = asyncio.create_task(sample(http))
            try:
                result = await run_load(
                    bench.frames,
                    send,
                    concurrency=concurrency,
                    total=bench.args.rss_batches,
                    max_s=bench.args.phase_s * 3,
                )
            finally:
                done.set()
                await sampler
        peak = [c.peak_rss_bytes(pid) / c.MiB for pid in pids]
    finally:
        workers.stop()
    return RssResult(
        store=store,
        latency_ms=latency_ms,
        concurrency=concurrency,
        frame_bytes=bench.frames.frame_bytes,
        accepted=result.batches,
        retries=retries[0],
        max_in_flight_seen=highest,
        in_flight_limit=in_flight,
        idle_rss_mib=idle,
        warm_rss_mib=warm,
        peak_rss_mib=peak,
        peak_anon_mib=anon,
        retry_reasons=dict(bench.retry_tally.snapshot() - reasons),
        listen_overflows=c.listen_overflows() - overflows,
    )


# --- profile -------------------------------------------------------------------------------


async def profile_collector(bench: Bench, store: str, latency_ms: float, concurrency: int) -> str:
    """One collector phase under cProfile (1 worker); returns the top functions."""
    out = bench.work_dir / "collector.prof"
    prefix = (sys.executable, "-m", "cProfile", "-o", str(out))
    phase = await collector_phase(bench, store, latency_ms, concurrency, command_prefix=prefix)
    stats = pstats.Stats(str(out))
    lines = [
        f"cProfile of one collector worker, {store}/{latency_ms:g}ms/c{concurrency}: "
        f"{phase.batches} batches at {phase.batches_per_s:.0f}/s under the profiler "
        f"(profile file: {out})"
    ]
    for sort in ("tottime", "cumulative"):
        stream = _StringStream()
        stats.stream = stream  # type: ignore[attr-defined]
        stats.sort_stats(sort).print_stats(25)
        lines.append(stream.text())
    return "\n".join(lines)


class _StringStream:
    def __init__(self) -> None:
        self._parts: list[str] = []

    def write(self, text: str) -> int:
        self._parts.append(text)
        return len(text)

    def text(self) -> str:
        return "".join(self._parts)


# --- the run --------------------------------------------------------------------------------


async def run_scenario(bench: Bench, store: str, latency_ms: float, concurrency: int) -> Scenario:
    """Baseline then collector, ``--repeats`` times alternating; keeps each path's fastest
    run (noise from other processes only ever slows a run down)."""
    label = f"{store}/{latency_ms:g}ms/c{concurrency}"
    baselines, collectors = [], []
    for _ in range(bench.args.repeats):
        if store == "ministack":
            baselines.append(await s3_baseline(bench, latency_ms, concurrency))
        else:
            baselines.append(await fs_baseline(bench, concurrency))
        _progress(f"{label} baseline", baselines[-1])
        collectors.append(await collector_phase(bench, store, latency_ms, concurrency))
        _progress(f"{label} collector", collectors[-1])
    return Scenario(
        store,
        latency_ms,
        concurrency,
        max(baselines, key=lambda phase: phase.batches_per_s),
        max(collectors, key=lambda phase: phase.batches_per_s),
        [round(phase.batches_per_s, 1) for phase in baselines],
        [round(phase.batches_per_s, 1) for phase in collectors],
    )


def _progress(label: str, phase: PhaseResult) -> None:
    print(
        f"  {label}: {phase.batches} batches, {phase.batches_per_s:.0f}/s, "
        f"p50 {phase.p50_ms:.1f} ms, failures {phase.failures}, "
        f"others {phase.others_cores:.2f} cores (before: {phase.quiet_before:.2f})",
        file=sys.stderr,
        flush=True,
    )


def build_frames(args: argparse.Namespace) -> c.FrameSource:
    spec = LoadSpec(
        agents=8,
        batches=1,
        points_per_batch=args.points_per_batch,
        compress=args.compress,
        seed=20260101,
    )
    planned = list(SyntheticLoad(spec).originals())
    return c.FrameSource([p.frame for p in planned], [p.identity for p in planned])


def rss_limits(args: argparse.Namespace) -> list[int]:
    """One in-flight cap high enough that every upload is held at once and (not with
    --quick) the collector's default one (excess uploads get 429 and retry)."""
    held = 2 * args.rss_concurrency
    return [held] if args.quick else sorted({args.max_in_flight, held})


async def run(
    args: argparse.Namespace, frames: c.FrameSource, work_dir: Path
) -> tuple[list[Scenario], list[RssResult], list[str], str | None]:
    """Every scenario and check; stops every process it started, whatever happens."""
    bench = Bench(args, frames, work_dir, c.install_retry_tally())
    scenarios: list[Scenario] = []
    rss: list[RssResult] = []
    notes: list[str] = [validation_cpu(frames)]
    profile: str | None = None
    stores = ["ministack", "fs"] if args.store == "both" else [args.store]
    if args.only_rss:
        args.latency_ms, args.concurrency = args.latency_ms[-1:], []
    try:
        if "ministack" in stores:
            bench.ministack = start_ministack(work_dir / "ministack")
            for latency in args.latency_ms:
                if latency:
                    bench.proxies[latency] = c.start_delay_proxy(
                        upstream_port=bench.ministack.port, delay_ms=latency, work_dir=work_dir
                    )
            for latency in args.latency_ms:
                if latency and not args.only_rss:
                    notes.append(await expect_continue_cost(bench, latency))
                for concurrency in args.concurrency:
                    scenarios.append(await run_scenario(bench, "ministack", latency, concurrency))
            for in_flight in rss_limits(args):
                rss.append(await rss_check(bench, "ministack", max(args.latency_ms), in_flight))
            if args.profile and args.concurrency:
                profile = await profile_collector(
                    bench,
                    "ministack",
                    0.0 if 0 in args.latency_ms else args.latency_ms[0],
                    max(args.concurrency),
                )
        if "fs" in stores:
            for concurrency in args.concurrency:
                scenarios.append(await run_scenario(bench, "fs", 0.0, concurrency))
            for in_flight in rss_limits(args) if not rss or not args.quick else []:
                rss.append(await rss_check(bench, "fs", 0.0, in_flight))
    finally:
        for proxy in bench.proxies.values():
            proxy.stop()
        if bench.ministack is not None:
            bench.ministack.stop()
    return scenarios, rss, notes, profile


# --- the report -------------------------------------------------------------------------------


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def render_report(scenarios: list[Scenario], rss: list[RssResult], notes: list[str]) -> str:
    lines = [
        f"{'scenario':<20} {'path':<9} {'batch/s':>7} {'points/s':>8} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'ops/b':>5} | {'cpu-s per 1000 batches':^37} | {'others':>6} "
        f"{'peakRSS':>7}",
        f"{'':<20} {'':<9} {'':>7} {'':>8} {'':>7} {'':>7} {'':>5} | "
        f"{'collector':>9} {'store':>6} {'driver':>6} {'proxy':>5} {'total':>6} | "
        f"{'cores':>6} {'MiB':>7}",
    ]
    for s in scenarios:
        for phase in (s.baseline, s.collector):
            total = phase.total_cpu_per_batch()
            lines.append(
                f"{s.name:<20} {phase.path:<9} {phase.batches_per_s:>7.1f} "
                f"{phase.points_per_s:>8.0f} {phase.p50_ms:>7.1f} {phase.p99_ms:>7.1f} "
                f"{_num(phase.ops_per_batch):>5} | {_num(phase.cpu_per_1k('collector')):>9} "
                f"{_num(phase.cpu_per_1k('store')):>6} {_num(phase.cpu_per_1k('driver')):>6} "
                f"{_num(phase.cpu_per_1k('proxy')):>5} "
                f"{_num(total * 1000 if total is not None else None):>6} | "
                f"{phase.others_cores:>6.2f} "
                f"{'/'.join(f'{m:.0f}' for m in phase.peak_rss_mib) or '-':>7}"
            )
        col = s.collector
        lines.append(
            f"{'':<20} {'ratio':<9} {s.throughput_ratio:>6.2f}x {'':>8} {s.p50_ratio:>6.2f}x"
            f"   CPU-bound estimate {_num(s.cpu_ratio)}x; "
            + (f"runs {s.baseline_runs} / {s.collector_runs}; " if len(s.baseline_runs) > 1 else "")
            + f"sustained incl. index flush {col.sustained_per_s:.1f}/s "
            f"({col.sustained_per_s / s.baseline.batches_per_s:.2f}x); failures "
            f"{s.baseline.failures}/{col.failures}, retries {col.retries} {col.retry_reasons or ''}"
        )
        lines.append(
            f"{'':<20} {'index log':<9} backlog {col.index_backlog:.0f} at window end, drained "
            f"in {col.index_drain_s:.1f} s{' (extrapolated)' if col.index_drain_estimated else ''}; "
            f"{_index_text(col.index_rows)}; cpu-s per 1000 "
            f"batches incl. drain: collector {_num(col.cpu_per_1k('collector', incl_drain=True))}"
            f", store {_num(col.cpu_per_1k('store', incl_drain=True))}"
        )
        lines.append(
            f"{'':<20} {'ack ops':<9} "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(col.ops_by_kind.items()))
        )
    lines.append("")
    for r in rss:
        lines.append(
            f"RSS {r.store}/{r.latency_ms:g}ms, max_in_flight_requests {r.in_flight_limit}: "
            f"{r.concurrency} concurrent uploads of {r.frame_bytes} B, {r.accepted} accepted, "
            f"{r.retries} retries {r.retry_reasons or ''}, listen overflows "
            f"{r.listen_overflows}, max in flight {r.max_in_flight_seen:.0f}; MiB per worker: "
            f"idle {_mibs(r.idle_rss_mib)}, after 8 batches {_mibs(r.warm_rss_mib)}, "
            f"peak VmHWM {_mibs(r.peak_rss_mib)} (peak RssAnon {_mibs(r.peak_anon_mib)})"
        )
    lines += [f"note: {note}" for note in notes]
    lines += ["", "targets:", *_targets(scenarios, rss)]
    return "\n".join(lines)


def _mibs(values: list[float]) -> str:
    return "/".join(f"{v:.0f}" for v in values)


def _index_text(rows: dict[str, float]) -> str:
    return ", ".join(f"{k.removeprefix('fate=')} {v:.0f}" for k, v in sorted(rows.items()))


def _targets(scenarios: list[Scenario], rss: list[RssResult]) -> list[str]:
    lines = []
    for s in scenarios:
        lines.append(
            f"  [{_verdict(s.throughput_ratio >= THROUGHPUT_TARGET)}] throughput >= "
            f"{THROUGHPUT_TARGET}x baseline: {s.name} {s.throughput_ratio:.2f}x (CPU-bound "
            f"estimate {_num(s.cpu_ratio)}x, sustained incl. index flush "
            f"{s.collector.sustained_per_s / s.baseline.batches_per_s:.2f}x)"
        )
    for s in scenarios:
        lines.append(
            f"  [{_verdict(s.p50_ratio <= P50_TARGET)}] ack p50 <= {P50_TARGET}x baseline 2-PUT "
            f"p50: {s.name} {s.collector.p50_ms:.1f} / {s.baseline.p50_ms:.1f} ms = "
            f"{s.p50_ratio:.2f}x"
        )
    for s in scenarios:
        ops = s.collector.ops_per_batch
        lines.append(
            f"  [{_verdict(ops == 2.0)}] 2.0 store ops on the ack path per new batch: "
            f"{s.name} {_num(ops, '.3f')}"
        )
    for r in rss:
        worst = max(r.peak_rss_mib)
        lines.append(
            f"  [{_verdict(worst * c.MiB <= RSS_LIMIT_BYTES)}] <= 150 MiB RSS per worker with "
            f"{r.concurrency} concurrent {r.frame_bytes / 1024:.0f} KiB uploads: {r.store}, "
            f"max_in_flight_requests {r.in_flight_limit}: peak {worst:.0f} MiB"
        )
    noisy = [
        f"{s.name} {p.path} ({p.others_cores:.2f} cores)"
        for s in scenarios
        for p in (s.baseline, s.collector)
        if p.others_cores > NOISY_CORES
    ]
    if noisy:
        lines.append(
            f"  NOTE: other processes used > {NOISY_CORES} cores during: " + "; ".join(noisy)
        )
    return lines


def header(args: argparse.Namespace, frame_bytes: int) -> str:
    versions = ", ".join(
        f"{name} {_version(name)}"
        for name in ("aiohttp", "aiobotocore", "botocore", "uvloop", "pyarrow", "ministack")
    )
    return (
        f"Lightmetrics ingest benchmark, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC\n"
        f"machine: {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}\n"
        f"versions: {versions}\n"
        f"command: {' '.join([Path(sys.executable).name, '-m', 'bench.ingest', *sys.argv[1:]])}\n"
        f"frames: {args.points_per_batch} points, {frame_bytes} bytes, "
        f"{'zstd' if args.compress else 'uncompressed'}; collector workers: {args.workers}; "
        f"batches per phase <= {args.batches}, <= {args.phase_s:g} s"
    )


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a ~1 minute smoke run")
    parser.add_argument("--store", choices=("fs", "ministack", "both"), default="both")
    parser.add_argument(
        "--latency-ms", type=float, nargs="+", help="injected store latency (MiniStack only)"
    )
    parser.add_argument("--concurrency", type=int, nargs="+")
    parser.add_argument("--workers", type=int, default=1, help="collector worker processes")
    parser.add_argument("--batches", type=int, help="measured batches per phase (cap)")
    parser.add_argument("--phase-s", type=float, help="seconds per measured phase (cap)")
    parser.add_argument("--points-per-batch", type=int, default=575, help="575: ~64 KiB frames")
    parser.add_argument("--compress", action="store_true", help="zstd frames (default: off)")
    parser.add_argument("--rss-concurrency", type=int, default=500)
    parser.add_argument("--rss-batches", type=int)
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=256,
        help="collector http.max_in_flight_requests (the RSS check raises it to 2x its load)",
    )
    parser.add_argument("--profile", action="store_true", help="add a cProfile'd collector run")
    parser.add_argument(
        "--quiet-wait-s",
        type=float,
        help="before each window, wait up to this long for other processes to go quiet",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="run each scenario N times, keep the fastest"
    )
    parser.add_argument("--only-rss", action="store_true", help="only the RSS checks")
    parser.add_argument(
        "--hide-pandas",
        action="store_true",
        help="experiment: collectors run with pandas unimportable (pyarrow loads it lazily)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep-work-dir", action="store_true")
    args = parser.parse_args(argv)
    quick = args.quick
    args.latency_ms = args.latency_ms or ([0.0] if quick else [0.0, 20.0])
    args.concurrency = args.concurrency or ([32] if quick else [1, 32, 64])
    args.batches = args.batches or (600 if quick else 2000)
    args.phase_s = args.phase_s or (4.0 if quick else 6.0)
    args.rss_batches = args.rss_batches or (600 if quick else 1500)
    if args.quiet_wait_s is None:
        args.quiet_wait_s = 1.0 if quick else 5.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for name in AWS_ENV_TO_REMOVE:
        os.environ.pop(name, None)
    os.environ.update(dummy_aws_env())  # collectors inherit it; nothing reads ~/.aws
    configure_logging(LoggingSettings(level="warning", format="console"))
    import uvloop

    started = time.monotonic()
    frames = build_frames(args)
    work_dir = Path(tempfile.mkdtemp(prefix="lm-bench-"))
    try:
        scenarios, rss, notes, profile = uvloop.run(run(args, frames, work_dir))
    except BaseException:
        _clean_up(args, work_dir)
        raise
    frame_bytes = frames.frame_bytes
    print(header(args, frame_bytes))
    print(f"wall time: {time.monotonic() - started:.0f} s\n")
    print(render_report(scenarios, rss, notes))
    if profile:
        print("\n" + profile)
    if args.json:
        payload: dict[str, Any] = {
            "header": header(args, frame_bytes),
            "scenarios": [
                {**asdict(s), "throughput_ratio": s.throughput_ratio, "p50_ratio": s.p50_ratio}
                for s in scenarios
            ],
            "rss": [asdict(r) for r in rss],
            "notes": notes,
        }
        args.json.write_text(json.dumps(payload, indent=2))
    sys.stdout.flush()
    _clean_up(args, work_dir)  # after the report: deleting ~10^5 stored objects takes a while
    return 0


def _clean_up(args: argparse.Namespace, work_dir: Path) -> None:
    if args.keep_work_dir or args.profile:
        print(f"work directory kept: {work_dir}", file=sys.stderr)
    else:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
