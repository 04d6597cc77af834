"""``lm-rollup``: run the rollup job, and read what it wrote.

``lm-rollup [--config PATH] run [--master URL] [--progress]`` starts a local Spark session
(``[rollup] spark_master``, default ``local[*,4]``: every core, failed tasks retried; quiet logs, workers on this
interpreter, temporary directories removed afterwards), runs the job once, and prints
the run summary as JSON on stdout. ``query``, ``history``, ``verify`` and ``vacuum`` are
`rollup.cli.read`'s, ``delete`` and ``compact`` are `rollup.cli.lifecycle`'s, ``sql`` is
`rollup.cli.sql`'s, ``watch`` is `rollup.cli.watch`'s. Under ``spark-submit`` use
``rollup/job/spark_entry.py`` instead.

Exit codes of ``run``: 0 committed or up to date; 1 the run finished but some accepted
batches could not be included (bad or missing frames, recorded as problems; they stay
pending); 2 bad configuration or arguments; 3 another owner holds the lease (not an
error for cron: try later); 4 the run stopped without committing (owner lease lost,
commit retries exhausted, store unavailable, or a commit whose outcome is unknown —
the next run settles it), or did not start: the store's feature record turns on a
feature this version does not implement (PROTOCOL §3.10).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import TYPE_CHECKING

import structlog

from config import Settings, SettingsError, configure_logging
from config.cli import add_settings_flags, settings_from_flags
from index.features import FeatureRecordError, UnknownFeature, registered
from index.versions import process_id
from protocol.clock import SystemClock
from rollup.cli.lifecycle import add_lifecycle_commands
from rollup.cli.read import add_read_commands
from rollup.cli.sql import add_sql_command
from rollup.cli.watch import add_watch_command
from rollup.job.run import CommitRetriesExhausted, RunSummary, run_rollup
from rollup.table.commit import CommitConflict
from rollup.table.manifest import RollupInvariantError, RollupManifestError
from rollup.table.owner import OwnerLost
from rollup.table.storage import StoreAccess
from store.errors import StoreConfigError, StoreError
from store.lease import LeaseHeld
from store.open import open_store_from_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = structlog.get_logger(__name__)

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_LEASE_HELD = 3
EXIT_STOPPED = 4


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lm-rollup", description="Run the rollup job, and read what it wrote."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="include every pending accepted batch, then commit")
    add_run_arguments(run)
    add_read_commands(commands)
    add_lifecycle_commands(commands)
    add_sql_command(commands)
    add_watch_command(commands)
    add_settings_flags(parser)
    return parser


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", help="Spark master (default: [rollup] spark_master)")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bars on stderr (default: when stderr is a terminal)",
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_flags(args)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(settings.logging)
    quiet_spark_loggers()
    if args.command != "run":
        code: int = args.handler(args, settings)
        return code
    from rollup.job.spark_session import local_spark  # pyspark only for `run`

    master = args.master or settings.rollup.spark_master
    progress = _progress(args.progress)
    with local_spark(master=master, progress=progress) as spark:
        return run_command(spark, settings, progress=progress)


def quiet_spark_loggers() -> None:
    """py4j logs every gateway connection at INFO: keep the job's own log readable."""
    logging.getLogger("py4j").setLevel(logging.WARNING)


def run_command(spark: SparkSession, settings: Settings, *, progress: bool) -> int:
    """Run the job with ``spark``, print the summary, return the exit code (shared with
    the spark-submit entry)."""
    try:
        summary = asyncio.run(_run(spark, settings, progress))
    except (StoreConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LeaseHeld as exc:
        print(f"rollup owner lease is held, not running: {exc}", file=sys.stderr)
        return EXIT_LEASE_HELD
    except (UnknownFeature, FeatureRecordError) as exc:
        print(f"error: refusing to run: {exc}", file=sys.stderr)
        return EXIT_STOPPED
    except (OwnerLost, CommitRetriesExhausted, CommitConflict, StoreError) as exc:
        print(f"error: stopped without committing: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_STOPPED
    except (RollupManifestError, RollupInvariantError) as exc:
        print(f"error: the rollup dataset needs an operator: {exc}", file=sys.stderr)
        return EXIT_STOPPED
    except Exception as exc:  # a failed Spark job (Py4JJavaError, PythonException, ...)
        log.exception("rollup_run_failed")
        print(
            f"error: the run failed, nothing was committed: {type(exc).__name__}", file=sys.stderr
        )
        return EXIT_STOPPED
    print(json.dumps(summary.to_dict(), indent=1))
    if summary.problems:
        print(
            f"{len(summary.problems)} bad frame(s) were left out (recorded under "
            "reconciler/v1/problems/; they stay pending and `lm-rollup verify` shows them "
            "missing)",
            file=sys.stderr,
        )
        return EXIT_PROBLEMS
    return EXIT_OK


async def _run(spark: SparkSession, settings: Settings, progress: bool) -> RunSummary:
    access = StoreAccess.of(settings.store)
    access.filesystem()  # a memory:// store or a bad URL fails here, before any work
    clock = SystemClock()
    store = open_store_from_settings(settings.store, clock=clock)
    try:
        # Registered (PROTOCOL §3.10) before the owner lease is taken: a feature this
        # version does not implement stops the run here.
        async with registered(store, clock, role="rollup-job", process_id=process_id()):
            return await run_rollup(
                spark,
                store,
                access=access,
                settings=settings.rollup,
                clock=clock,
                progress=progress,
            )
    finally:
        await store.close()


def _progress(flag: bool | None) -> bool:
    return sys.stderr.isatty() if flag is None else flag


if __name__ == "__main__":
    sys.exit(main())
