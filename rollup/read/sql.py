"""DuckDB over one committed snapshot: the tables as views of exactly its data files.

`open_duckdb` makes an in-memory DuckDB connection that never fetches anything: automatic
extension install and load are off, and the extensions it needs come from the PyPI wheels
``duckdb-extension-<name>`` (pinned to the DuckDB version, in the ``rollup`` extra),
loaded by path (`extension_path`). Each wheel ships
``duckdb_extension_<name>/extensions/v<duckdb version>/<name>.duckdb_extension``.
``httpfs`` is loaded for S3 stores; ``avro`` and ``iceberg`` always, so ``iceberg_scan``
works over published Iceberg metadata.

`register_snapshot` creates one view per table (`rollup.table.schemas.TABLES`) named after it:
``read_parquet`` of exactly the snapshot's data files of that table, never a glob (a glob
would also read orphans of failed runs and files compaction replaced), with
``hive_partitioning=false`` (the ``date=``/``hour=`` directories add no columns),
``union_by_name=true`` (files written by different writers may order columns
differently) and every column cast to the table's type. A table without files is a view
with the same columns and types and no rows. Files with deletes still pending on them
(`rollup.table.tombstones.pending_on`) are read with ``WHERE NOT`` the tombstones' predicates
(`tombstone_sql`), so SQL never sees a deleted row.

Read-only (``lm-rollup sql`` without ``--allow-writes``): `check_read_only` refuses any
statement but a query before one runs, and `lock_read_only` has DuckDB open nothing
outside the dataset's directories, with its configuration locked. Both are needed: a
directory DuckDB may read it may also write (``COPY ... TO`` over a data file, measured
with DuckDB 1.5), and a statement check alone would leave every local file and every
object the credentials reach open to reading.

S3 (`S3Access`): a temporary DuckDB secret scoped to the bucket, from the ``[store]``
settings: the endpoint's host and port, ``use_ssl`` from its scheme, ``url_style`` path
for an S3-compatible endpoint (virtual-host for AWS itself), the region, and the
credentials of the standard AWS chain, resolved by botocore as the store's own client
does (`resolve_credentials`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import duckdb
import pyarrow as pa

from config.store_url import StoreLocation
from protocol import keys
from rollup.table import schemas
from rollup.table.manifest import Snapshot
from rollup.table.storage import engine_url
from rollup.table.tombstones import Tombstone, pending_on

EXTENSIONS = ("httpfs", "avro", "iceberg")
READ_STATEMENTS = frozenset({"SELECT", "EXPLAIN"})
"""What a read-only connection runs: the statements DuckDB classifies as these (SELECT,
WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE, PRAGMA of a table function, EXPLAIN)."""
READABLE_PREFIXES = (keys.ROLLUP_TABLES_PREFIX, keys.ROLLUP_ICEBERG_PREFIX)
"""Where a read-only connection may open files: the rollup's data files and the published
Iceberg metadata (so ``iceberg_scan`` works); not raw blobs, manifests, the pointer, other
buckets or local files."""


class ExtensionMissing(RuntimeError):
    """A DuckDB extension wheel is not installed (or is for another DuckDB version)."""


class WriteRefused(ValueError):
    """A statement a read-only connection does not run."""


@dataclass(frozen=True, slots=True)
class S3Credentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None


@dataclass(frozen=True, slots=True)
class S3Access:
    """What DuckDB needs to read the store's bucket."""

    bucket: str
    region: str
    endpoint_url: str | None = None
    credentials: S3Credentials | None = None


def extension_path(name: str) -> Path:
    """The extension file the ``duckdb-extension-<name>`` wheel installed for this DuckDB.
    Raises `ExtensionMissing` saying what to install."""
    wanted = f"duckdb-extension-{name}=={duckdb.__version__}"
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    if spec is None or not spec.submodule_search_locations:
        raise ExtensionMissing(
            f"the DuckDB {name} extension is not installed: pip install {wanted}"
        )
    package = Path(next(iter(spec.submodule_search_locations)))
    path = package / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if not path.is_file():
        raise ExtensionMissing(
            f"the installed DuckDB {name} extension is not for DuckDB {duckdb.__version__} "
            f"(no {path}): pip install {wanted}"
        )
    return path


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def open_duckdb(*, extensions: Iterable[str] = EXTENSIONS) -> duckdb.DuckDBPyConnection:
    """An in-memory connection in UTC with ``extensions`` loaded from their wheels and
    nothing ever downloaded. `ExtensionMissing` if a wheel is missing."""
    paths = [extension_path(name) for name in extensions]
    connection = duckdb.connect(
        config={
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        }
    )
    try:
        connection.execute("SET TimeZone = 'UTC'")
        for path in paths:
            connection.execute(f"LOAD {_literal(str(path))}")
    except BaseException:
        connection.close()
        raise
    return connection


