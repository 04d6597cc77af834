"""`bench.reconcile`: the full audit (an anti-join with the catalog) against an in-run
list-and-GET baseline on MiniStack.

    .venv/bin/python -m bench.reconcile                 # 100k manifests, concurrency 32
    .venv/bin/python -m bench.reconcile --quick         # 10k manifests

One MiniStack (127.0.0.1, data dir on /dev/shm when it has room), one bucket seeded on
disk (`bench.reconcile_seed`: N blobs and manifests, and a catalog lacking every
``--missing-every``-th manifest), one `store.s3.S3Store` for every phase, in order:

1. **baseline**: list ``accepted/v1/`` and GET every manifest, ``--concurrency`` at once:
   what an audit that reads every record costs (the audit before the index did that and
   more);
2. **audit, repair**: `run_full_audit` on the seeded catalog: it lists ``accepted/v1/``,
   ``quarantine/v1/`` and ``raw-blobs/v1/``, reads the catalog files, and GETs only the
   manifests the catalog lacks (checked: exactly those are cataloged);
3. **audit, steady**: the same audit again, the catalog now complete (verification of
   blobs at the default ``verify_rate_per_s``, as deployed), then **verification paused**;
4. **baseline again**. Ratios use the mean of the two baselines. Target: the steady audit
   at >= 3x the baseline's manifests per second.

Store requests are counted per HTTP request with aiobotocore's ``after-call`` events
and, for the direct small PUTs, on its HTTP session (`RequestTally`); CPU per process
from /proc (MiniStack, this process = ``driver``, and ``others``: the rest of the
shared machine). Benchmarks are not tests.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from bench import _common as c
from bench.reconcile_seed import MINISTACK_ACCOUNT, Fleet, seed_on_disk, spot_check
from chaos.s3_server import CREDENTIALS, REGION, start_ministack, use_dummy_aws_credentials
from config import GcSettings, LoggingSettings, ReconcilerSettings, Settings, configure_logging
from protocol import keys
from protocol.clock import SystemClock
from reconciler.audit.run import run_full_audit
from reconciler.context import ReconcilerContext, open_context
from store.s3 import S3Store
from store.s3_direct import OPERATION_METHODS

TARGET = 3.0
PAUSED_VERIFY_RATE = 1e-3  # one blob, then a ~1000 s wait for the next token
HOUR_NS = 3600 * keys.NS_PER_S
SDK_REQUEST_HEADER = "amz-sdk-invocation-id"  # botocore's, on every request it sends
DIRECT_OPERATIONS = {method: operation for operation, method in OPERATION_METHODS.items()}


class RequestTally:
    """Every HTTP request of the store's aiobotocore client, by operation and status:
    botocore's events for the requests of its pipeline, and a count on the client's HTTP
    session for the PutObjects and GetObjects `store.s3_direct` sends without it (the
    ones without botocore's ``amz-sdk-invocation-id`` header)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def attach(self, client: Any) -> None:
        client.meta.events.register("after-call.s3", self._after)
        client.meta.events.register("after-call-error.s3", self._error)
        session = client._endpoint.http_session
        send = session.send

        async def counted_send(request: Any) -> Any:
            if SDK_REQUEST_HEADER in request.headers:
                return await send(request)  # counted by the events
            operation = DIRECT_OPERATIONS[request.method]
            try:
                response = await send(request)
            except Exception as exc:
                self.counts[f"{operation} {type(exc).__name__}"] += 1
                raise
            self.counts[f"{operation} {response.status_code}"] += 1
            return response

        session.send = counted_send

    def _after(self, http_response: Any, model: Any, **_: Any) -> None:
        self.counts[f"{model.name} {http_response.status_code}"] += 1

    def _error(self, exception: BaseException, context: dict[str, Any], **_: Any) -> None:
        self.counts[f"{context.get('operation_name', '?')} {type(exception).__name__}"] += 1


@dataclass
class Phase:
    name: str
    manifests: int = 0
    seconds: float = 0.0
    requests: dict[str, int] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.manifests / self.seconds if self.seconds else 0.0

    def per_manifest(self, value: float) -> float:
        return value / self.manifests if self.manifests else 0.0


@dataclass
class Bench:
    store: S3Store
    tally: RequestTally
    ministack_pid: int
    fleet: Fleet
    concurrency: int
    quiet_wait_s: float
    phases: list[Phase] = field(default_factory=list)

    async def measure(self, name: str, run: Callable[[Phase], Awaitable[int]]) -> Phase:
        phase = Phase(name)
        await asyncio.to_thread(c.wait_for_quiet, max_wait_s=self.quiet_wait_s)
        before = Counter(self.tally.counts)
        meter = c.CpuMeter({"ministack": [self.ministack_pid], "driver": [os.getpid()]})
        meter.start()
        started = time.perf_counter()
        phase.manifests = await run(phase)
        phase.seconds = time.perf_counter() - started
        phase.cpu_s = meter.stop()
        phase.requests = dict(self.tally.counts - before)
        self.phases.append(phase)
        print(
            f"  {name}: {phase.manifests} in {phase.seconds:.1f} s = {phase.rate:.1f}/s, "
            f"{sum(phase.requests.values()) / max(1, phase.manifests):.3f} requests each, "
            f"others {phase.cpu_s.get('others', 0) / phase.seconds:.2f} cores",
            flush=True,
        )
        return phase

    async def baseline(self, phase: Phase) -> int:
        """List ``accepted/v1/`` and GET every manifest, ``concurrency`` at once."""
        queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=4 * self.concurrency)
        done = 0

        async def worker() -> None:
            nonlocal done
            while (key := await queue.get()) is not None:
                await self.store.get(key)
                done += 1

        async with asyncio.TaskGroup() as group:
            for _ in range(self.concurrency):
                group.create_task(worker())
            async for info in self.store.list(keys.ACCEPTED_PREFIX):
                await queue.put(info.key)
            for _ in range(self.concurrency):
                await queue.put(None)
        if done != self.fleet.manifests:
            raise RuntimeError(f"the baseline read {done} manifests; seeded {self.fleet.manifests}")
        return done

    def audit(
        self, ctx: ReconcilerContext, *, expect_cataloged: int
    ) -> Callable[[Phase], Awaitable[int]]:
        async def run(phase: Phase) -> int:
            record = await run_full_audit(ctx)
            phase.notes = {
                "status": record.status,
                "cataloged": record.cataloged,
                "problems": record.problems,
                "blobs_listed": record.blobs_listed,
                "orphans": record.orphans,
            }
            if record.status != "completed" or record.cataloged != expect_cataloged:
                raise RuntimeError(
                    f"{phase.name}: expected {expect_cataloged} cataloged, got {phase.notes}"
                )
            if record.problems or record.manifests_seen != self.fleet.manifests:
                raise RuntimeError(f"{phase.name}: {record.manifests_seen} seen, {phase.notes}")
            return record.manifests_seen

        return run


