"""The ``lm-rollup`` subcommands that change the dataset without a run: ``delete``,
``compact``, ``acknowledge-lost``.

``delete --metric M [--label k=v ...] [--agent A] [--from T] [--to T] [--table T ...]
--reason "..." [--by WHO] [--dry-run]`` commits a tombstone (`rollup.lifecycle.delete`): every
reader masks the matching rows from then on. ``--to`` defaults to now (store time), so
the series keeps being collected; ``--table`` defaults to both tables (``points`` only
with ``--agent``: ``rollup_1m`` has no agent). ``--dry-run`` commits nothing and prints,
per table, how many rows the delete would mask and the first ``--limit`` of them.

``compact [--hour YYYY-MM-DDTHH ...] [--table T ...] [--target-bytes N]`` rewrites hours
with many small files or with deleted rows into files of about ``[rollup]
compact_target_bytes`` in one commit (`rollup.lifecycle.compaction`), printing one progress line
per hour on stderr and the report as JSON.

Both publish the version they commit as Iceberg metadata right away
(`rollup.iceberg.publish`; deleted rows become position deletes).

``acknowledge-lost MANIFEST_KEY --reason "..." [--by WHO] [--dry-run]`` records an
accepted batch whose raw blob is missing or corrupt as lost in the ledger
(`rollup.lifecycle.lost`), so its hour's ledger matches the catalog again; it prints the record
as JSON (``--dry-run``: only checks that the batch is lost, and why).

Exit codes: 0 done; 2 the command could not run (bad arguments, no snapshot yet, store
errors, every commit attempt lost the pointer race).
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys
from dataclasses import asdict
from typing import Any

from config.settings import Settings
from protocol.clock import SystemClock
from rollup.cli.read import hour_argument, run_with_store, time_argument
from rollup.iceberg.publish import publish_or_log
from rollup.lifecycle import compaction
from rollup.lifecycle import delete as delete_mod
from rollup.lifecycle import lost as lost_mod
from rollup.read.render import FORMATS, render
from rollup.table import schemas
from rollup.table.commit import CommitConflict
from rollup.table.tombstones import TombstoneError
from store.base import ObjectStore
from store.time import store_clock


def _default_requester() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):  # no user name in a minimal container
        return f"unknown@{socket.gethostname()}"


def _request(args: argparse.Namespace) -> delete_mod.DeleteRequest:
    return delete_mod.DeleteRequest(
        metric=args.metric,
        reason=args.reason,
        requested_by=args.by or _default_requester(),
        labels=delete_mod.parse_labels(args.label),
        agent_id=args.agent,
        start=getattr(args, "from"),
        end=args.to,
        tables=tuple(args.table) if args.table else None,
    )


def run_delete(args: argparse.Namespace, settings: Settings) -> int:
    """``delete``: commit a tombstone, or with ``--dry-run`` show what it would mask."""
    try:
        request = _request(args)
    except TombstoneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    async def work(store: ObjectStore) -> int:
        clock = SystemClock()
        try:
            if args.dry_run:
                return await _dry_run(store, request, args, settings)
            tombstone, committed = await delete_mod.delete(store, request, clock=clock)
        except (TombstoneError, delete_mod.NothingToDelete) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except CommitConflict as exc:
            print(f"error: every commit attempt lost the pointer race: {exc}", file=sys.stderr)
            return 2
        summary: dict[str, Any] = {
            "tombstone": tombstone.id,
            "version": committed.snapshot.version,
            "matches": tombstone.describe(),
            "requested_by": tombstone.requested_by,
            "reason": tombstone.reason,
            "iceberg_published": await _publish(store, settings),
        }
        print(json.dumps(summary, ensure_ascii=False, indent=1))
        return 0

    return run_with_store(settings, work)


async def _dry_run(
    store: ObjectStore,
    request: delete_mod.DeleteRequest,
    args: argparse.Namespace,
    settings: Settings,
) -> int:
    from rollup.table.storage import StoreAccess  # pyarrow's S3 client only when reading

    now_ns = store_clock(store, SystemClock()).now_ns()
    tombstone = request.tombstone(now_ns=now_ns)
    filesystem, root = StoreAccess.of(settings.store).filesystem()
    masked = await delete_mod.preview(store, tombstone, filesystem=filesystem, root=root)
    print(f"dry run: would delete {tombstone.describe()}", file=sys.stderr)
    for table, rows in masked.items():
        print(f"{table}: {rows.num_rows} rows would be masked", file=sys.stderr)
        shown = rows.slice(0, args.limit)
        if shown.num_rows:
            print(f"== {table}")
            render(shown.to_pylist(), shown.column_names, args.format, sys.stdout)
    return 0


def run_compact(args: argparse.Namespace, settings: Settings) -> int:
    """``compact``: rewrite small files and apply deletes, in one commit."""
    from rollup.table.storage import StoreAccess  # pyarrow's S3 client only when rewriting

    access = StoreAccess.of(settings.store)

    async def work(store: ObjectStore) -> int:
        try:
            report = await compaction.compact(
                store,
                access=access,
                clock=SystemClock(),
                hours=args.hour or None,
                tables=args.table or None,
                target_bytes=args.target_bytes or settings.rollup.compact_target_bytes,
                min_files=settings.rollup.compact_min_files,
                compression=settings.rollup.compression,
                progress=lambda line: print(line, file=sys.stderr, flush=True),
            )
        except CommitConflict as exc:
            print(f"error: every commit attempt lost the pointer race: {exc}", file=sys.stderr)
            return 2
        published = await _publish(store, settings) if report.hours else []
        print(json.dumps({**asdict(report), "iceberg_published": published}, indent=1))
        if not report.hours:
            print("nothing to compact", file=sys.stderr)
        return 0

    return run_with_store(settings, work)


async def _publish(store: ObjectStore, settings: Settings) -> list[int]:
    """Publish the new version as Iceberg metadata now, so engines reading Iceberg stop
    seeing deleted rows without waiting for the next run (a failure is logged; the next
    run repairs it)."""
    return await publish_or_log(
        store, store_url=settings.store.url, retention_s=settings.rollup.retention_s
    )


def run_acknowledge_lost(args: argparse.Namespace, settings: Settings) -> int:
    """``acknowledge-lost``: record a batch whose blob is gone or corrupt as lost."""

    async def work(store: ObjectStore) -> int:
        if args.dry_run:
            manifest, bad = await lost_mod.check_lost(store, args.manifest_key)
            print(
                f"dry run: would record {manifest.identity.manifest_id} (accepted hour "
                f"{manifest.accepted_hour.iso}) as lost: {bad.kind}: {bad.detail}",
                file=sys.stderr,
            )
            return 0
        done = await lost_mod.acknowledge_lost(
            store,
            args.manifest_key,
            reason=args.reason,
            by=args.by or _default_requester(),
            clock=SystemClock(),
            owner_lease_ttl_s=settings.rollup.owner_lease_ttl_s,
        )
        print(json.dumps({"version": done.version, **done.lost.to_dict()}, indent=1))
        return 0

    return run_with_store(settings, work)


def add_lifecycle_commands(subparsers: Any) -> None:
    """Add ``delete`` and ``compact`` to ``subparsers`` (from ``add_subparsers()``)."""
    remove = subparsers.add_parser(
        "delete", help="delete a series' rows (a tombstone: every reader masks them)"
    )
    remove.add_argument("--metric", required=True, help="the metric name (required)")
    remove.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="only rows whose label NAME equals VALUE (repeatable, all must hold)",
    )
    remove.add_argument("--agent", help="only rows sent by this agent_id (points only)")
    remove.add_argument(
        "--from", type=time_argument, metavar="TIME", help="first time deleted (default: all)"
    )
    remove.add_argument(
        "--to", type=time_argument, metavar="TIME", help="first time kept (default: now)"
    )
    remove.add_argument(
        "--table",
        action="append",
        choices=sorted(schemas.DELETABLE_TABLES),
        help="tables to delete from (repeatable; default: all, points only with --agent)",
    )
    remove.add_argument("--reason", required=True, help="why (recorded in the history)")
    remove.add_argument("--by", help="who asks (default: user@host)")
    remove.add_argument("--dry-run", action="store_true", help="show what would be masked")
    remove.add_argument(
        "--limit", type=int, default=20, help="dry run: rows printed per table (default 20)"
    )
    remove.add_argument("--format", choices=FORMATS, default="table")
    remove.set_defaults(handler=run_delete)

    squash = subparsers.add_parser(
        "compact", help="rewrite small files (and deleted rows) into large files, one commit"
    )
    squash.add_argument(
        "--hour",
        action="append",
        type=hour_argument,
        metavar="YYYY-MM-DDTHH",
        help="rewrite this hour (repeatable; default: every hour with many files or deletes)",
    )
    squash.add_argument(
        "--table", action="append", choices=sorted(schemas.TABLES), help="only this table"
    )
    squash.add_argument(
        "--target-bytes",
        type=int,
        metavar="N",
        help="size of the files written (default: [rollup] compact_target_bytes)",
    )
    squash.set_defaults(handler=run_compact)

    lost = subparsers.add_parser(
        "acknowledge-lost",
        help="record an accepted batch whose raw blob is gone or corrupt as lost (ledger)",
    )
    lost.add_argument("manifest_key", help="the batch's accepted/v1/... manifest key")
    lost.add_argument("--reason", required=True, help="why it cannot be restored (recorded)")
    lost.add_argument("--by", help="who acknowledges it (default: user@host)")
    lost.add_argument("--dry-run", action="store_true", help="check it is lost; commit nothing")
    lost.set_defaults(handler=run_acknowledge_lost)
