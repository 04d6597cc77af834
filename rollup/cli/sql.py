"""``lm-rollup sql "SELECT ..."``: DuckDB over the latest (``--version N``, ``--as-of
TIME``) committed snapshot, the tables registered by name (`rollup.read.sql`), offline.
The snapshot is pinned by a reader lease while the SQL runs, and a file vanished
mid-read is retried once against the newer snapshot (`rollup.read.read_guard`).

Read-only by default, because the connection holds the store's credentials, which may
write: every statement must be a query (`rollup.read.sql.check_read_only`: no ``COPY ... TO``,
``EXPORT``, ``ATTACH``, ``SET`` ...), checked before any runs, and DuckDB itself then
opens nothing outside the rollup's tables and Iceberg metadata, and its configuration is
locked (`rollup.read.sql.lock_read_only`). ``--allow-writes`` lifts both (a warning on
stderr). A refused statement is exit code 2.

Rows go to stdout (``--format table|csv|json``, as ``query``); the snapshot read goes to
stderr (``snapshot: version N committed <created_at>``). Several statements may be given;
the last one's rows are printed. Exit codes: 0 done; 2 the query could not run (bad SQL,
unknown version, a file the snapshot lists is unreadable, store errors), with one line on
stderr saying why and no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from config.settings import Settings
from config.store_url import S3Location
from rollup.cli.read import add_snapshot_arguments, read_guard, run_with_store
from rollup.read.read_guard import read_consistently
from rollup.read.render import FORMATS, render
from rollup.table.commit import LoadedSnapshot
from rollup.table.manifest import Snapshot
from store.base import ObjectStore


def _unique(names: list[str]) -> list[str]:
    """Column names made unique (``a``, ``a_2``), so rows can be keyed by them."""
    seen: dict[str, int] = {}
    result = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        result.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return result


def run_sql(args: argparse.Namespace, settings: Settings) -> int:
    """``sql QUERY``: see the module doc."""
    import duckdb  # only `sql` needs DuckDB

    from rollup.read import sql  # imports DuckDB

    location = settings.store.location

    def execute(snapshot: Snapshot | None) -> int:
        try:
            connection = sql.open_duckdb()
        except (sql.ExtensionMissing, duckdb.Error) as exc:
            print(f"error: DuckDB: {exc}", file=sys.stderr)
            return 2
        try:
            if isinstance(location, S3Location):
                access = sql.S3Access(
                    bucket=location.bucket,
                    region=settings.store.region,
                    endpoint_url=settings.store.endpoint_url,
                    credentials=sql.resolve_credentials(),
                )
                sql.add_s3_secret(connection, access)
            sql.register_snapshot(connection, snapshot, location)
            if not args.allow_writes:
                sql.check_read_only(connection, args.query)
                sql.lock_read_only(connection, location)
            relation = connection.sql(args.query)
            if relation is None:
                return 0  # a statement without rows (SET, CREATE ...)
            columns = _unique(list(relation.columns))
            rows = [dict(zip(columns, row, strict=True)) for row in relation.fetchall()]
        except duckdb.IOException as exc:
            # Perhaps a file vacuumed under the read: `read_consistently` looks.
            raise OSError(f"SQL: {exc}") from exc
        except sql.WriteRefused as exc:
            print(f"error: SQL: {exc}", file=sys.stderr)
            return 2
        except duckdb.Error as exc:
            print(f"error: SQL: {exc}", file=sys.stderr)
            return 2
        finally:
            connection.close()
        render(rows, columns, args.format, sys.stdout)
        return 0

    async def read(loaded: LoadedSnapshot | None) -> int:
        if args.allow_writes:
            print(
                "warning: --allow-writes: this SQL may write anywhere the store's "
                "credentials and this process may",
                file=sys.stderr,
            )
        if loaded is None:
            print("snapshot: none committed yet (every table is empty)", file=sys.stderr)
        else:
            snapshot = loaded.snapshot
            print(
                f"snapshot: version {snapshot.version} committed {snapshot.created_at}",
                file=sys.stderr,
            )
        return await asyncio.to_thread(execute, loaded.snapshot if loaded else None)

    async def work(store: ObjectStore) -> int:
        # SQL may read any file of the snapshot, for as long as it takes: always pinned.
        return await read_consistently(
            store,
            version=args.version,
            as_of=args.as_of,
            files_of=lambda snapshot: sorted(
                f.path for table in snapshot.tables for f in snapshot.data_files(table)
            ),
            read=read,
            guard=read_guard(settings, True, purpose="lm-rollup sql"),
        )

    return run_with_store(settings, work)


def add_sql_command(subparsers: Any) -> None:
    """Add ``sql`` to ``subparsers`` (from ``add_subparsers()``)."""
    query = subparsers.add_parser(
        "sql",
        help="run DuckDB SQL over a committed snapshot (tables: points, rollup_1m, series, series_day)",
    )
    query.add_argument("query", help='SQL, e.g. "SELECT metric, count(*) FROM points GROUP BY 1"')
    add_snapshot_arguments(query)
    query.add_argument("--format", choices=FORMATS, default="table")
    query.add_argument(
        "--allow-writes",
        action="store_true",
        help="run statements that write (COPY ... TO, EXPORT, ATTACH, ...) with the store's "
        "credentials, and let SQL open any file or object (default: read-only)",
    )
    query.set_defaults(handler=run_sql)