def resolve_credentials() -> S3Credentials | None:
    """The standard AWS chain (environment, shared files, instance role), as the store's
    aiobotocore client resolves it; None when it finds nothing (unsigned requests)."""
    import botocore.session  # the store's own client library, only for S3

    found = botocore.session.get_session().get_credentials()
    if found is None:
        return None
    frozen = found.get_frozen_credentials()
    if not frozen.access_key or not frozen.secret_key:
        return None
    return S3Credentials(frozen.access_key, frozen.secret_key, frozen.token)


def add_s3_secret(connection: duckdb.DuckDBPyConnection, access: S3Access) -> None:
    """A temporary secret, scoped to ``s3://<bucket>``, for the store's bucket."""
    options = [
        "TYPE s3",
        f"SCOPE {_literal(f's3://{access.bucket}')}",
        f"REGION {_literal(access.region)}",
    ]
    if access.endpoint_url is not None:
        parts = urlsplit(access.endpoint_url)
        options += [
            f"ENDPOINT {_literal(parts.netloc)}",
            f"USE_SSL {'true' if parts.scheme == 'https' else 'false'}",
            "URL_STYLE 'path'",  # S3-compatible servers rarely resolve bucket host names
        ]
    if access.credentials is not None:
        options += [
            f"KEY_ID {_literal(access.credentials.access_key_id)}",
            f"SECRET {_literal(access.credentials.secret_access_key)}",
        ]
        if access.credentials.session_token:
            options.append(f"SESSION_TOKEN {_literal(access.credentials.session_token)}")
    connection.execute(f"CREATE OR REPLACE SECRET lightmetrics_store ({', '.join(options)})")


def duckdb_type(data_type: pa.DataType) -> str:
    """The DuckDB type of a table column's Arrow type (the types `rollup.table.schemas` uses),
    spelled as DuckDB's ``DESCRIBE`` spells it."""
    if pa.types.is_timestamp(data_type):
        return "TIMESTAMP WITH TIME ZONE" if data_type.tz is not None else "TIMESTAMP"
    if pa.types.is_map(data_type):
        return f"MAP({duckdb_type(data_type.key_type)}, {duckdb_type(data_type.item_type)})"
    simple = {
        pa.string(): "VARCHAR",
        pa.large_string(): "VARCHAR",
        pa.float64(): "DOUBLE",
        pa.int64(): "BIGINT",
        pa.int32(): "INTEGER",
    }
    if data_type in simple:
        return simple[data_type]
    raise ValueError(f"no DuckDB type for {data_type}")


def view_sql(
    table: str,
    schema: pa.Schema,
    urls: Sequence[str],
    masked: Sequence[tuple[Sequence[str], Sequence[Tombstone]]] = (),
) -> str:
    """``CREATE VIEW`` of ``table`` over exactly ``urls`` and, for each ``(urls,
    tombstones)`` of ``masked``, those files without the rows the tombstones match (no
    rows when there are no files)."""
    casts = ", ".join(
        f"CAST({_identifier(f.name)} AS {duckdb_type(f.type)}) AS {_identifier(f.name)}"
        for f in schema
    )
    selects = [_select(casts, urls, "")] if urls else []
    for group_urls, tombstones in masked:
        where = " OR ".join(f"coalesce({tombstone_sql(table, t)}, false)" for t in tombstones)
        selects.append(_select(casts, group_urls, f" WHERE NOT ({where})"))
    if not selects:
        empty = ", ".join(
            f"CAST(NULL AS {duckdb_type(f.type)}) AS {_identifier(f.name)}" for f in schema
        )
        return f"CREATE OR REPLACE VIEW {_identifier(table)} AS SELECT {empty} WHERE false"
    return f"CREATE OR REPLACE VIEW {_identifier(table)} AS " + " UNION ALL ".join(selects)


