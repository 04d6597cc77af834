"""bench.ingest: the baselines (in-process two PUTs; the minimal HTTP server) and side
measurements."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession
from botocore.exceptions import BotoCoreError, ClientError

from bench import _common as c
from bench.ingest_collector import uploader_for, uploader_send
from bench.ingest_phases import Bench, PhaseResult, measure_window, warm_up
from chaos.s3_server import (
    CREDENTIALS,
    REGION,
    create_bucket,
    dummy_aws_env,
    unique_bucket_name,
)
from protocol import keys, records
from protocol.frame import decode_frame
from store.errors import StoreError
from store.fs import FileSystemStore

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


# --- the HTTP baseline: a minimal aiohttp server doing the same two PUTs ---------------------


CHECKED_PATH = "http-checked"
"""The result path of the HTTP baseline run with ``--check-frames``."""


async def http_baseline(
    bench: Bench, store: str, latency_ms: float, concurrency: int, *, check_frames: bool = False
) -> PhaseResult:
    """`bench.http_baseline` in its own process, driven like the collector (same uploader,
    same frames). Its CPU is reported in the ``collector`` role: the serving process.
    ``check_frames``: the baseline checks each frame as the collector does
    (``--check-frames``); its result's path is `CHECKED_PATH`."""
    path = CHECKED_PATH if check_frames else "http-base"
    name = f"{path}-{store}-{latency_ms:g}-{concurrency}"
    ready = bench.work_dir / f"{name}.ready.json"
    command = [sys.executable, "-m", "bench.http_baseline", "--ready-file", str(ready)]
    if check_frames:
        command.append("--check-frames")
    if store == "ministack":
        assert bench.ministack is not None
        bucket = unique_bucket_name("lm-bench-http")
        create_bucket(bench.ministack.endpoint_url, bucket)
        command += [
            "--store-url",
            f"s3://{bucket}/lm",
            "--endpoint-url",
            bench.endpoint(latency_ms),
        ]
    else:
        root = tempfile.mkdtemp(prefix="fs-http-", dir=bench.work_dir)
        command += ["--store-url", "file://" + root]
    process, port = await asyncio.to_thread(
        _start_server, command, bench.work_dir / f"{name}.log", ready
    )
    try:
        pids = {**bench.store_pids(latency_ms), "collector": [process.pid]}
        async with uploader_for(f"http://127.0.0.1:{port}", concurrency) as up:
            send = uploader_send(up, [0])
            await warm_up(bench, send, concurrency)
            result, _ = await measure_window(bench, send, concurrency, pids)
        result.peak_rss_mib = [c.peak_rss_bytes(process.pid) / c.MiB]
    finally:
        c.stop_pid_process(process)
    result.path = path
    return result


def _start_server(
    command: list[str], log_path: Path, ready: Path
) -> tuple[subprocess.Popen[bytes], int]:
    """Start the HTTP baseline server; wait (bounded) for its ready file; (process, port)."""
    ready.unlink(missing_ok=True)  # a repeat of the scenario reuses the name
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **dummy_aws_env()}
        )
    deadline = time.monotonic() + 30.0
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            c.stop_pid_process(process)
            raise RuntimeError(f"{command} did not start: {log_path.read_text()[-2000:]}")
        time.sleep(0.05)  # polling for readiness, bounded by the deadline
    return process, int(json.loads(ready.read_text())["port"])
