"""Cold queries against an S3 store: MiniStack (`chaos.s3_server.start_ministack`, on
127.0.0.1) holding copies of the cached stores, reached through `bench.delay_proxy` with an
S3-like latency added to every request; each query on a fresh collector (empty cache,
fresh engine)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import boto3  # type: ignore[import-untyped]

from bench.counting import CountingProxy, Tally, describe, since
from bench.delay_proxy import start_delay_proxy
from bench.promql import measure
from bench.promql.servers import start_query_collector
from chaos.s3_server import REGION, fresh_bucket, start_ministack, use_dummy_aws_credentials
from store.fs_listing import RESERVED

T = TypeVar("T")
SLOW_STORE = {
    "LM_QUERY__PROMQL__REMOTE_TIMEOUT_S": "600",
    "LM_QUERY__PROMQL__QUERY_TIMEOUT_S": "630",
    "LM_QUERY__PROMQL__FORWARD_TIMEOUT_S": "660",
}
"""Nested timeouts long enough for a cold read of 720 hourly files through the delay line
(the defaults, 60/90/120 s, are sized for a warm read path)."""


def upload(endpoint_url: str, bucket: str, root: Path) -> int:
    """Every object of the filesystem store at ``root`` into ``bucket``, same keys."""
    client = boto3.client("s3", endpoint_url=endpoint_url, region_name=REGION)
    count = 0
    for directory, _, names in os.walk(root):
        relative = Path(directory).relative_to(root)
        if relative.parts[:1] == (RESERVED,):
            continue
        for name in names:
            client.upload_file(str(Path(directory) / name), bucket, str(relative / name))
            count += 1
    return count


class CountingThread:
    """`bench.counting.CountingProxy` (every request forwarded, counted by operation and
    key area) served from an event loop of its own in a thread."""

    def __init__(self, upstream: str, bucket: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.proxy = CountingProxy(upstream=upstream, bucket=bucket, prefix="")
        self.url = self._run(self.proxy.start())

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def tally(self) -> Tally:
        return self._run(_snapshot(self.proxy))

    def stop(self) -> None:
        self._run(self.proxy.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


async def _snapshot(proxy: CountingProxy) -> Tally:
    return proxy.snapshot()


def counted_requests(
    server_url: str, bucket: str, work: Path, params: dict[str, str]
) -> dict[str, Any]:
    """The S3 requests (every one, pyarrow's reads of data files included) a fresh
    collector makes for one query over ``bucket``, and those of its start-up."""
    counting = CountingThread(server_url, bucket)
    try:
        before = counting.tally()
        collector = start_query_collector(
            f"s3://{bucket}", work, extra={"LM_STORE__ENDPOINT_URL": counting.url}
        )
        try:
            started = counting.tally()
            measure.timed(collector.target, "/api/v1/query_range", params)
            done = counting.tally()
        finally:
            collector.stop()
    finally:
        counting.stop()
    return {
        "startup": describe(since(started, before)),
        "query": describe(since(done, started)),
        "query_total": sum(since(done, started).values()),
    }


def cold_on_s3(
    work: Path,
    stores: dict[str, Path],
    queries: dict[str, tuple[str, dict[str, str]]],
    latencies_ms: list[float],
    log: Callable[[str], None],
    counted: dict[str, dict[str, str]],
) -> dict[str, Any]:
    """``queries``: name -> (store name, query_range params). Each query, at each
    latency, on a fresh collector: wall and CPU seconds."""
    use_dummy_aws_credentials()
    server = start_ministack(work / "ministack")
    out: dict[str, Any] = {}
    try:
        buckets = {}
        for name, root in stores.items():
            buckets[name] = fresh_bucket(server, f"bench-{name}")
            out[f"objects {name}"] = upload(server.endpoint_url, buckets[name], root)
        for name, params in counted.items():
            out[f"requests {name}"] = counted_requests(
                server.endpoint_url, buckets[name], work / f"c-count-{name}", params
            )
            log(f"S3 requests, 1 h query over the {name} store: {out[f'requests {name}']}")
        for latency in latencies_ms:
            proxy = None
            endpoint = server.endpoint_url
            if latency:
                assert server.port is not None
                proxy = start_delay_proxy(
                    upstream_port=server.port, delay_ms=latency, work_dir=work / "proxy"
                )
                endpoint = proxy.endpoint_url
            try:
                for name, (store, params) in queries.items():
                    collector = start_query_collector(
                        f"s3://{buckets[store]}",
                        work / f"c-s3-{name}-{latency:g}".replace(" ", "-"),
                        extra={"LM_STORE__ENDPOINT_URL": endpoint, **SLOW_STORE},
                    )
                    started = time.perf_counter()
                    try:
                        wall, cpu, _ = measure.timed(
                            collector.target, "/api/v1/query_range", params
                        )
                        result: dict[str, Any] = {"wall_s": wall, "cpu_s": cpu}
                    except (RuntimeError, OSError) as error:
                        wall = time.perf_counter() - started
                        result = {"wall_s": wall, "error": str(error)[:300]}
                    finally:
                        collector.stop()
                    out[f"{name} at {latency:g} ms"] = result
                    log(f"S3 cold {name} at {latency:g} ms: {result}")
            finally:
                if proxy is not None:
                    proxy.stop()
    finally:
        server.stop()
    return out