def _select(casts: str, urls: Sequence[str], where: str) -> str:
    files = ", ".join(_literal(url) for url in urls)
    return (
        f"SELECT {casts} FROM read_parquet("
        f"[{files}], hive_partitioning = false, union_by_name = true){where}"
    )


def _time_literal(moment: datetime) -> str:
    return "TIMESTAMPTZ " + _literal(moment.astimezone(UTC).isoformat())


def tombstone_sql(table: str, tombstone: Tombstone) -> str:
    """A DuckDB condition true on the rows of ``table`` that ``tombstone`` masks (the same
    predicate as `rollup.table.tombstones.matches`; null where a label is missing)."""
    terms = [f"metric = {_literal(tombstone.metric)}"]
    terms += [f"labels[{_literal(k)}] = {_literal(v)}" for k, v in tombstone.labels]
    if tombstone.agent_id is not None:
        terms.append(f"agent_id = {_literal(tombstone.agent_id)}")
    column = _identifier(schemas.PARTITION_COLUMN[table])
    if tombstone.start is not None:
        terms.append(f"{column} >= {_time_literal(tombstone.start)}")
    terms.append(f"{column} < {_time_literal(tombstone.end)}")
    return "(" + " AND ".join(terms) + ")"


def register_snapshot(
    connection: duckdb.DuckDBPyConnection, snapshot: Snapshot | None, location: StoreLocation
) -> None:
    """One view per table over ``snapshot``'s data files (None: every table empty), with
    the rows of its deletes masked (files grouped by the tombstones still pending on them)."""
    for table, schema in schemas.TABLES.items():
        files = snapshot.data_files(table) if snapshot is not None else ()
        clean: list[str] = []
        groups: dict[tuple[str, ...], tuple[list[str], tuple[Tombstone, ...]]] = {}
        for data_file in files:
            url = engine_url(location.url, data_file.path)
            pending = pending_on(snapshot.tombstones if snapshot is not None else (), data_file)
            if not pending:
                clean.append(url)
                continue
            group = groups.setdefault(tuple(t.id for t in pending), ([], pending))
            group[0].append(url)
        connection.execute(view_sql(table, schema, clean, list(groups.values())))


def lock_read_only(connection: duckdb.DuckDBPyConnection, location: StoreLocation) -> None:
    """Call after the views and the secret are in place: from then on DuckDB itself opens
    no file or object outside `READABLE_PREFIXES` of the store and its own extension
    directory (``allowed_directories``
    with ``enable_external_access = false``), and no setting can change any more
    (``lock_configuration``; ``enable_external_access`` cannot be turned back on anyway).
    A directory DuckDB may read it may also write, so `check_read_only` is needed too."""
    readable = [engine_url(location.url, prefix.rstrip("/")) + "/" for prefix in READABLE_PREFIXES]
    # DuckDB's own extension directory, which duckdb_extensions() lists (nothing is
    # installed or loaded from it: LOAD and INSTALL are refused, autoloading is off).
    row = connection.execute("SELECT current_setting('extension_directory')").fetchone()
    extensions = (row[0] if row else "") or str(Path.home() / ".duckdb" / "extensions")
    readable.append(extensions.rstrip("/") + "/")
    listed = ", ".join(_literal(directory) for directory in readable)
    connection.execute(f"SET allowed_directories = [{listed}]")
    connection.execute("SET enable_external_access = false")
    connection.execute("SET lock_configuration = true")


def check_read_only(connection: duckdb.DuckDBPyConnection, query: str) -> None:
    """`WriteRefused` unless every statement of ``query`` is one of `READ_STATEMENTS`,
    before any of them runs: no ``COPY ... TO``, ``EXPORT``, ``ATTACH``, ``INSERT``,
    ``CREATE``, ``SET``, ``INSTALL``/``LOAD`` or ``CALL``. `duckdb.Error` for SQL that
    does not parse."""
    for statement in connection.extract_statements(query):
        kind = statement.type.name
        if kind not in READ_STATEMENTS:
            raise WriteRefused(
                f"read-only: a {kind} statement is refused (only queries: SELECT, WITH, "
                "DESCRIBE, SHOW, SUMMARIZE, EXPLAIN); --allow-writes runs it with the "
                "store's credentials"
            )