def audit_settings(concurrency: int, verify_rate_per_s: float) -> Settings:
    return Settings(
        reconciler=ReconcilerSettings(concurrency=concurrency, verify_rate_per_s=verify_rate_per_s),
        gc=GcSettings(enabled=False),
    )


async def run(
    args: argparse.Namespace, work_dir: Path, fleet: Fleet
) -> tuple[list[Phase], dict[str, Any]]:
    bucket = f"lm-bench-rec-{os.getpid()}"
    objects, size, seconds = await asyncio.to_thread(
        seed_on_disk, work_dir / "ministack" / "s3" / MINISTACK_ACCOUNT / bucket, fleet
    )
    seed: dict[str, Any] = {"objects": objects, "bytes": size, "write_s": round(seconds, 1)}
    print(f"seeded {objects} objects ({size / c.MiB:.0f} MiB) in {seconds:.1f} s", flush=True)
    started = time.perf_counter()
    server = await asyncio.to_thread(start_ministack, work_dir / "ministack", timeout_s=1800.0)
    try:
        store = S3Store(
            bucket=bucket,
            endpoint_url=server.endpoint_url,
            region=REGION,
            credentials=CREDENTIALS,
            max_pool_connections=max(64, 2 * args.concurrency),
        )
        await store.open()
        tally = RequestTally()
        tally.attach(await store._s3())  # benchmark-only: S3Store keeps its client private
        try:
            seed["spot_checked"] = await spot_check(store, fleet, random.Random(3))
            seed["server_ready_s"] = round(time.perf_counter() - started, 1)
            assert server.pid is not None
            bench = Bench(store, tally, server.pid, fleet, args.concurrency, args.quiet_wait_s)
            clock = SystemClock()
            ctx = await open_context(
                store,
                settings=audit_settings(args.concurrency, args.verify_rate),
                clock=clock,
                rng=random.Random(11),
                owner="bench-reconciler",
            )
            print("phases:", flush=True)
            await bench.measure("baseline (list + GET)", bench.baseline)
            await bench.measure("audit, repair", bench.audit(ctx, expect_cataloged=fleet.missing))
            await bench.measure("audit, steady", bench.audit(ctx, expect_cataloged=0))
            paused = dataclasses.replace(
                ctx, settings=audit_settings(args.concurrency, PAUSED_VERIFY_RATE)
            )
            await bench.measure(
                "audit, steady, verification paused", bench.audit(paused, expect_cataloged=0)
            )
            await bench.measure("baseline again", bench.baseline)
            await ctx.fence.release()
            return bench.phases, seed
        finally:
            await store.close()
    finally:
        server.stop()


