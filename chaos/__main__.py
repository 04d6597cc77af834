"""``lm-chaos``: chaos runs against real processes, and the in-process simulation.

- ``lm-chaos run --scenario NAME --seed S (--duration SECONDS | --minutes M) [--bundles]``:
  start MiniStack, the fault proxy, collectors, the reconciler (and rollup runs), drive
  the scenario, converge, audit every invariant; print the summary table, write the JSON
  report (``--json PATH``, default ``<work-dir>/report.json``). ``--bundles``: ``lm-reconciler
  enable-bundles`` on the fresh bucket before the first collector starts, so the
  collectors write group-commit bundles (PROTOCOL §3.10). Scenarios: ``race``,
  ``faults``, ``kill``, ``outage``, ``clock-skew``, ``gc-race``, ``rollup-race``, ``all``.
- ``lm-chaos simulate --seed S [--count N] [--bundles]``: the deterministic in-process
  simulation of acceptance, the index, the reconciler and its GC (`chaos.sim.simulation`) for
  seeds S..S+N-1 (``--bundles``: with group commit, PROTOCOL §3.10); prints the worlds
  with violations and the GC coverage of true orphans.
- ``lm-chaos longrun [--ci] [--seed S] [--hours H]``: the long simulated run of issue 31
  (`chaos.longrun.run`): one world for two simulated days (``--ci``: the test's version,
  a day and three hours); prints its figures and whether every claim held.
- ``lm-chaos list``: the scenarios.

Everything listens on 127.0.0.1 and uses dummy credentials. Exit codes: 0 every
invariant held; 1 a violation (or the run could not finish); 2 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from chaos.s3_server import use_dummy_aws_credentials
from chaos.scenarios import SCENARIOS
from config import LoggingSettings, SettingsError, configure_logging
from config.cli import add_settings_flags, settings_flags_given, settings_from_flags

T = TypeVar("T")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lm-chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a scenario against real processes")
    run.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    run.add_argument("--seed", type=int, default=1)
    length = run.add_mutually_exclusive_group(required=True)
    length.add_argument("--duration", type=float, help="seconds of chaos (before convergence)")
    length.add_argument("--minutes", type=float, help="minutes of chaos (before convergence)")
    run.add_argument("--json", type=Path, help="write the JSON report here")
    run.add_argument("--work-dir", type=Path, help="keep everything here (default: a temp dir)")
    run.add_argument("--keep", action="store_true", help="keep the temp work dir")
    run.add_argument(
        "--rollup", choices=("auto", "off"), default="auto", help="run rollups when available"
    )
    run.add_argument(
        "--round-minutes", type=float, default=5.0, help="audit every this many minutes"
    )
    run.add_argument(
        "--bundles", action="store_true", help="enable-bundles before the collectors start"
    )
    simulate = commands.add_parser("simulate", help="the deterministic in-process simulation")
    simulate.add_argument("--seed", type=int, default=0)
    simulate.add_argument("--count", type=int, default=100)
    simulate.add_argument(
        "--late-rate", type=float, default=None, help="share of writes that land late"
    )
    simulate.add_argument(
        "--connect-timeout", type=float, default=None, help="how late they may land (s)"
    )
    simulate.add_argument(
        "--bundles",
        action="store_true",
        help="group commit on: busy collectors, races, orphan bundles written again",
    )
    longrun = commands.add_parser("longrun", help="the long simulated run (two simulated days)")
    longrun.add_argument("--ci", action="store_true", help="the CI version (under a minute)")
    longrun.add_argument("--seed", type=int, default=None, help="default: the version's (31)")
    longrun.add_argument("--hours", type=float, default=None, help="simulated hours to run")
    commands.add_parser("list", help="list the scenarios")
    add_settings_flags(
        parser,
        config_help=(
            "settings file (lm-chaos uses [logging]; default: console, errors; simulate: critical)"
        ),
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _configure_logging(args)
    except SettingsError as exc:
        print(f"lm-chaos: configuration error:\n{exc}", file=sys.stderr)
        return 2
    if args.command == "list":
        for scenario in SCENARIOS.values():
            print(f"{scenario.name:12} {scenario.description}")
        return 0
    if args.command == "simulate":
        return _simulate(
            args.seed, args.count, args.late_rate, args.connect_timeout, bundles=args.bundles
        )
    if args.command == "longrun":
        return _longrun(args.ci, args.seed, args.hours)
    duration = args.duration if args.duration is not None else args.minutes * 60.0
    if duration <= 0 or args.round_minutes <= 0:
        print("lm-chaos: the duration and round length must be positive", file=sys.stderr)
        return 2
    return _run(args, duration)


def _configure_logging(args: argparse.Namespace) -> None:
    """Console, errors only (the run's own progress lines are the output), unless the
    settings flags say otherwise. ``simulate``: critical only, since its worlds' processes
    log every fault the simulation injects as an error (thousands of expected lines a
    run); the violations and the progress are the output."""
    if settings_flags_given(args):
        configure_logging(settings_from_flags(args).logging)
    else:
        level = "critical" if args.command == "simulate" else "error"
        configure_logging(LoggingSettings(format="console", level=level))


def _run(args: argparse.Namespace, duration: float) -> int:
    from chaos.runner import ChaosOptions, run_scenario

    use_dummy_aws_credentials()  # dummy credentials only: never a real account or profile
    temporary = args.work_dir is None
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix=f"lm-chaos-{args.scenario}-"))
    options = ChaosOptions(
        scenario=args.scenario,
        seed=args.seed,
        duration_s=duration,
        work_dir=work_dir,
        rollup=args.rollup,
        round_s=args.round_minutes * 60.0,
        bundles=args.bundles,
        progress=lambda line: print(line, flush=True),
    )
    try:
        report = asyncio.run(_until_signalled(run_scenario(options)))
    except asyncio.CancelledError:
        print("lm-chaos: interrupted; every process it started was stopped", file=sys.stderr)
        return 130
    json_path = args.json or work_dir / "report.json"
    if temporary and not args.keep and report.ok and args.json is not None:
        shutil.rmtree(work_dir, ignore_errors=True)
    report.write_json(json_path)
    print(report.render())
    print(f"report: {json_path}")
    if not report.ok and temporary:
        print(f"work dir kept for inspection: {work_dir}")
    return report.exit_code


async def _until_signalled(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work``; SIGTERM/SIGINT cancel it, so its clean-up stops every child by PID."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    return await task


SIMULATE_PROGRESS_EVERY = 25


def _simulate(
    seed: int, count: int, late_rate: float | None, connect_s: float | None, *, bundles: bool
) -> int:
    import dataclasses

    from chaos.sim.simulation import SimConfig, simulate

    base = SimConfig(seed=seed)
    if bundles:  # the shape of tests/chaos/test_simulation_bundles.py's worlds
        base = dataclasses.replace(
            base,
            bundles=True,
            bundle_max_in_flight=1,
            collectors=2,
            agents=4,
            send_window_s=1.0,
            race_rate=0.3,
            bundle_landings=2,
        )
    if late_rate is not None:
        base = dataclasses.replace(base, late_rate=late_rate)
    if connect_s is not None:
        base = dataclasses.replace(base, connect_timeout_s=connect_s)
    failed = orphans = deleted = 0
    started = time.monotonic()
    for offset in range(count):
        report = simulate(dataclasses.replace(base, seed=seed + offset))
        orphans += report.stats["orphans_true"]
        deleted += report.stats["orphans_true_deleted"]
        if not report.ok:
            failed += 1
            print(json.dumps({"seed": seed + offset, "violations": report.violations}))
        if (offset + 1) % SIMULATE_PROGRESS_EVERY == 0 and offset + 1 < count:
            print(
                f"{offset + 1} of {count} worlds, {failed} with violations, "
                f"{time.monotonic() - started:.0f}s",
                file=sys.stderr,
            )
    print(f"{count} simulated worlds, {failed} with violations", file=sys.stderr)
    if orphans:
        print(
            f"GC coverage: {deleted} of {orphans} true orphans deleted "
            f"({100 * deleted / orphans:.1f}%)",
            file=sys.stderr,
        )
    return 1 if failed else 0


def _longrun(ci: bool, seed: int | None, hours: float | None) -> int:
    import dataclasses

    from chaos.longrun.run import CI, FULL, run_longrun

    config = CI if ci else FULL
    if seed is not None:
        config = dataclasses.replace(config, seed=seed)
    if hours is not None:
        config = dataclasses.replace(config, duration_s=hours * 3600.0)
    report = run_longrun(config)
    print(report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
