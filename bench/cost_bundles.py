"""`bench.cost_bundles`: the collectors' S3 requests per batch with group commit on and off,
against the rate per collector process (issue 33, PROTOCOL §3.10).

    .venv/bin/python -m bench.cost_bundles --quick   # 1 and 64 senders, 300 batches a row
    .venv/bin/python -m bench.cost_bundles           # 1, 4, 16 and 64 senders, 2,000 a row

Real ``lm-collector serve`` processes (``--collectors``, default 2, default settings) on
MiniStack behind a counting proxy (`bench.counting`), a fresh bucket per row. Each row
sends ``--batches`` new batches with ``--senders`` concurrent senders (each sends its next
batch when the previous one is answered; 1: one batch at a time), then stops the
collectors (SIGTERM flushes their index logs). Rows come in pairs: bundles **off** (no
feature record: a frame blob and a manifest a batch) and **on** (the feature record says
``bundles: true`` before the collectors start). The high end is measured again through
`bench.delay_proxy` (``--s3-latency-ms``, default 20 ms a request exchange; aiobotocore's
``Expect: 100-continue`` makes a PUT two exchanges) and labelled so: S3-like latency
lets more frames wait for a write slot, as against S3.

Columns: batches/s per collector process; frames per raw PUT (raw-blobs and raw-bundles
PUTs of the acknowledgement path); PUT-class a batch on the acknowledgement path and for
the collectors in all (+ index log flushes, the start-up probe, readiness checks and the
feature gate's once-a-minute version entry and feature record); GET-class a batch; $ per
million batches for the collectors' requests ($0.005 per 1,000 PUT-class, $0.0004 per
1,000 GET-class). The reconciler's and the rollup's share (end to end, and the rollup's
GETs per batch) is `bench.cost --bundles`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agent.uploader import Outcome, Uploader, UploadPolicy
from bench.cost import build_frames, send_all
from bench.cost_report import PROBES, RAW
from bench.cost_stack import STORE_PREFIX, CostStack, on_cost_stack
from bench.counting import CountingProxy, Tally, by_class, dollars, select
from bench.delay_proxy import DelayProxy, start_delay_proxy
from protocol import keys
from protocol.records import FeatureRecord
from store.retry import Backoff

LOG = ["index-log"]


@dataclass
class Row:
    latency_ms: float
    senders: int
    bundles: bool
    accepted: int
    seconds: float
    collectors: int
    ack: Tally
    everything: Tally

    @property
    def per_process_rate(self) -> float:
        return self.accepted / self.seconds / self.collectors if self.seconds else 0.0

    @property
    def raw_puts(self) -> int:
        return sum(n for (op, area), n in self.ack.items() if area in RAW and op.startswith("put"))

    def line(self) -> str:
        n = max(1, self.accepted)
        ack, total = by_class(self.ack), by_class(self.everything)
        put, get = total["PUT"] / n, total["GET"] / n
        where = (
            "MiniStack"
            if not self.latency_ms
            else f"S3-like, +{self.latency_ms:g} ms (delay proxy)"
        )
        return (
            f"| {where} | {self.senders} | {'on' if self.bundles else 'off'} | "
            f"{self.per_process_rate:.1f} | {self.accepted / max(1, self.raw_puts):.2f} | "
            f"{ack['PUT'] / n:.3f} | {put:.3f} | {get:.4f} | {dollars(put, get) * 1e6:.2f} |"
        )


async def one_row(
    stack: CostStack,
    args: argparse.Namespace,
    *,
    latency_ms: float,
    upstream: str,
    senders: int,
    bundles: bool,
    index: int,
) -> Row:
    bucket = await stack.new_bucket(f"b{index}")
    if bundles:  # a fresh store: nothing for `lm-reconciler enable-bundles` to wait for
        record = FeatureRecord(bundles=True, written_by="bench.cost_bundles", written_at_unix_ns=1)
        await stack.direct_store(bucket).put(keys.INDEX_FEATURES_KEY, record.to_json())
    proxy = CountingProxy(upstream=upstream, bucket=bucket, prefix=STORE_PREFIX)
    await proxy.start()
    stack.proxies[(bucket, "collectors")] = proxy
    env = stack.env(bucket, proxy.url)
    collectors = [
        await stack.start_collector(f"c{index}-{i + 1}", env) for i in range(args.collectors)
    ]
    frames = build_frames(args.batches, args.points, args.agents)
    policy = UploadPolicy(
        concurrency=senders,
        request_timeout_s=60.0,
        backoff=Backoff(attempts=6, base_s=0.1, cap_s=2.0),
    )
    async with Uploader(urls=[c.url for c in collectors], token=None, policy=policy) as uploader:
        before = proxy.snapshot()
        started = time.monotonic()
        outcomes = await send_all(uploader, frames, concurrency=senders, rate=None)
        seconds = time.monotonic() - started
        window = proxy.snapshot() - before
    await stack.stop_collectors()
    row = Row(
        latency_ms=latency_ms,
        senders=senders,
        bundles=bundles,
        accepted=outcomes[Outcome.ACCEPTED.value],
        seconds=seconds,
        collectors=args.collectors,
        ack=select(window, LOG + PROBES, exclude=True),
        everything=proxy.snapshot(),
    )
    print(f"  {row.line()}  load {os.getloadavg()[0]:.2f}", flush=True)
    return row


async def measure(args: argparse.Namespace, stack: CostStack) -> list[Row]:
    assert stack.ministack is not None
    delay: DelayProxy | None = None
    rows: list[Row] = []
    try:
        plan: list[tuple[float, str, int]] = [
            (0.0, stack.ministack.endpoint_url, s) for s in args.senders
        ]
        if args.s3_latency_ms:
            delay = start_delay_proxy(
                upstream_port=stack.ministack.port,
                delay_ms=args.s3_latency_ms,
                work_dir=stack.work_dir,
            )
            plan += [(args.s3_latency_ms, delay.endpoint_url, s) for s in args.s3_senders]
        for latency_ms, upstream, senders in plan:
            for bundles in (False, True):
                rows.append(
                    await one_row(
                        stack,
                        args,
                        latency_ms=latency_ms,
                        upstream=upstream,
                        senders=senders,
                        bundles=bundles,
                        index=len(rows),
                    )
                )
    finally:
        if delay is not None:
            delay.stop()
    return rows


def render(args: argparse.Namespace, rows: list[Row], uptimes: list[str]) -> str:
    out = [
        f"{args.collectors} collectors (default settings), {args.batches:,} new batches of "
        f"{args.points} points a row, a fresh bucket each; `uptime` before: `{uptimes[0]}`, "
        f"after: `{uptimes[-1]}`.",
        "",
        "| store | senders | bundles | batch/s per collector process | frames / raw PUT "
        "| ack PUT-class / batch | collectors PUT-class / batch | GET-class / batch "
        "| $ / M batches (collectors) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
        *(row.line() for row in rows),
        "",
    ]
    for row in rows:
        if row.senders == 1 and row.bundles:
            n = max(1, row.accepted)
            ack = by_class(row.ack)["PUT"]
            ok = ack == 2 * row.accepted
            out.append(
                f"- one sender, bundles on ({row.latency_ms:g} ms): {ack / n:.4f} PUT-class a batch "
                f"on the acknowledgement path (exactly 2.0): {'**PASS**' if ok else '**MISS**'}"
            )
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cost_bundles", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="300 batches, 1 and 64 senders")
    parser.add_argument("--collectors", type=int, default=2)
    parser.add_argument("--batches", type=int, help="new batches a row (default 2,000)")
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--senders", type=int, nargs="+", help="on MiniStack (1 4 16 64)")
    parser.add_argument("--s3-latency-ms", type=float, default=20.0, help="0: no S3-like rows")
    parser.add_argument("--s3-senders", type=int, nargs="+", help="S3-like rows (1 64)")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    args.batches = args.batches or (300 if args.quick else 2000)
    args.senders = args.senders or ([1, 64] if args.quick else [1, 4, 16, 64])
    args.s3_senders = args.s3_senders or ([64] if args.quick else [1, 64])
    return args


def _uptime() -> str:
    with open("/proc/loadavg") as f:
        return (
            f"{time.strftime('%H:%M:%S', time.gmtime())} UTC load {' '.join(f.read().split()[:3])}"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work_dir = Path(tempfile.mkdtemp(prefix="lm-cost-bundles-"))
    uptimes = [_uptime()]
    try:
        rows = asyncio.run(on_cost_stack(work_dir, lambda stack: measure(args, stack)))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    uptimes.append(_uptime())
    text = render(args, rows, uptimes)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
