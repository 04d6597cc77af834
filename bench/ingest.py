"""Ingest benchmark: collectors against their in-run baseline, at equal concurrency.

    .venv/bin/python -m bench.ingest [--quick] [--store fs|ministack|both]
                                     [--latency-ms 0 20] [--concurrency 1 32 64] ...

For each scenario (store, injected latency, concurrency) it runs, one after the other
against the same store server:

- **baseline** (in-process): what the acceptance protocol costs with nothing in front of
  it. Per batch, two sequential create-if-absent PUTs (the frame at its content-addressed
  key, then the accepted-manifest JSON), ``IfNoneMatch='*'`` on both: on MiniStack through
  raw aiobotocore, on the fs store through `store.fs.FileSystemStore.put(...,
  if_none_match=True)`. No HTTP.
- **http-base**: `bench.http_baseline`, a minimal aiohttp server in its own process that
  receives the body and makes the same two conditional PUTs (aiobotocore; on fs,
  ``O_EXCL`` files), no validation: the fair peer for an HTTP ingest service, and what
  the targets compare against. Driven exactly like the collector.
- **collector**: a fresh ``lm-collector serve`` per scenario, driven over HTTP with the
  agent's synthetic frames through `agent.uploader.Uploader.send` (no spool; see
  bench/README.md for why).

The code: `bench.ingest_phases` (results, load, measured window), `bench.ingest_baselines`,
`bench.ingest_collector` (collector phases, RSS check, profile), `bench.ingest_report`.

Then an RSS check per store: a fresh collector under ``--rss-concurrency`` (500)
concurrent ~64 KiB uploads. Every phase is bounded by a batch count and a time cap;
every process started here is stopped by PID in ``finally`` blocks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent.load import LoadSpec, SyntheticLoad
from bench import _common as c
from bench.delay_proxy import start_delay_proxy
from bench.ingest_baselines import (
    expect_continue_cost,
    fs_baseline,
    http_baseline,
    s3_baseline,
    validation_cpu,
)
from bench.ingest_collector import collector_phase, rss_check
from bench.ingest_phases import Bench, PhaseResult, RssResult, Scenario
from bench.ingest_profile import profile_collector
from bench.ingest_report import header, render_report
from chaos.s3_server import (
    start_ministack,
    use_dummy_aws_credentials,
)
from config import LoggingSettings, configure_logging

# --- the run --------------------------------------------------------------------------------


async def run_scenario(bench: Bench, store: str, latency_ms: float, concurrency: int) -> Scenario:
    """Baseline then collector, ``--repeats`` times alternating; keeps each path's fastest
    run (noise from other processes only ever slows a run down)."""
    label = f"{store}/{latency_ms:g}ms/c{concurrency}"
    baselines, collectors, https = [], [], []
    for _ in range(bench.args.repeats):
        if store == "ministack":
            baselines.append(await s3_baseline(bench, latency_ms, concurrency))
        else:
            baselines.append(await fs_baseline(bench, concurrency))
        _progress(f"{label} baseline", baselines[-1])
        https.append(await http_baseline(bench, store, latency_ms, concurrency))
        _progress(f"{label} http-base", https[-1])
        collectors.append(await collector_phase(bench, store, latency_ms, concurrency))
        _progress(f"{label} collector", collectors[-1])
    return Scenario(
        store,
        latency_ms,
        concurrency,
        max(baselines, key=lambda phase: phase.batches_per_s),
        max(collectors, key=lambda phase: phase.batches_per_s),
        max(https, key=lambda phase: phase.batches_per_s),
        [round(phase.batches_per_s, 1) for phase in baselines],
        [round(phase.batches_per_s, 1) for phase in collectors],
        [round(phase.batches_per_s, 1) for phase in https],
    )


def _progress(label: str, phase: PhaseResult) -> None:
    print(
        f"  {label}: {phase.batches} batches, {phase.batches_per_s:.0f}/s, "
        f"p50 {phase.p50_ms:.1f} ms, failures {phase.failures}, "
        f"others {phase.others_cores:.2f} cores (before: {phase.quiet_before:.2f}), "
        f"load average {'/'.join(f'{v:.2f}' for v in phase.load_avg)}",
        file=sys.stderr,
        flush=True,
    )


def build_frames(args: argparse.Namespace) -> c.FrameSource:
    spec = LoadSpec(
        agents=8,
        batches=1,
        points_per_batch=args.points_per_batch,
        compress=args.compress,
        seed=20260101,
    )
    planned = list(SyntheticLoad(spec).originals())
    return c.FrameSource([p.frame for p in planned], [p.identity for p in planned])


def rss_limits(args: argparse.Namespace) -> list[int]:
    """One in-flight cap high enough that every upload is held at once and (not with
    --quick) the collector's default one (excess uploads get 429 and retry)."""
    held = 2 * args.rss_concurrency
    return [held] if args.quick else sorted({args.max_in_flight, held})


