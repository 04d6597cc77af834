"""`bench.audit_listing`: a full audit's ranged listing (`reconciler.audit.listing`) with
1 stream and with 16, on MiniStack behind a 10 ms delay line (issue 23: 16 streams >= 8x
the throughput of 1 over the same store).

    .venv/bin/python -m bench.audit_listing                    # 100k manifests, 200 agents
    .venv/bin/python -m bench.audit_listing --manifests 20000 --delay-ms 10,100 --profile

One MiniStack seeded on disk (`bench.reconcile_seed`: N manifests and N raw blobs, and a
catalog the listing ignores), reached through `bench.delay_proxy.start_delay_proxy` (every
request's round trip + ``--delay-ms``). Each phase lists every range of a fresh audit into
Parquet parts (written to the same store, as the audit does) and checks that it listed
every manifest and blob. Reported: wall time, keys/s, LIST requests, CPU of this process
(``driver``: client CPU per key, parts included) and of MiniStack. ``--profile`` then lists
once more without the proxy under cProfile and prints where the client CPU goes.
Benchmarks are not tests.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import uvloop

from bench import _common as c
from bench.delay_proxy import DelayProxy, start_delay_proxy
from bench.reconcile import default_work_root
from bench.reconcile_seed import MINISTACK_ACCOUNT, Fleet, seed_on_disk
from chaos.s3_server import CREDENTIALS, REGION, start_ministack, use_dummy_aws_credentials
from protocol import keys
from reconciler.audit.listing import ListingParts, list_for_audit
from store.s3 import S3Store

TARGET = 8.0
HOUR_NS = 3600 * keys.NS_PER_S


@dataclass
class Run:
    delay_ms: float
    streams: int
    seconds: float
    listing: ListingParts
    cpu_s: dict[str, float]

    @property
    def keys(self) -> int:
        return sum(self.listing.keys_listed.values())

    @property
    def rate(self) -> float:
        return self.keys / self.seconds


def s3(endpoint_url: str, bucket: str, pool: int) -> S3Store:
    return S3Store(
        bucket=bucket,
        endpoint_url=endpoint_url,
        region=REGION,
        credentials=CREDENTIALS,
        max_pool_connections=pool,
    )


async def list_once(
    store: S3Store, delay_ms: float, streams: int, audit: int, fleet: Fleet, pid: int
) -> Run:
    audit_dir = keys.audit_listing_prefix(time.time_ns(), f"{audit:08x}")
    await asyncio.to_thread(c.wait_for_quiet, max_wait_s=10.0)
    meter = c.CpuMeter({"ministack": [pid], "driver": [os.getpid()]})
    meter.start()
    started = time.perf_counter()
    listing = await list_for_audit(store, audit_dir, concurrency=streams)
    run = Run(delay_ms, streams, time.perf_counter() - started, listing, meter.stop())
    want = {
        "accepted": fleet.manifests,
        "quarantine": 0,
        "raw-blobs": fleet.manifests,
        "raw-bundles": 0,  # listed since bundles (PROTOCOL §3.10); the fleet writes none
    }
    if listing.keys_listed != want:
        raise RuntimeError(f"listed {listing.keys_listed}, seeded {want}")
    print(
        f"  {delay_ms:g} ms, {streams:2d} streams: {run.keys:,} keys in {run.seconds:.2f} s = {run.rate:,.0f}/s, "
        f"{listing.ranges_total} ranges, {listing.list_requests} LISTs, driver "
        f"{1e6 * run.cpu_s['driver'] / run.keys:.1f} µs CPU/key, MiniStack "
        f"{1e6 * run.cpu_s['ministack'] / run.keys:.1f} µs/key, others "
        f"{run.cpu_s['others'] / run.seconds:.2f} cores",
        flush=True,
    )
    return run


async def profile(store: S3Store, fleet: Fleet) -> str:
    """cProfile one listing of ``accepted/v1/`` and ``raw-blobs/v1/`` (no proxy, one
    stream, no parts): the client CPU per key of `S3Store.list` alone."""
    profiler = cProfile.Profile()
    cpu = time.process_time()
    profiler.enable()
    listed = 0
    for prefix in (keys.ACCEPTED_PREFIX, "raw-blobs/v1/"):
        async for _info in store.list(prefix):
            listed += 1
    profiler.disable()
    cpu = time.process_time() - cpu
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(18)
    return f"{listed:,} keys, {1e6 * cpu / listed:.1f} µs CPU/key under cProfile\n{out.getvalue()}"


async def run(args: argparse.Namespace, work_dir: Path, fleet: Fleet) -> tuple[list[Run], str]:
    bucket = f"lm-bench-list-{os.getpid()}"
    objects, _size, seconds = await asyncio.to_thread(
        seed_on_disk, work_dir / "ministack" / "s3" / MINISTACK_ACCOUNT / bucket, fleet
    )
    print(f"seeded {objects} objects in {seconds:.1f} s", flush=True)
    server = await asyncio.to_thread(start_ministack, work_dir / "ministack", timeout_s=1800.0)
    proxies: list[DelayProxy] = []
    try:
        assert server.pid is not None
        direct = s3(server.endpoint_url, bucket, 64)
        try:
            # MiniStack loads a bucket from disk on first use: not part of any phase.
            [_ async for _ in direct.list(keys.ACCEPTED_PREFIX)]
            runs: list[Run] = []
            for delay_ms in args.delay_ms:
                proxy = start_delay_proxy(
                    upstream_port=server.port, delay_ms=delay_ms, work_dir=work_dir
                )
                proxies.append(proxy)
                delayed = s3(proxy.endpoint_url, bucket, 64)
                try:
                    for streams in args.streams:
                        n = len(runs) + 1
                        runs.append(
                            await list_once(delayed, delay_ms, streams, n, fleet, server.pid)
                        )
                finally:
                    await delayed.close()
            profiled = await profile(direct, fleet) if args.profile else ""
            return runs, profiled
        finally:
            await direct.close()
    finally:
        for proxy in proxies:
            proxy.stop()
        server.stop()


def markdown(runs: list[Run], fleet: Fleet, args: argparse.Namespace, loads: list[str]) -> str:
    lines = [
        f"{fleet.manifests:,} manifests over {fleet.agents} agents (+ as many raw blobs), "
        "MiniStack behind a delay line.",
        "",
        "| delay ms | streams | keys | s | keys/s | ranges | LISTs | driver µs CPU/key | MiniStack µs CPU/key | others (cores) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r.delay_ms:g} | {r.streams} | {r.keys:,} | {r.seconds:.2f} | {r.rate:,.0f} | "
            f"{r.listing.ranges_total} | {r.listing.list_requests} | "
            f"{1e6 * r.cpu_s['driver'] / r.keys:.1f} | {1e6 * r.cpu_s['ministack'] / r.keys:.1f} | "
            f"{r.cpu_s['others'] / r.seconds:.2f} |"
        )
    lines.append("")
    for delay in args.delay_ms:
        at = [r for r in runs if r.delay_ms == delay]
        one = next((r for r in at if r.streams == 1), None)
        many = max(at, key=lambda r: r.streams)
        if one is not None and many is not one:
            ratio = many.rate / one.rate
            verdict = "PASS" if ratio >= TARGET else "MISS"
            lines.append(
                f"**{delay:g} ms: {many.streams} streams / 1 stream = {ratio:.2f}x "
                f"({verdict}, target {TARGET:g}x).**"
            )
    lines.append(f"Load (uptime) at start / end: {loads[0]} / {loads[-1]}.")
    return "\n".join(lines)


def uptime() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.audit_listing", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--manifests", type=int, default=100_000)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument(
        "--delay-ms", type=lambda t: [float(x) for x in t.split(",")], default=[10.0]
    )
    parser.add_argument("--streams", type=lambda t: [int(x) for x in t.split(",")], default=[1, 16])
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(argv)
    use_dummy_aws_credentials()
    now_ns = time.time_ns()
    fleet = Fleet(
        args.manifests, args.agents, 1, 64, first_ns=now_ns - 23 * HOUR_NS, span_ns=22 * HOUR_NS
    )
    work_dir = Path(tempfile.mkdtemp(prefix="lm-bench-listing-", dir=default_work_root(fleet)))
    loads = [uptime()]
    try:
        runs, profiled = uvloop.run(run(args, work_dir, fleet))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    loads.append(uptime())
    text = markdown(runs, fleet, args, loads)
    print(text)
    if profiled:
        print(profiled)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
