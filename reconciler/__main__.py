"""``lm-reconciler``: keep the index (PROTOCOL §3.7) whole, audit, collect garbage, report.

Commands (each takes ``--config PATH``; settings also come from ``LM_*`` variables):

- ``run``: the daemon (active while it holds the lease, standby otherwise), serving
  Prometheus metrics on ``[metrics] host:port``; SIGTERM/SIGINT stop it gracefully.
- ``run --once``: one pass of everything due: the steady pass over the index log, a full
  audit when due (a first run ever, or the first on a version-1 store, includes one),
  catalog compaction, GC.
- ``audit [--inventory URL] [--engine local|spark]``: a full audit now (resumes an
  interrupted one): catalogs what the catalog lacks, writes the orphan file, records
  missing blobs. ``--engine spark`` (default ``[reconciler] audit_engine``) lists and
  joins on Spark (``reconciler.audit.engines.spark_run``; under ``spark-submit``:
  ``reconciler/audit/spark_entry.py``).
- ``gc [--dry-run]``: one GC run (``reconciler.gc.run``).
- ``drop-v1-index [--dry-run]``: delete a migrated version-1 store's per-object index
  (``reconciler.v1_index``); refused before a completed audit of the index.
- ``problems [--kind K] [--json]``: the problem records, each with what to do.
- ``retract KEY --reason TEXT [--by NAME]``: retract the catalog row of a record the store
  does not hold (a ``phantom-row`` problem; ``reconciler.retractions``): records who (the
  OS user unless ``--by``) and why, and closes the problem. Refused while the store holds
  the record.
- ``enable-bundles [--dry-run] [--json]``: turn bundles on (PROTOCOL §3.10) in the
  store's feature record, refused while a process or log writer cannot read them
  (``reconciler.features_cmd``).
- ``status [--json] [--check]``: log position and segments waiting, catalog, index
  requests per batch, lease, last audit, last GC, problems.

Long work shows progress on standard error when it is a terminal.

Exit codes:
  0  success
  1  runtime failure: store unreachable, a pass or audit left incomplete (rerun resumes),
     or ``status --check`` found lag or problems, or ``retract`` or ``enable-bundles``
     refused, or the feature record turns on a feature this version lacks
  2  bad configuration or arguments;
  3  another reconciler holds the lease (one-shot commands wait 1.5 lease TTLs first)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import random
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from prometheus_client import start_http_server
from pydantic import BaseModel

from config import Settings, SettingsError, configure_logging
from config.cli import add_settings_flags, settings_from_flags
from index.features import BundleGate, FeatureRecordError, UnknownFeature
from protocol.clock import SystemClock
from protocol.records import RecordError
from reconciler.audit.inventory import InventoryError, InventorySource, inventory_from_settings
from reconciler.audit.progress import ProgressBar
from reconciler.context import default_owner_id
from reconciler.daemon import PassReport, Reconciler, Stopped
from reconciler.features_cmd import (
    add_enable_bundles_parser,
    enable_bundles_command,
    reconciler_registered,
)
from reconciler.gc import GcRefused
from reconciler.metrics import with_store_latency
from reconciler.problems import ADVICE, list_problems
from reconciler.retractions import RetractRefused, operator_name, retract
from reconciler.status import gather_status
from reconciler.v1_index import V1DropRefused
from store.base import ObjectStore
from store.errors import StoreError
from store.lease import LeaseHeld
from store.open import open_store_from_settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_LEASE_HELD = 0, 1, 2, 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lm-reconciler",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="the reconciler daemon (one active per store)")
    run.add_argument("--once", action="store_true", help="one pass of everything due, then exit")
    audit = commands.add_parser("audit", help="a full audit of accepted/ and quarantine/ now")
    audit.add_argument(
        "--inventory", help="read an S3 Inventory report (s3://BUCKET/PATH or file://DIR)"
    )
    audit.add_argument("--engine", choices=["local", "spark"], help="default: audit_engine")
    gc = commands.add_parser("gc", help="one garbage-collection run")
    gc.add_argument("--dry-run", action="store_true", help="decide, log, delete nothing")
    drop = commands.add_parser(
        "drop-v1-index",
        help="delete a migrated version-1 store's per-object index (after a completed audit)",
    )
    drop.add_argument("--dry-run", action="store_true", help="count what would go, delete nothing")
    problems = commands.add_parser("problems", help="list problem records")
    problems.add_argument("--kind", help="only this kind (missing-blob, corrupt-blob, ...)")
    problems.add_argument("--json", action="store_true", help="one JSON object per line")
    retract = commands.add_parser(
        "retract", help="retract a phantom catalog row (a record the store does not hold)"
    )
    retract.add_argument("key", help="the record's key (accepted/v1/... or quarantine/v1/...)")
    retract.add_argument("--reason", required=True, help="why (recorded with the retraction)")
    retract.add_argument("--by", help="who retracts (default: the OS user)")
    add_enable_bundles_parser(commands)
    status = commands.add_parser("status", help="checkpoint, lag, audits, GC, problems")
    status.add_argument("--json", action="store_true")
    status.add_argument(
        "--check", action="store_true", help="exit 1 unless lag and problems are both zero"
    )
    add_settings_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_flags(args)
    except SettingsError as exc:
        print(f"lm-reconciler: configuration error:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.command in ("run", "gc") and (problem := settings.gc_lease_problem()):
        print(f"lm-reconciler: configuration error:\n{problem}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(settings.logging)
    import uvloop

    try:
        code: int = uvloop.run(_dispatch(args, settings))
    except KeyboardInterrupt:
        return EXIT_FAILED
    return code


async def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    store = open_store_from_settings(settings.store)
    try:
        if args.command == "status":
            return await _status(store, args, settings)
        if args.command == "problems":
            return await _problems(store, args)
        if args.command == "retract":
            return await _retract(store, args)
        if args.command == "enable-bundles":
            return await enable_bundles_command(store, settings, args)
        owner = default_owner_id()
        daemon = args.command == "run" and not args.once
        async with reconciler_registered(store, owner, daemon=daemon) as gate:  # before a lease
            code = await _leased_command(store, settings, args, gate, owner)
        return EXIT_FAILED if gate.unknown_feature else code
    except (UnknownFeature, FeatureRecordError) as exc:
        print(f"lm-reconciler: refusing to start: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except StoreError as exc:
        print(f"lm-reconciler: object store unavailable: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except RecordError as exc:
        print(f"lm-reconciler: unreadable reconciler record: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        await store.close()


# --- commands that take the lease ----------------------------------------------------------


async def _leased_command(
    store: ObjectStore, settings: Settings, args: argparse.Namespace, gate: BundleGate, owner: str
) -> int:
    try:
        inventory = inventory_from_settings(settings, getattr(args, "inventory", None))
    except InventoryError as exc:
        print(f"lm-reconciler: {exc}", file=sys.stderr)
        return EXIT_USAGE
    _load_arrow_lazy_imports()
    progress = ProgressBar()
    timed, metrics = with_store_latency(store, SystemClock())  # lm_store_request_seconds
    reconciler = Reconciler(
        store=timed,
        settings=settings,
        clock=SystemClock(),
        rng=random.Random(),
        metrics=metrics,
        owner=owner,
        inventory=inventory,
        audit_progress=progress.update,
        # The daemon audits in a child process: a core and a GIL beside the steady pass.
        audit_in_child=args.command == "run" and not args.once,
    )
    grace_s = min(10.0, settings.reconciler.lease_ttl_s / 2)
    stop_soon = _on_signals(lambda: reconciler.stop(grace_s))
    gate.on_unknown_feature = lambda _exc: stop_soon()  # and exit 1 (`_dispatch`)
    try:
        if args.command == "run" and not args.once:
            return await _daemon(reconciler, settings)
        if args.command == "run":
            return _print_pass(await reconciler.run_once())
        engine = getattr(args, "engine", None) or settings.reconciler.audit_engine
        if args.command == "audit" and engine == "spark":
            return await _spark_audit(reconciler, progress, inventory)
        if args.command == "audit":
            record = await reconciler.audit_once()
            progress.close()
            print(_json(record.model_dump(mode="json", by_alias=True)))
            return EXIT_OK if record.status == "completed" else EXIT_FAILED
        if args.command == "drop-v1-index":
            dropped = await reconciler.drop_v1_index_once(dry_run=args.dry_run)
            print(_json({**_plain(dropped), "total": dropped.total}))
            return EXIT_OK
        result = await reconciler.gc_once(dry_run=args.dry_run or settings.gc.dry_run)
        print(_json(_plain(result)))
        return EXIT_OK
    except LeaseHeld as held:
        print(f"lm-reconciler: another reconciler is active: {held}", file=sys.stderr)
        return EXIT_LEASE_HELD
    except GcRefused as exc:
        print(f"lm-reconciler: GC refused to delete: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except V1DropRefused as exc:
        print(f"lm-reconciler: drop-v1-index refused: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except InventoryError as exc:
        print(f"lm-reconciler: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Stopped:
        return EXIT_FAILED
    finally:
        progress.close()
        if inventory is not None:
            await inventory.close()


async def _spark_audit(
    reconciler: Reconciler, progress: ProgressBar, inventory: InventorySource | None
) -> int:
    """The audit with its listing and joins on Spark, as the lease holder (module doc);
    prints its record as ``audit`` does."""
    from reconciler.audit.engines.spark_run import audit_spark_session, spark_audit

    spark = audit_spark_session()
    try:
        work = functools.partial(
            spark_audit, spark=spark, progress=progress.update, inventory=inventory
        )
        record = await reconciler.one_shot(work, None)
    finally:
        spark.stop()
    progress.close()
    print(_json(record.model_dump(mode="json", by_alias=True)))
    return EXIT_OK if record.status == "completed" else EXIT_FAILED


def _load_arrow_lazy_imports() -> None:
    """pyarrow imports pandas on the first array it builds from Python values: seconds on a
    busy host. Pay that before the lease is taken, not inside a term's first catalog write,
    where it would stall fence renewals and could outlast a short lease TTL."""
    import pyarrow as pa

    pa.array([0])


async def _daemon(reconciler: Reconciler, settings: Settings) -> int:
    server = None
    if settings.metrics.enabled:
        try:
            server, _thread = start_http_server(
                settings.metrics.port,
                addr=settings.metrics.host,
                registry=reconciler.metrics.registry,
            )
        except OSError as exc:
            where = f"{settings.metrics.host}:{settings.metrics.port}"
            print(f"lm-reconciler: cannot serve metrics on {where}: {exc}", file=sys.stderr)
            return EXIT_FAILED
    try:
        await reconciler.run()
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    return EXIT_OK


def _print_pass(report: PassReport) -> int:
    doc: dict[str, Any] = {"epoch": report.epoch, "complete": report.complete}
    if report.steady is not None:
        steady = report.steady
        doc["steady"] = {
            "complete": steady.complete,
            "segments": steady.segments_read,
            "records_read": steady.records_read,
            "rows_cataloged": steady.rows_cataloged,
            "catalog_files": steady.catalog_files,
            "missing": steady.missing,
            "problems": steady.problems,
            "failed": steady.failed,
        }
    if report.audit is not None:
        doc["audit"] = report.audit.model_dump(mode="json", by_alias=True)
    if report.compaction is not None:
        doc["compaction"] = _plain(report.compaction)
    if report.gc is not None:
        doc["gc"] = _plain(report.gc)
    print(_json(doc))
    return EXIT_OK if report.complete else EXIT_FAILED


def _on_signals(stop: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    def handler() -> None:
        task = loop.create_task(stop())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, handler)
    return handler


# --- read-only commands ------------------------------------------------------------------


async def _status(store: ObjectStore, args: argparse.Namespace, settings: Settings) -> int:
    status = await gather_status(store, SystemClock(), lookback_s=settings.reconciler.lookback_s)
    print(_json(status.to_json()) if args.json else status.render())
    return EXIT_FAILED if args.check and not status.healthy else EXIT_OK


async def _problems(store: ObjectStore, args: argparse.Namespace) -> int:
    count = 0
    async for key, record in list_problems(store, args.kind):
        count += 1
        if record is None:
            line = {"key": key, "error": "unreadable problem record"}
        else:
            line = {
                "key": key,
                **record.model_dump(mode="json", exclude={"schema_"}),
                "what_to_do": ADVICE.get(record.kind, "see the detail"),
            }
        if args.json:
            print(_json(line))
        else:
            print(
                f"{line.get('kind', '?'):24} {line.get('subject_key', key)}\n"
                f"    {line.get('detail', line.get('error'))}"
                + (f"\n    what to do: {line['what_to_do']}" if "what_to_do" in line else "")
            )
    if not args.json:
        print(f"{count} problem(s)", file=sys.stderr)
    return EXIT_OK


async def _retract(store: ObjectStore, args: argparse.Namespace) -> int:
    try:
        record, created = await retract(
            store, SystemClock(), args.key, reason=args.reason, by=args.by or operator_name()
        )
    except RetractRefused as exc:
        print(f"lm-reconciler: retract refused: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as exc:
        print(f"lm-reconciler: {exc}", file=sys.stderr)
        return EXIT_USAGE
    doc = {**record.model_dump(mode="json", exclude={"schema_"}), "created": created}
    print(_json(doc))
    return EXIT_OK


def _plain(value: Any) -> Any:
    """JSON-ready form of a result: records, dataclasses of them, lists, scalars."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def _json(doc: Any) -> str:
    return json.dumps(doc, sort_keys=False, default=str)


if __name__ == "__main__":
    sys.exit(main())