def markdown(
    phases: list[Phase], fleet: Fleet, seed: dict[str, Any], loads: Sequence[tuple[float, ...]]
) -> str:
    baselines = [p.rate for p in phases if p.name.startswith("baseline")]
    base = sum(baselines) / len(baselines)
    lines = [
        f"{fleet.manifests:,} manifests over {fleet.agents} agents x {fleet.boots} boots, "
        f"{fleet.blob_bytes}-byte blobs; the seeded catalog lacks {fleet.missing:,}. Seed: {seed}.",
        "",
        "| phase | manifests | s | manifests/s | x baseline | requests/manifest | MiniStack ms CPU/manifest | driver ms CPU/manifest | others (cores) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in phases:
        lines.append(
            f"| {p.name} | {p.manifests:,} | {p.seconds:.1f} | {p.rate:.1f} | {p.rate / base:.2f} | "
            f"{p.per_manifest(sum(p.requests.values())):.4f} | "
            f"{1000 * p.per_manifest(p.cpu_s.get('ministack', 0)):.2f} | "
            f"{1000 * p.per_manifest(p.cpu_s.get('driver', 0)):.2f} | "
            f"{p.cpu_s.get('others', 0) / p.seconds:.2f} |"
        )
    lines += ["", "Requests by operation and status:", ""]
    for p in phases:
        detail = ", ".join(
            f"{k}: {v:,}" for k, v in sorted(p.requests.items(), key=lambda kv: -kv[1])
        )
        lines.append(f"- {p.name}: {detail}; {p.notes or ''}")
    steady = next(p for p in phases if p.name == "audit, steady")
    ratio = steady.rate / base
    lines += [
        "",
        f"**Target: steady audit >= {TARGET:g}x the list+GET baseline: "
        f"{'PASS' if ratio >= TARGET else 'MISS'} ({ratio:.2f}x; baseline mean {base:.1f} manifests/s).**",
        f"Load average at start / end: {loads[0]} / {loads[-1]}.",
    ]
    return "\n".join(lines)


def default_work_root(fleet: Fleet) -> str:
    """`bench._common.fast_temp_root` for the fleet's objects."""
    return c.fast_temp_root(fleet.manifests * (2 * 2 * 4096 + fleet.blob_bytes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reconcile", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--manifests", type=int, default=None, help="default 100000 (--quick: 10000)"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--agents", type=int, default=256)
    parser.add_argument("--boots", type=int, default=2)
    parser.add_argument("--blob-bytes", type=int, default=1024)
    parser.add_argument("--missing-every", type=int, default=10, help="catalog lacks every n-th")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--verify-rate", type=float, default=ReconcilerSettings().verify_rate_per_s)
    parser.add_argument("--quiet-wait-s", type=float, default=15.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(argv)
    manifests = args.manifests or (10_000 if args.quick else 100_000)
    use_dummy_aws_credentials()
    configure_logging(LoggingSettings(level="warning", format="console"))
    now_ns = time.time_ns()
    fleet = Fleet(
        manifests,
        args.agents,
        args.boots,
        args.blob_bytes,
        first_ns=now_ns - 23 * HOUR_NS,
        span_ns=22 * HOUR_NS,
        missing_every=args.missing_every,
    )
    work_dir = Path(tempfile.mkdtemp(prefix="lm-bench-reconcile-", dir=default_work_root(fleet)))
    loads = [os.getloadavg()]
    try:
        phases, seed = uvloop.run(run(args, work_dir, fleet))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    loads.append(os.getloadavg())
    text = markdown(phases, fleet, seed, loads)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "fleet": dataclasses.asdict(fleet),
                    "seed": seed,
                    "loads": loads,
                    "phases": [dataclasses.asdict(p) for p in phases],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
