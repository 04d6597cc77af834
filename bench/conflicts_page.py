"""One page of ``GET /v1/conflicts`` on S3-like latency: its records read 16 at a time
(`collector.conflicts_api.READ_CONCURRENCY`) against one after another, the baseline,
measured in the same run.

    python -m bench.conflicts_page [--records 1000] [--latency-ms 20] [--rounds 3]

MiniStack with `bench.delay_proxy` in front (every request ``--latency-ms`` longer, as
S3 from a nearby host), ``--records`` quarantine records planted directly, then rounds
of `read_conflicts_page` (the endpoint's reader, without HTTP), interleaved: the
baseline with one reader, then the product's setting. Prints each round, the medians
and their ratio. Processes started here are stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from bench.delay_proxy import delayed_ministack
from collector import conflicts_api
from protocol import keys, records
from store.base import ObjectStore

PREFIX = "bench-conflicts"


def conflict(i: int) -> records.IdentityConflict:
    boot = uuid.UUID(int=i + 1)
    identity = keys.BatchIdentity(f"agent-{i % 50}", boot, i, i)
    accepted = hashlib.sha256(f"accepted {i}".encode()).hexdigest()
    submitted = hashlib.sha256(f"submitted {i}".encode()).hexdigest()
    return records.IdentityConflict(
        agent_id=identity.agent_id,
        boot_id=str(boot),
        seq_start=i,
        seq_end=i,
        accepted_manifest_key=keys.accepted_manifest_key(identity),
        accepted_raw_blob_key=keys.raw_blob_key(accepted),
        accepted_frame_sha256=accepted,
        submitted_raw_blob_key=keys.raw_blob_key(submitted),
        submitted_frame_sha256=submitted,
        observed_at_unix_ns=1_790_000_000_000_000_000 + i,
        collector_id="bench",
    )


async def plant(store: ObjectStore, count: int) -> None:
    slots = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        async with slots:
            record = conflict(i)
            await store.put(record.quarantine_key, record.to_json(), if_none_match=True)

    await asyncio.gather(*(one(i) for i in range(count)))


async def timed_page(store: ObjectStore, limit: int, readers: int) -> tuple[float, int]:
    conflicts_api.READ_CONCURRENCY = readers
    query = conflicts_api.ConflictQuery(agent_id=None, since_ns=None, limit=limit, after=None)
    started = time.perf_counter()
    page = await conflicts_api.read_conflicts_page(store, query)
    return time.perf_counter() - started, len(page.conflicts)


async def run(records_n: int, latency_ms: float, rounds: int, work: Path) -> None:
    product = conflicts_api.READ_CONCURRENCY
    try:
        async with delayed_ministack(work, PREFIX, latency_ms) as stores:
            await plant(stores.direct, records_n)
            times: dict[int, list[float]] = {1: [], product: []}
            for round_no in range(rounds):
                for readers in (1, product):
                    seconds, read = await timed_page(stores.delayed, records_n, readers)
                    assert read == records_n, (read, records_n)
                    times[readers].append(seconds)
                    print(
                        f"round {round_no + 1}: {readers:>2} reader(s) {seconds:.3f} s "
                        f"({read} records)"
                    )
    finally:
        conflicts_api.READ_CONCURRENCY = product
    base, ours = statistics.median(times[1]), statistics.median(times[product])
    print(
        f"median: 1 reader {base:.3f} s, {product} readers {ours:.3f} s; "
        f"ratio {base / ours:.1f}x faster ({records_n} records, {latency_ms:g} ms a request)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lm-bench-conflicts-") as work:
        asyncio.run(run(args.records, args.latency_ms, args.rounds, Path(work)))


if __name__ == "__main__":
    main()
