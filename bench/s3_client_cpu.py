"""Client CPU of one small conditional PUT and of one GET: `S3Store`'s direct requests
(`store.s3_direct`) against the same store sending through botocore's pipeline.

``python -m bench.s3_client_cpu [--requests 2000] [--rounds 3] [--put-bytes 600]
[--put-concurrency 32] [--get-bytes 10000] [--get-concurrency 8]``

One process, MiniStack started here (127.0.0.1, a fresh bucket). Per phase,
``--requests`` of one kind:

- ``put``: creates (``If-None-Match: *``) of distinct new keys, ``--put-concurrency`` in
  flight: the collector's manifest create (~600 bytes);
- ``get``: GETs of 200 objects written before, in turn, ``--get-concurrency`` in flight:
  the reconciler's read of an index log segment (~10 KB), the query path's of a catalog
  file.

Each kind is measured two ways: ``sdk (baseline)``, the store with its direct path
switched off, so every request goes through the aiobotocore client as before (`S3Store`
still applies its own savings: `store.s3_request_cache`, no SDK checksum on small
bodies, no parameter validation); ``direct``, the store as it runs (its first request,
through the client, is the warm-up's). Each phase has a fresh store and a warm-up of 100
requests outside the window. Rounds alternate the order; the medians of this process's
CPU (``time.process_time``, so MiniStack's CPU is not counted) per request are
reported, and the ratio direct / sdk. Say how loaded the machine was: other processes
change the caches, not the count.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from chaos.s3_server import (
    CREDENTIALS,
    REGION,
    fresh_bucket,
    start_ministack,
    use_dummy_aws_credentials,
)
from store.s3 import S3Store

WARM_UP = 100
GET_OBJECTS = 200
SDK, DIRECT = "sdk (baseline)", "direct"
KINDS = ("put", "get")


def new_store(endpoint_url: str, bucket: str, *, direct: bool) -> S3Store:
    store = S3Store(
        bucket=bucket, endpoint_url=endpoint_url, region=REGION, credentials=CREDENTIALS
    )
    store._direct_off = not direct
    return store


async def cpu_ms_per_request(
    endpoint_url: str, bucket: str, kind: str, *, direct: bool, args: argparse.Namespace
) -> float:
    store = new_store(endpoint_url, bucket, direct=direct)
    body = os.urandom(args.put_bytes)
    turn = itertools.count()
    request: Callable[[], Awaitable[object]]
    if kind == "put":
        slots = asyncio.Semaphore(args.put_concurrency)

        async def request() -> None:
            async with slots:
                await store.put(f"bench/{uuid.uuid4().hex}", body, if_none_match=True)

    else:
        slots = asyncio.Semaphore(args.get_concurrency)

        async def request() -> None:
            async with slots:
                await store.get(f"objects/{next(turn) % GET_OBJECTS:03d}")

    async with store:
        for _ in range(WARM_UP):
            await request()
        if direct != (store._object_base_url is not None and not store._direct_off):
            raise RuntimeError(
                f"the {kind} {'direct' if direct else 'sdk'} phase took the other path"
            )
        started = time.process_time()
        await asyncio.gather(*(request() for _ in range(args.requests)))
        return float((time.process_time() - started) / args.requests * 1e3)


async def write_objects(endpoint_url: str, bucket: str, size: int) -> None:
    async with new_store(endpoint_url, bucket, direct=True) as store:
        for number in range(GET_OBJECTS):
            await store.put(f"objects/{number:03d}", os.urandom(size))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="per phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--put-bytes", type=int, default=600, help="a manifest: ~600")
    parser.add_argument("--put-concurrency", type=int, default=32)
    parser.add_argument("--get-bytes", type=int, default=10_000, help="a log segment: ~10 KB")
    parser.add_argument("--get-concurrency", type=int, default=8)
    args = parser.parse_args()
    use_dummy_aws_credentials()
    results: dict[tuple[str, str], list[float]] = {
        (kind, path): [] for kind in KINDS for path in (SDK, DIRECT)
    }
    with tempfile.TemporaryDirectory(prefix="lm-bench-s3-client-") as work:
        server = start_ministack(Path(work) / "ministack")
        try:
            bucket = fresh_bucket(server)
            asyncio.run(write_objects(server.endpoint_url, bucket, args.get_bytes))
            print(
                f"MiniStack, {args.requests} requests a phase: conditional creates of "
                f"{args.put_bytes} bytes at {args.put_concurrency} in flight, GETs of "
                f"{args.get_bytes} bytes at {args.get_concurrency}; load "
                f"{os.getloadavg()[0]:.2f} at the start",
                flush=True,
            )
            for round_ in range(args.rounds):
                order = (SDK, DIRECT) if round_ % 2 == 0 else (DIRECT, SDK)
                for kind in KINDS:
                    for path in order:
                        cpu = asyncio.run(
                            cpu_ms_per_request(
                                server.endpoint_url, bucket, kind, direct=path == DIRECT, args=args
                            )
                        )
                        results[kind, path].append(cpu)
                        print(
                            f"  round {round_ + 1} {kind} {path}: {cpu:.3f} ms CPU a request",
                            flush=True,
                        )
        finally:
            server.stop()
    for kind in KINDS:
        sdk, direct = (statistics.median(results[kind, path]) for path in (SDK, DIRECT))
        print(
            f"{kind}: median over {args.rounds} rounds: {SDK} {sdk:.3f} ms, {DIRECT} "
            f"{direct:.3f} ms; direct / sdk: {direct / sdk:.2f}x the CPU a request"
        )
    print(f"load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
