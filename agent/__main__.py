"""``lm-agent send``: deliver points from a file, or a synthetic fleet, to collectors;
``lm-agent scrape``: scrape Prometheus text endpoints for as long as it runs (`agent.scrape`).

    lm-agent send --url http://127.0.0.1:8080 --token-file tok --spool-dir ./spool \\
        --agents 4 --batches 100 --points-per-batch 500 --duplicate-rate 0.05 \\
        --conflict-rate 0.01 --seed 7
    lm-agent send --url http://a:8080,http://b:8080 --token T --file points.jsonl \\
        --agent-id web-1 --points-per-batch 1000

Prints a summary table (``--json``: one JSON object) on standard output; logs go to
standard error. Exit codes: 0 all delivered as expected; 1 something was parked or
answered unexpectedly; 3 frames left undelivered (still pending in the spool: re-run);
2 usage or input errors (bad flags or settings, unreadable points file, spool in use).
See `agent.summary`. ``--config`` reads the shared settings file (and ``LM_*``
variables); ``send`` uses its ``[logging]`` section.

    lm-agent scrape --config agent.toml            # [scrape] and [logging]
    lm-agent scrape --target http://127.0.0.1:9100/metrics --url http://c:8080 \
        --token-file tok --agent-id node-1 --spool-dir /var/lib/lm-agent --interval 15

``scrape`` flags override the ``[scrape]`` settings (``--target`` and ``--url`` replace
the configured lists). It runs until SIGTERM/SIGINT, then spools what it scraped and
delivers for up to ``scrape.shutdown_grace_s``; exit 0, or 2 for bad settings or a spool
in use by another process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import uvloop
from tqdm import tqdm  # type: ignore[import-untyped]  # no stubs installed

from agent.fleet import FleetResult, RunOptions, SpoolSettings, run_fleet, send_points
from agent.load import LoadSpec
from agent.points_file import PointsFileError, batches_of, read_points
from agent.scrape import ScrapeAgent
from agent.spool import SpoolError
from agent.summary import DeliveryRecord
from agent.truth import BatchKind
from agent.uploader import UploadPolicy
from config import ScrapeSettings, configure_logging
from config.cli import add_settings_flags, settings_from_flags
from store.retry import Backoff

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lm-agent", description="Lightmetrics reference agent")
    commands = parser.add_subparsers(dest="command", required=True)
    send = commands.add_parser("send", help="send points (from a file, or synthetic)")
    send.add_argument(
        "--url",
        action="append",
        help="collector base URL; repeat or comma-separate to spread round-robin "
        "(default http://127.0.0.1:8080)",
    )
    token = send.add_mutually_exclusive_group()
    token.add_argument("--token", help="bearer token")
    token.add_argument("--token-file", type=Path, help="file holding the bearer token")
    send.add_argument("--spool-dir", type=Path, default=Path("lm-agent-spool"))
    send.add_argument("--file", type=Path, help="points file (.jsonl/.ndjson/.json or .csv)")
    send.add_argument("--format", choices=["jsonl", "csv"], help="override the file format")
    send.add_argument("--agent-id", default="lm-agent", help="agent_id for --file")
    send.add_argument("--points-per-batch", type=int, default=100)
    send.add_argument("--agents", type=int, default=1)
    send.add_argument("--batches", type=int, default=10)
    send.add_argument("--duplicate-rate", type=float, default=0.0)
    send.add_argument("--conflict-rate", type=float, default=0.0)
    send.add_argument("--seed", type=int, help="synthetic seed (default: random, reported)")
    send.add_argument(
        "--start-ns", type=int, help="timestamp of the first synthetic point (default: now)"
    )
    send.add_argument("--concurrency", type=int, default=8)
    send.add_argument("--request-timeout", type=float, default=30.0, help="seconds")
    send.add_argument("--attempts", type=int, default=6, help="tries per batch per round")
    send.add_argument("--max-retry-after", type=float, default=10.0, help="cap, seconds")
    send.add_argument("--max-rounds", type=int, default=3)
    send.add_argument("--round-delay", type=float, default=1.0, help="seconds")
    send.add_argument("--max-pending-frames", type=int, default=10_000)
    send.add_argument("--max-pending-mb", type=int, default=1024)
    send.add_argument("--no-fsync", action="store_true", help="benchmarks only: unsafe")
    send.add_argument("--progress", action="store_true", help="progress bar even without a TTY")
    send.add_argument("--json", action="store_true", help="print the summary as JSON")
    send.add_argument("--truth-out", type=Path, help="write the ground truth JSON here")
    _add_scrape_parser(commands)
    add_settings_flags(parser, config_help="settings file (the agent uses [logging], [scrape])")
    return parser


def _add_scrape_parser(commands: Any) -> None:
    scrape = commands.add_parser(
        "scrape",
        help="scrape Prometheus text endpoints and deliver the samples (runs until stopped)",
    )
    scrape.add_argument(
        "--target", action="append", help="endpoint to scrape; repeat (replaces scrape.targets)"
    )
    scrape.add_argument(
        "--url", action="append", help="collector base URL; repeat (replaces scrape.collector_urls)"
    )
    scrape.add_argument("--token-file", type=Path, help="file holding the bearer token")
    scrape.add_argument("--agent-id", help="agent_id of every frame (default: the host name)")
    scrape.add_argument("--spool-dir", type=Path, help="durable spool directory")
    scrape.add_argument("--interval", type=float, help="seconds between scrapes")
    scrape.add_argument("--flush-interval", type=float, help="seconds between frames at most")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "scrape":
        return _scrape(args)
    try:
        configure_logging(settings_from_flags(args).logging)
        urls = _urls(args.url)
        token = _token(args)
        return _send(args, urls, token)
    except KeyboardInterrupt:
        # Nothing is lost: unsent frames are in the spool and go first on the next run.
        print(
            f"lm-agent: interrupted; undelivered frames stay in {args.spool_dir}", file=sys.stderr
        )
        return EXIT_INTERRUPTED
    except (PointsFileError, SpoolError, ValueError, OSError) as exc:
        print(f"lm-agent: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _send(args: argparse.Namespace, urls: list[str], token: str | None) -> int:
    options = RunOptions(
        policy=UploadPolicy(
            concurrency=args.concurrency,
            request_timeout_s=args.request_timeout,
            backoff=Backoff(attempts=args.attempts, base_s=0.1, cap_s=5.0),
            max_retry_after_s=args.max_retry_after,
        ),
        max_rounds=args.max_rounds,
        round_delay_s=args.round_delay,
    )
    spool = SpoolSettings(
        directory=args.spool_dir,
        max_pending_frames=args.max_pending_frames,
        max_pending_bytes=args.max_pending_mb * 1024 * 1024,
        fsync=not args.no_fsync,
    )
    show_progress = args.progress or sys.stderr.isatty()
    report: dict[str, Any] = {"urls": urls}
    if args.file is not None:
        # Parse the whole file first, so a bad line is reported before anything is sent.
        points = list(read_points(args.file, file_format=args.format))
        tables = list(batches_of(points, args.points_per_batch))
        report.update(mode="file", file=str(args.file), agent_id=args.agent_id)
        with _progress(len(tables), show_progress) as bar:
            result = _run(
                send_points(
                    urls=urls,
                    token=token,
                    spool=spool,
                    agent_id=args.agent_id,
                    tables=tables,
                    options=options,
                    on_record=lambda record: _tick(bar, record),
                )
            )
    else:
        seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
        spec = LoadSpec(
            agents=args.agents,
            batches=args.batches,
            points_per_batch=args.points_per_batch,
            duplicate_rate=args.duplicate_rate,
            conflict_rate=args.conflict_rate,
            seed=seed,
            start_ns=args.start_ns if args.start_ns is not None else _now_second_ns(),
        )
        report.update(mode="synthetic", seed=seed, start_ns=spec.start_ns)
        with _progress(spec.total_batches, show_progress) as bar:
            result = _run(
                run_fleet(
                    urls=urls,
                    token=token,
                    spool=spool,
                    spec=spec,
                    options=options,
                    on_record=lambda record: _tick(bar, record),
                )
            )
    if args.truth_out is not None:
        args.truth_out.write_text(json.dumps(result.truth.to_dict(), indent=1) + "\n")
    _print_summary(result, report, as_json=args.json)
    return result.summary.exit_code


def _scrape(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_flags(args)
        configure_logging(settings.logging)
        scrape = _scrape_settings(settings.scrape, args)
        token = _token_from(scrape.token_file)
        if not scrape.targets:
            raise ValueError("nothing to scrape: give --target or [scrape] targets")
        uvloop.run(_run_scrape(scrape, token))
    except (SpoolError, ValueError, OSError) as exc:
        print(f"lm-agent scrape: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _scrape_settings(configured: ScrapeSettings, args: argparse.Namespace) -> ScrapeSettings:
    """``[scrape]`` with the given flags applied, validated again as a whole."""
    overrides: dict[str, Any] = {
        "collector_urls": _urls(args.url) if args.url else None,
        "token_file": args.token_file,
        "agent_id": args.agent_id,
        "spool_dir": args.spool_dir,
        "interval_s": args.interval,
        "flush_interval_s": args.flush_interval,
    }
    if args.target:
        overrides["targets"] = [{"url": url} for url in args.target]
    given = {key: value for key, value in overrides.items() if value is not None}
    if args.interval is not None and configured.timeout_s > args.interval:
        given.setdefault("timeout_s", args.interval)
    return ScrapeSettings.model_validate({**configured.model_dump(), **given})


async def _run_scrape(settings: ScrapeSettings, token: str | None) -> None:
    agent = ScrapeAgent(settings=settings, token=token)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, agent.stop)
    await agent.run()


def _token_from(path: Path | None) -> str | None:
    if path is None:
        return None
    token = path.read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def _run(coro: Coroutine[Any, Any, FleetResult]) -> FleetResult:
    return uvloop.run(coro)


def _progress(total: int, show: bool) -> Any:
    return tqdm(total=total, unit="batch", file=sys.stderr, disable=not show, leave=False)


def _tick(bar: Any, record: DeliveryRecord) -> None:
    if record.kind in (BatchKind.ORIGINAL, BatchKind.RECOVERED):
        bar.update(1)


def _print_summary(result: FleetResult, report: dict[str, Any], *, as_json: bool) -> None:
    summary = result.summary
    if as_json:
        print(json.dumps({**report, **summary.to_dict()}, indent=2))
        return
    details = ", ".join(f"{k}={v}" for k, v in report.items() if k != "urls")
    print(f"lm-agent send: {details} -> {', '.join(report['urls'])}")
    print(summary.render_table())


def _urls(given: list[str] | None) -> list[str]:
    urls = [u.strip() for item in (given or ["http://127.0.0.1:8080"]) for u in item.split(",")]
    urls = [u for u in urls if u]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--url must be http:// or https://, got {url!r}")
    return urls


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        return _token_from(args.token_file)
    return str(args.token) if args.token else None


def _now_second_ns() -> int:
    return time.time_ns() // 1_000_000_000 * 1_000_000_000


if __name__ == "__main__":
    sys.exit(main())
