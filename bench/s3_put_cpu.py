"""Client CPU of one small conditional PUT: `S3Store.put`'s direct path
(`store.s3_direct_put`) against the same store sending through botocore's pipeline.

``python -m bench.s3_put_cpu [--puts 2000] [--concurrency 32] [--bytes 600] [--rounds 3]``

One process, MiniStack started here (127.0.0.1, a fresh bucket), ``--puts`` creates
(``If-None-Match: *``) of distinct new keys per phase with ``--concurrency`` in flight:
the collector's manifest create. Phases:

- ``sdk (baseline)``: the store with its direct path switched off, so every PUT goes
  through the aiobotocore client as before (`S3Store` still applies its own savings:
  `store.s3_request_cache`, no SDK checksum on small bodies, no parameter validation);
- ``direct``: the store as it runs (its first PUT, through the client, is the warm-up's).

Each phase has a fresh store and a warm-up of 100 PUTs outside the window. Rounds
alternate the order; the medians of this process's CPU (``time.process_time``, so
MiniStack's CPU is not counted) per PUT are reported, and the ratio direct / sdk. Say how
loaded the machine was: other processes change the caches, not the count.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
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
SDK, DIRECT = "sdk (baseline)", "direct"


async def cpu_ms_per_put(
    endpoint_url: str, bucket: str, *, direct: bool, puts: int, concurrency: int, size: int
) -> float:
    body = os.urandom(size)
    store = S3Store(
        bucket=bucket, endpoint_url=endpoint_url, region=REGION, credentials=CREDENTIALS
    )
    store._direct_puts_off = not direct
    slots = asyncio.Semaphore(concurrency)

    async def create() -> None:
        async with slots:
            await store.put(f"bench/{uuid.uuid4().hex}", body, if_none_match=True)

    async with store:
        for _ in range(WARM_UP):
            await create()
        if direct != (store._put_base_url is not None and not store._direct_puts_off):
            raise RuntimeError(f"the {'direct' if direct else 'sdk'} phase took the other path")
        started = time.process_time()
        await asyncio.gather(*(create() for _ in range(puts)))
        return (time.process_time() - started) / puts * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--puts", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--bytes", type=int, default=600, help="body size (a manifest: ~600)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    use_dummy_aws_credentials()
    results: dict[str, list[float]] = {SDK: [], DIRECT: []}
    with tempfile.TemporaryDirectory(prefix="lm-bench-put-") as work:
        server = start_ministack(Path(work) / "ministack")
        try:
            bucket = fresh_bucket(server)
            print(
                f"{args.puts} conditional creates of {args.bytes} bytes, {args.concurrency} in "
                f"flight, MiniStack; load {os.getloadavg()[0]:.2f} at the start",
                flush=True,
            )
            for round_ in range(args.rounds):
                order = (SDK, DIRECT) if round_ % 2 == 0 else (DIRECT, SDK)
                for phase in order:
                    cpu = asyncio.run(
                        cpu_ms_per_put(
                            server.endpoint_url,
                            bucket,
                            direct=phase == DIRECT,
                            puts=args.puts,
                            concurrency=args.concurrency,
                            size=args.bytes,
                        )
                    )
                    results[phase].append(cpu)
                    print(f"  round {round_ + 1} {phase}: {cpu:.3f} ms CPU a PUT", flush=True)
        finally:
            server.stop()
    sdk, direct = (statistics.median(results[phase]) for phase in (SDK, DIRECT))
    print(f"median over {args.rounds} rounds: {SDK} {sdk:.3f} ms, {DIRECT} {direct:.3f} ms")
    print(
        f"direct / sdk: {direct / sdk:.2f}x the CPU a PUT; load {os.getloadavg()[0]:.2f} at the end"
    )


if __name__ == "__main__":
    main()