async def run(
    args: argparse.Namespace, frames: c.FrameSource, work_dir: Path
) -> tuple[list[Scenario], list[RssResult], list[str], str | None]:
    """Every scenario and check; stops every process it started, whatever happens."""
    bench = Bench(args, frames, work_dir, c.install_retry_tally())
    scenarios: list[Scenario] = []
    rss: list[RssResult] = []
    notes: list[str] = [validation_cpu(frames)]
    profile: str | None = None
    stores = ["ministack", "fs"] if args.store == "both" else [args.store]
    if args.only_profile:
        args.no_rss = True
    if args.only_rss:
        args.latency_ms, args.concurrency = args.latency_ms[-1:], []
    try:
        if "ministack" in stores:
            bench.ministack = start_ministack(work_dir / "ministack")
            for latency in args.latency_ms:
                if latency:
                    bench.proxies[latency] = start_delay_proxy(
                        upstream_port=bench.ministack.port, delay_ms=latency, work_dir=work_dir
                    )
            for latency in args.latency_ms:
                if latency and not args.only_rss:
                    notes.append(await expect_continue_cost(bench, latency))
                for concurrency in [] if args.only_profile else args.concurrency:
                    scenarios.append(await run_scenario(bench, "ministack", latency, concurrency))
            for in_flight in [] if args.no_rss else rss_limits(args):
                rss.append(await rss_check(bench, "ministack", max(args.latency_ms), in_flight))
            if args.profile and args.concurrency:
                profile = await profile_collector(
                    bench,
                    "ministack",
                    0.0 if 0 in args.latency_ms else args.latency_ms[0],
                    max(args.concurrency),
                    args.profile,
                )
        if "fs" in stores:
            for concurrency in [] if args.only_profile else args.concurrency:
                scenarios.append(await run_scenario(bench, "fs", 0.0, concurrency))
            if args.profile and args.concurrency and "ministack" not in stores:
                profile = await profile_collector(
                    bench, "fs", 0.0, max(args.concurrency), args.profile
                )
            for in_flight in [] if args.no_rss or (rss and args.quick) else rss_limits(args):
                rss.append(await rss_check(bench, "fs", 0.0, in_flight))
    finally:
        for proxy in bench.proxies.values():
            proxy.stop()
        if bench.ministack is not None:
            bench.ministack.stop()
    return scenarios, rss, notes, profile


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a ~1 minute smoke run")
    parser.add_argument("--store", choices=("fs", "ministack", "both"), default="both")
    parser.add_argument(
        "--latency-ms", type=float, nargs="+", help="injected store latency (MiniStack only)"
    )
    parser.add_argument("--concurrency", type=int, nargs="+")
    parser.add_argument("--workers", type=int, default=1, help="collector worker processes")
    parser.add_argument("--batches", type=int, help="measured batches per phase (cap)")
    parser.add_argument("--phase-s", type=float, help="seconds per measured phase (cap)")
    parser.add_argument("--points-per-batch", type=int, default=575, help="575: ~64 KiB frames")
    parser.add_argument("--compress", action="store_true", help="zstd frames (default: off)")
    parser.add_argument("--rss-concurrency", type=int, default=500)
    parser.add_argument("--rss-batches", type=int)
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=256,
        help="collector http.max_in_flight_requests (the RSS check raises it to 2x its load)",
    )
    parser.add_argument(
        "--profile",
        nargs="?",
        const="py-spy",
        choices=("py-spy", "cprofile"),
        help="add a profiled collector run (default py-spy; pip install py-spy)",
    )
    parser.add_argument(
        "--quiet-wait-s",
        type=float,
        help="before each window, wait up to this long for other processes to go quiet",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="run each scenario N times, keep the fastest"
    )
    parser.add_argument("--only-rss", action="store_true", help="only the RSS checks")
    parser.add_argument("--no-rss", action="store_true", help="skip the RSS checks")
    parser.add_argument(
        "--only-profile", action="store_true", help="only the profiled run (with --profile)"
    )
    parser.add_argument(
        "--hide-pandas",
        action="store_true",
        help="experiment: collectors run with pandas unimportable (pyarrow loads it lazily)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep-work-dir", action="store_true")
    args = parser.parse_args(argv)
    quick = args.quick
    args.latency_ms = args.latency_ms or ([0.0] if quick else [0.0, 20.0])
    args.concurrency = args.concurrency or ([32] if quick else [1, 32, 64])
    args.batches = args.batches or (600 if quick else 2000)
    args.phase_s = args.phase_s or (4.0 if quick else 6.0)
    args.rss_batches = args.rss_batches or (600 if quick else 1500)
    if args.quiet_wait_s is None:
        args.quiet_wait_s = 1.0 if quick else 5.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    use_dummy_aws_credentials()  # collectors inherit it; nothing reads ~/.aws
    configure_logging(LoggingSettings(level="warning", format="console"))
    import uvloop

    started = time.monotonic()
    frames = build_frames(args)
    work_dir = Path(tempfile.mkdtemp(prefix="lm-bench-"))
    try:
        scenarios, rss, notes, profile = uvloop.run(run(args, frames, work_dir))
    except BaseException:
        _clean_up(args, work_dir)
        raise
    frame_bytes = frames.frame_bytes
    print(header(args, frame_bytes))
    print(f"wall time: {time.monotonic() - started:.0f} s\n")
    print(render_report(scenarios, rss, notes))
    if profile:
        print("\n" + profile)
    if args.json:
        payload: dict[str, Any] = {
            "header": header(args, frame_bytes),
            "scenarios": [
                {
                    **asdict(s),
                    "throughput_ratio": s.throughput_ratio,
                    "p50_ratio": s.p50_ratio,
                    "server_cpu_ratio": s.server_cpu_ratio,
                }
                for s in scenarios
            ],
            "rss": [asdict(r) for r in rss],
            "notes": notes,
        }
        args.json.write_text(json.dumps(payload, indent=2))
    sys.stdout.flush()
    _clean_up(args, work_dir)  # after the report: deleting ~10^5 stored objects takes a while
    return 0


def _clean_up(args: argparse.Namespace, work_dir: Path) -> None:
    if args.keep_work_dir or args.profile:
        print(f"work directory kept: {work_dir}", file=sys.stderr)
    else:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
