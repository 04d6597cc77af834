"""`bench.ingest_bundles`: group commit on against off, as interleaved runs (issue 33).

    .venv/bin/python -m bench.ingest_bundles --quick     # c32 and c1, 3 rounds, short windows
    .venv/bin/python -m bench.ingest_bundles             # c32 and c1, 5 rounds
    .venv/bin/python -m bench.ingest_bundles --latency-ms 20 --concurrency 32 --rounds 3
    .venv/bin/python -m bench.ingest_bundles --concurrency 32 --rounds 1 --profile   # + py-spy
    .venv/bin/python -m bench.ingest_bundles --concurrency 32 --checked-baseline     # + checks

Per concurrency, ``--rounds`` rounds, each: a fresh ``lm-collector serve`` with bundles
**off** (no feature record: 2 PUTs a batch), one with bundles **on** (the store's feature
record says ``bundles: true`` before it starts; default ``[ingest]`` bundle settings),
then the HTTP 2-PUT baseline (`bench.http_baseline`), in that order and alternating which
collector goes first, each a `bench.ingest` collector phase (warm-up, a bounded wait for
a quiet machine, a measured window). Runs are compared by their **median**, so one run
slowed by another session's tests does not decide it.

Printed per concurrency: ack p50 and p99 (on/off ratio; targets at c32: p50 no worse,
p99 within 1.2x; at c1: both within 5 %), frames per raw PUT and the mean slot wait
(`lm_collector_bundle_slot_wait_seconds`), batches/s, and collector CPU per batch
(workers only, index log flushes included) against the HTTP 2-PUT baseline's: the
CPU-bound throughput ratio (target >= 1.0x), beside the measured throughput ratio. With
``--checked-baseline`` each round ends with a fourth phase, the baseline checking every
frame with the collector's own code (``bench.http_baseline --check-frames``), and the
collector's CPU is also compared with it (informational: the issue's target is the
plain baseline).
Timings are ratios within one run, never absolute targets.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import _common as c
from bench.delay_proxy import start_delay_proxy
from bench.ingest import build_frames
from bench.ingest import parse_args as ingest_args
from bench.ingest_baselines import CHECKED_PATH, http_baseline
from bench.ingest_collector import collector_phase
from bench.ingest_phases import Bench, PhaseResult
from bench.ingest_profile import profile_collector
from chaos.s3_server import start_ministack, use_dummy_aws_credentials
from config import LoggingSettings, configure_logging

PATHS = ("off", "on", "http-base")
CHECKED = CHECKED_PATH  # the HTTP 2-PUT baseline that also checks each frame


async def run(
    args: argparse.Namespace, work_dir: Path
) -> tuple[dict[int, dict[str, list[PhaseResult]]], str | None]:
    bench = Bench(args, build_frames(args), work_dir, c.install_retry_tally())
    runs: dict[int, dict[str, list[PhaseResult]]] = {}
    profile: str | None = None
    latency = args.latency_ms[0]
    try:
        if args.store == "ministack":
            bench.ministack = start_ministack(work_dir / "ministack")
            if latency:
                bench.proxies[latency] = start_delay_proxy(
                    upstream_port=bench.ministack.port, delay_ms=latency, work_dir=work_dir
                )
        for concurrency in args.concurrency:
            baselines = ("http-base", CHECKED) if args.checked_baseline else ("http-base",)
            runs[concurrency] = {path: [] for path in (*PATHS, *baselines[1:])}
            for round_ in range(args.rounds):
                order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
                for path in (*order, *baselines):
                    if path in baselines:
                        phase = await http_baseline(
                            bench, args.store, latency, concurrency, check_frames=path == CHECKED
                        )
                    else:
                        phase = await collector_phase(
                            bench, args.store, latency, concurrency, bundles=path == "on"
                        )
                    runs[concurrency][path].append(phase)
                    _progress(f"c{concurrency} round {round_ + 1} {path}", phase)
        if args.profile:
            top = max(args.concurrency)
            profile = await profile_collector(
                bench, args.store, latency, top, args.profile, bundles=True
            )
    finally:
        for proxy in bench.proxies.values():
            proxy.stop()
        if bench.ministack is not None:
            bench.ministack.stop()
    return runs, profile


def _progress(label: str, p: PhaseResult) -> None:
    extra = ""
    if p.frames_per_raw_put is not None:
        extra = f", {p.frames_per_raw_put:.2f} frames/raw PUT, slot wait {p.slot_wait_ms:.2f} ms"
    print(
        f"  {label}: {p.batches} batches, {p.batches_per_s:.0f}/s, p50 {p.p50_ms:.1f} ms, "
        f"p99 {p.p99_ms:.1f} ms{extra}, others {p.others_cores:.2f} cores, "
        f"load {'/'.join(f'{v:.2f}' for v in p.load_avg)}",
        file=sys.stderr,
        flush=True,
    )


def collector_cpu_per_batch(p: PhaseResult) -> float:
    """CPU seconds a batch of the serving process(es), index log flushes included."""
    cpu = p.cpu_incl_drain_s or p.cpu_s
    return cpu.get("collector", 0.0) / p.batches if p.batches else float("inf")


def _median(phases: list[PhaseResult], value: Callable[[PhaseResult], float | None]) -> float:
    got = [v for v in (value(p) for p in phases) if v is not None]
    return statistics.median(got) if got else float("nan")


def _verdict(ok: bool) -> str:
    return "**PASS**" if ok else "**MISS**"


def render(args: argparse.Namespace, runs: dict[int, dict[str, list[PhaseResult]]]) -> str:
    out = [
        f"Store {args.store}, injected latency {args.latency_ms[0]:g} ms, {args.rounds} rounds "
        f"per concurrency (off/on alternating first, then the HTTP 2-PUT baseline), windows "
        f"of <= {args.batches} batches or {args.phase_s:g} s; medians over the rounds.",
        "",
        "| c | path | batch/s | ack p50 ms | ack p99 ms | frames / raw PUT | slot wait ms "
        "| collector CPU ms / batch | others (cores) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts: list[str] = []
    for concurrency, by_path in runs.items():
        med: dict[str, dict[str, float]] = {}
        for path, phases in by_path.items():
            med[path] = {
                "rate": _median(phases, lambda p: p.batches_per_s),
                "p50": _median(phases, lambda p: p.p50_ms),
                "p99": _median(phases, lambda p: p.p99_ms),
                "fpp": _median(phases, lambda p: p.frames_per_raw_put),
                "wait": _median(phases, lambda p: p.slot_wait_ms),
                "cpu": _median(phases, collector_cpu_per_batch),
                "others": _median(phases, lambda p: p.others_cores),
            }
            m = med[path]
            runs_p50 = "/".join(f"{p.p50_ms:.1f}" for p in phases)
            out.append(
                f"| {concurrency} | {path} | {m['rate']:.0f} | {m['p50']:.1f} ({runs_p50}) "
                f"| {m['p99']:.1f} | {m['fpp']:.2f} | {m['wait']:.2f} | {m['cpu'] * 1000:.2f} "
                f"| {m['others']:.2f} |"
            )
        on, off, base = med["on"], med["off"], med["http-base"]
        p50, p99 = on["p50"] / off["p50"], on["p99"] / off["p99"]
        if concurrency == 1:
            verdicts.append(
                f"- c1: ack p50 on/off {p50:.3f}x, p99 {p99:.3f}x (within 5 %): "
                f"{_verdict(p50 <= 1.05 and p99 <= 1.05)}"
            )
        else:
            verdicts.append(
                f"- c{concurrency}: ack p50 on/off {p50:.3f}x (no worse) {_verdict(p50 <= 1.0)}, "
                f"p99 {p99:.3f}x (within 1.2x) {_verdict(p99 <= 1.2)}; frames per raw PUT "
                f"{on['fpp']:.2f}, mean slot wait {on['wait']:.2f} ms"
            )
            cpu_ratio = base["cpu"] / on["cpu"]
            verdicts.append(
                f"- c{concurrency} CPU: collector {on['cpu'] * 1000:.2f} ms a batch with bundles "
                f"(off: {off['cpu'] * 1000:.2f}), HTTP 2-PUT baseline {base['cpu'] * 1000:.2f}: "
                f"CPU-bound throughput ratio {cpu_ratio:.2f}x (>= 1.0x) "
                f"{_verdict(cpu_ratio >= 1.0)}; measured batch/s on/base "
                f"{on['rate'] / base['rate']:.2f}x, on/off {on['rate'] / off['rate']:.2f}x"
            )
            if CHECKED in med:
                checked = med[CHECKED]
                verdicts.append(
                    f"- c{concurrency} CPU against the baseline that checks each frame "
                    f"(informational, not the issue's target): "
                    f"{checked['cpu'] * 1000:.2f} ms a batch, of which "
                    f"{(checked['cpu'] - base['cpu']) * 1000:.2f} ms the checks; "
                    f"CPU-bound throughput ratio {checked['cpu'] / on['cpu']:.2f}x"
                )
    return "\n".join([*out, "", "Targets:", "", *verdicts])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ingest_bundles", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="3 rounds of short windows")
    parser.add_argument("--store", choices=("fs", "ministack"), default="ministack")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="MiniStack only")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 1])
    parser.add_argument("--rounds", type=int, help="runs of each path (default 5; --quick 3)")
    parser.add_argument("--batches", type=int, help="measured batches per window (cap)")
    parser.add_argument("--phase-s", type=float, help="seconds per measured window (cap)")
    parser.add_argument(
        "--profile",
        nargs="?",
        const="py-spy",
        choices=("py-spy", "cprofile"),
        help="then one bundles-on phase at the highest concurrency under a profiler",
    )
    parser.add_argument(
        "--checked-baseline",
        action="store_true",
        help="each round also runs the HTTP 2-PUT baseline with the collector's frame checks",
    )
    parser.add_argument("--json", type=Path)
    own = parser.parse_args(argv)
    args = ingest_args(
        [
            "--store",
            own.store,
            "--latency-ms",
            str(own.latency_ms),
            "--concurrency",
            *map(str, own.concurrency),
            *(["--quick"] if own.quick else []),
            *(["--batches", str(own.batches)] if own.batches else []),
            *(["--phase-s", str(own.phase_s)] if own.phase_s else []),
        ]
    )
    args.rounds = own.rounds or (3 if own.quick else 5)
    args.json = own.json
    args.profile = own.profile
    args.checked_baseline = own.checked_baseline
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    use_dummy_aws_credentials()
    configure_logging(LoggingSettings(level="warning", format="console"))
    import uvloop

    started = time.monotonic()
    work_dir = Path(tempfile.mkdtemp(prefix="lm-bench-bundles-"))
    try:
        runs, profile = uvloop.run(run(args, work_dir))
        print(render(args, runs))
        if profile:
            print("\n" + profile)
        print(f"\nwall time: {time.monotonic() - started:.0f} s")
        if args.json:
            payload: dict[str, Any] = {
                str(conc): {
                    path: [
                        {
                            "batches_per_s": p.batches_per_s,
                            "p50_ms": p.p50_ms,
                            "p99_ms": p.p99_ms,
                            "frames_per_raw_put": p.frames_per_raw_put,
                            "slot_wait_ms": p.slot_wait_ms,
                            "collector_cpu_s_per_batch": collector_cpu_per_batch(p),
                            "others_cores": p.others_cores,
                            "load_avg": p.load_avg,
                        }
                        for p in phases
                    ]
                    for path, phases in by_path.items()
                }
                for conc, by_path in runs.items()
            }
            args.json.write_text(json.dumps(payload, indent=2))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
