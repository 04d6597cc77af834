"""The read-side ``lm-rollup`` subcommands: ``query``, ``history``, ``verify``, ``vacuum``.

`add_read_commands(subparsers)` adds them to the CLI's argparse subparsers; each sets
``handler`` (also in `READ_HANDLERS`), called as ``handler(args, settings) -> exit code``.
Results go to stdout (``--format table|csv|json``; ``json`` is one JSON array), problems
to stderr. ``query`` (and ``sql``, `rollup.cli.sql`) read the latest snapshot, or
``--version N``, or ``--as-of TIME``: the newest version committed at or before TIME
(`rollup.read.travel`). ``query`` pins its snapshot with a reader lease past ``[rollup]
reader_lease_min_files`` files (``--lease``/``--no-lease`` decide instead) and says on
stderr when a vanished file made it retry (`rollup.read.read_guard`); ``vacuum`` prints
what each reader lease kept and the expired leases it deleted.

Exit codes: 0 done (verify: every hour complete); 1 verify found a mismatch; 2 the
command could not run (bad arguments, unknown version, damaged dataset, store errors, or
vacuum found the owner lease held).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

from config.settings import Settings
from index.features import FeatureRecordError, UnknownFeature, registered
from index.versions import process_id
from protocol.clock import SystemClock
from protocol.keys import KeyFormatError, UtcHour
from rollup.lifecycle.vacuum import VacuumAborted, VacuumReport, vacuum
from rollup.read import history as history_mod
from rollup.read import reader
from rollup.read import verify as verify_mod
from rollup.read.read_guard import ReadGuard, SnapshotFilesGone
from rollup.read.render import FORMATS, render
from rollup.table import schemas
from rollup.table.commit import VersionNotFound
from rollup.table.manifest import RollupManifestError, format_created_at
from store.base import ObjectStore
from store.errors import StoreError
from store.lease import LeaseHeld
from store.open import open_store_from_settings

Handler = Callable[[argparse.Namespace, Settings], int]


def run_with_store(settings: Settings, work: Callable[[ObjectStore], Awaitable[int]]) -> int:
    async def main() -> int:
        store = open_store_from_settings(settings.store, clock=SystemClock())
        try:
            return await work(store)
        finally:
            await store.close()

    try:
        return asyncio.run(main())
    except LeaseHeld as exc:
        print(f"error: the rollup job holds the owner lease ({exc}); try later", file=sys.stderr)
    except (
        ValueError,
        KeyError,
        VersionNotFound,
        VacuumAborted,
        OSError,
        SnapshotFilesGone,
        UnknownFeature,
        FeatureRecordError,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
    except (StoreError, RollupManifestError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 2


def time_argument(text: str) -> datetime:
    try:
        return schemas.parse_timestamp(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def hour_argument(text: str) -> UtcHour:
    try:
        return UtcHour.parse_iso(text)
    except KeyFormatError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_query(args: argparse.Namespace, settings: Settings) -> int:
    """``query TABLE``: rows of a table as of the latest (or ``--version``) snapshot."""
    from rollup.table.storage import StoreAccess  # pyarrow's S3 client only when querying

    async def work(store: ObjectStore) -> int:
        schema = schemas.table_schema(args.table)
        where = [reader.parse_predicate(text, schema) for text in args.where]
        columns = args.columns.split(",") if args.columns else list(schema.names)
        filesystem, root = StoreAccess.of(settings.store).filesystem()
        table = await reader.scan(
            store,
            args.table,
            filesystem=filesystem,
            root=root,
            version=args.version,
            as_of=args.as_of,
            columns=columns,
            where=where,
            start=getattr(args, "from"),
            end=args.to,
            guard=read_guard(settings, args.lease, purpose=f"lm-rollup query {args.table}"),
        )
        if args.limit is not None:
            table = table.slice(0, args.limit)
        render(table.to_pylist(), columns, args.format, sys.stdout)
        return 0

    return run_with_store(settings, work)


def read_guard(settings: Settings, lease: bool | None, *, purpose: str) -> ReadGuard:
    """How a CLI read pins its snapshot: ``--lease`` always, ``--no-lease`` never, else
    past ``[rollup] reader_lease_min_files`` files; retries are announced on stderr."""
    mode: Literal["auto", "always", "never"] = (
        "auto" if lease is None else "always" if lease else "never"
    )
    return ReadGuard(
        mode=mode,
        min_files=settings.rollup.reader_lease_min_files,
        ttl_s=settings.rollup.reader_lease_ttl_s,
        max_hold_s=settings.rollup.reader_lease_max_hold_s,
        purpose=purpose,
        notify=lambda message: print(f"warning: {message}", file=sys.stderr, flush=True),
    )


def run_history(args: argparse.Namespace, settings: Settings) -> int:
    """``history``: versions, times, owner epochs and what each commit added."""

    async def work(store: ObjectStore) -> int:
        entries = await history_mod.history(store, limit=args.limit)
        rows = [entry.as_row() for entry in entries]
        columns = list(rows[0]) if rows else ["version", "created_at", "owner_epoch"]
        render(rows, columns, args.format, sys.stdout)
        return 0

    return run_with_store(settings, work)


def run_verify(args: argparse.Namespace, settings: Settings) -> int:
    """``verify``: per hour, complete or missing N / extra N; exit 1 on any mismatch."""

    async def work(store: ObjectStore) -> int:
        # verify parses every accepted manifest: it registers (PROTOCOL §3.10).
        async with registered(store, SystemClock(), role="rollup-verify", process_id=process_id()):
            report = await verify_mod.verify(
                store,
                version=args.version,
                first_hour=getattr(args, "from"),
                last_hour=args.to,
                from_manifests=args.from_manifests,
            )
        rows = [
            {
                "hour": h.hour,
                "status": "complete" if h.complete else "mismatch",
                "result": h.describe(),
                "accepted_batches": h.accepted.batches,
                "ledger_batches": h.ledger.batches,
                "missing": h.missing or 0,
                "extra": h.extra or 0,
            }
            for h in report.hours
        ]
        columns = ["hour", "result"] if args.format == "table" else list(rows[0] if rows else {})
        render(rows, columns or ["hour", "result"], args.format, sys.stdout)
        if report.unparseable_keys:
            print(f"{report.unparseable_keys} unreadable accepted manifests", file=sys.stderr)
        for lost in report.lost:
            print(f"lost {lost.accepted_hour} {lost.describe()}", file=sys.stderr)
        for waiting in report.waiting:
            print(f"waiting {waiting.describe()}", file=sys.stderr)
        if report.waiting_total > len(report.waiting):
            more = report.waiting_total - len(report.waiting)
            print(f"... and {more} more batches waiting", file=sys.stderr)
        summary = "complete" if report.ok else "MISMATCH"
        print(f"version {report.version}: {len(report.hours)} hours, {summary}", file=sys.stderr)
        return 0 if report.ok else 1

    return run_with_store(settings, work)


def run_vacuum(args: argparse.Namespace, settings: Settings) -> int:
    """``vacuum``: delete what no retained snapshot reaches (``--dry-run``: list it)."""
    retain_s = args.retain_seconds
    if retain_s is None and args.retain_versions is None:
        retain_s = settings.rollup.retention_s
    min_age_s = args.min_age_seconds
    if min_age_s is None:
        min_age_s = settings.rollup.vacuum_min_age_s

    async def work(store: ObjectStore) -> int:
        report = await vacuum(
            store,
            clock=SystemClock(),
            retain_versions=args.retain_versions,
            retain_s=retain_s,
            min_age_s=min_age_s,
            dry_run=args.dry_run,
            lease_ttl_s=settings.rollup.owner_lease_ttl_s,
        )
        verb = "would delete" if report.dry_run else "deleted"
        for key in report.deleted:
            print(f"{verb} {key}")
        for line in describe_leases(report):
            print(line)
        if report.committed_version is not None:
            print(
                f"committed version {report.committed_version} (the pointer moves before "
                "anything is deleted)",
                file=sys.stderr,
            )
        print(
            f"current version {report.current_version}; retained versions "
            f"{report.retained_versions}; kept {report.kept}; too young {report.too_young}; "
            f"{verb} {len(report.deleted)}",
            file=sys.stderr,
        )
        return 0

    return run_with_store(settings, work)


def describe_leases(report: VacuumReport) -> list[str]:
    """One line per reader lease vacuum met: what it kept for whom, or that it expired."""
    verb = "would delete" if report.dry_run else "deleted"
    lines = []
    for pin in report.pinned:
        lease = pin.lease
        what = (
            "its snapshot was already vacuumed, kept nothing"
            if pin.snapshot_gone
            else f"kept {pin.files_kept} file(s) of version {lease.version}"
        )
        lines.append(
            f"reader lease {lease.reader} ({lease.purpose or 'no purpose given'}, expires "
            f"{format_created_at(lease.expires_at_unix_ns)}): {what}"
        )
    for lease in report.expired_leases:
        lines.append(
            f"{verb} expired reader lease {lease.reader} (version {lease.version}, "
            f"expired {format_created_at(lease.expires_at_unix_ns)})"
        )
    lines += [
        f"unreadable reader lease {key}: left for an operator" for key in report.unreadable_leases
    ]
    return lines


def add_snapshot_arguments(parser: argparse.ArgumentParser) -> None:
    """``--version N`` or ``--as-of TIME``: which committed snapshot a read sees."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--version", type=int, help="read this version (default: latest)")
    which.add_argument(
        "--as-of",
        type=time_argument,
        metavar="TIME",
        help="read the newest version committed at or before TIME (RFC 3339, UTC by default)",
    )


