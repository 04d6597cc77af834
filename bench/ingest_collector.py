"""bench.ingest: collector phases, the RSS check and the profile."""

from __future__ import annotations

import asyncio
import math
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import aiohttp

from agent.uploader import Outcome, Uploader, UploadPolicy
from bench import _common as c
from bench.ingest_phases import (
    DRAIN_TIMEOUT_S,
    Bench,
    PhaseResult,
    RssResult,
    Send,
    measure_window,
    run_load,
    warm_up,
)
from chaos.s3_server import (
    CREDENTIALS,
    create_bucket,
    dummy_aws_env,
    unique_bucket_name,
)
from protocol import keys
from protocol.records import FeatureRecord
from store.open import open_store
from store.retry import Backoff

# --- the collector ----------------------------------------------------------------------------


def collector_env(bench: Bench, store: str, latency_ms: float, in_flight: int) -> dict[str, str]:
    env = {
        **dummy_aws_env(),
        "LM_INGEST__COLLECTOR_ID": "bench-collector",
        "LM_LOGGING__LEVEL": "warning",
        "LM_HTTP__HOST": "127.0.0.1",
        "LM_HTTP__MAX_IN_FLIGHT_REQUESTS": str(in_flight),
        # Config requires max_connections >= max_in_flight_requests (each request holds a
        # connection); without it a raised in-flight cap fails validation at start-up.
        "LM_HTTP__MAX_CONNECTIONS": str(max(512, in_flight)),
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
    around_window: Callable[[list[int]], AbstractContextManager[object]] | None = None,
    bundles: bool = False,
) -> PhaseResult:
    """``around_window``: entered with the worker PIDs just before the measured window
    and left right after it (a profiler attached to the workers). ``bundles``: the store's
    feature record says ``bundles: true`` before the collector starts (PROTOCOL §3.10)."""
    env = collector_env(bench, store, latency_ms, bench.args.max_in_flight)
    if bundles:
        await turn_bundles_on(bench, env["LM_STORE__URL"])
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
            with around_window(workers.worker_pids) if around_window else nullcontext():
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
        raw_puts = in_window.value("lm_collector_frames_per_raw_put_count")
        if raw_puts:
            frames = in_window.value("lm_collector_frames_per_raw_put_sum")
            result.frames_per_raw_put = frames / raw_puts
        waits = in_window.value("lm_collector_bundle_slot_wait_seconds_count")
        if waits:
            waited = in_window.value("lm_collector_bundle_slot_wait_seconds_sum")
            result.slot_wait_ms = 1000 * waited / waits
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


async def turn_bundles_on(bench: Bench, store_url: str) -> None:
    """Write the feature record ``bundles: true`` into a fresh store (what ``lm-reconciler
    enable-bundles`` writes once nothing blocks: a fresh store has no reader to wait for)."""
    endpoint = bench.ministack.endpoint_url if bench.ministack else None
    store = open_store(store_url, endpoint_url=endpoint, credentials=CREDENTIALS)
    record = FeatureRecord(bundles=True, written_by="bench.ingest", written_at_unix_ns=1)
    try:
        await store.put(keys.INDEX_FEATURES_KEY, record.to_json(), if_none_match=True)
    finally:
        await store.close()


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