READ_HANDLERS: dict[str, Handler] = {
    "query": run_query,
    "history": run_history,
    "verify": run_verify,
    "vacuum": run_vacuum,
}


def add_read_commands(subparsers: Any) -> None:
    """Add query/history/verify/vacuum to ``subparsers`` (from ``add_subparsers()``)."""
    query = subparsers.add_parser("query", help="read a rollup table")
    query.add_argument("table", choices=sorted(schemas.TABLES))
    query.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="'COLUMN OP VALUE'",
        help="filter (repeatable, all must hold); OP is = != < <= > >=",
    )
    query.add_argument(
        "--from",
        type=time_argument,
        metavar="TIME",
        help="first time included (RFC 3339, UTC by default)",
    )
    query.add_argument("--to", type=time_argument, metavar="TIME", help="first time excluded")
    query.add_argument("--columns", help="comma-separated columns (default: all)")
    add_snapshot_arguments(query)
    query.add_argument(
        "--lease",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pin the snapshot with a reader lease so vacuum keeps its files (default: "
        "when reading more than [rollup] reader_lease_min_files files)",
    )
    query.add_argument("--limit", type=int, help="print at most this many rows")
    query.add_argument("--format", choices=FORMATS, default="table")
    query.set_defaults(handler=run_query)

    hist = subparsers.add_parser("history", help="list committed versions")
    hist.add_argument("--limit", type=int, help="newest N versions only")
    hist.add_argument("--format", choices=FORMATS, default="table")
    hist.set_defaults(handler=run_history)

    check = subparsers.add_parser("verify", help="check the ledger against accepted batches")
    check.add_argument("--version", type=int, help="verify this version (default: latest)")
    check.add_argument("--from", type=hour_argument, metavar="YYYY-MM-DDTHH", help="first hour")
    check.add_argument(
        "--to", type=hour_argument, metavar="YYYY-MM-DDTHH", help="last hour (included)"
    )
    check.add_argument("--format", choices=FORMATS, default="table")
    check.add_argument(
        "--from-manifests",
        action="store_true",
        help="recompute from accepted/v1/ itself (one GET per manifest) instead of the catalog",
    )
    check.set_defaults(handler=run_verify)

    clean = subparsers.add_parser("vacuum", help="delete unreachable rollup files")
    clean.add_argument(
        "--retain-versions", type=int, metavar="N", help="keep the newest N versions"
    )
    clean.add_argument(
        "--retain-seconds",
        type=float,
        metavar="S",
        help="keep every state of the last S seconds (default: rollup.retention_s "
        "unless --retain-versions is given)",
    )
    clean.add_argument(
        "--min-age-seconds",
        type=float,
        metavar="S",
        help="never delete objects younger than this (default: rollup.vacuum_min_age_s)",
    )
    clean.add_argument("--dry-run", action="store_true", help="list, delete nothing")
    clean.set_defaults(handler=run_vacuum)
