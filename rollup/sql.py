"""DuckDB over one committed snapshot: the tables as views of exactly its data files.

`open_duckdb` makes an in-memory DuckDB connection that never fetches anything: automatic
extension install and load are off, and the extensions it needs come from the PyPI wheels
``duckdb-extension-<name>`` (pinned to the DuckDB version, in the ``rollup`` extra),
loaded by path (`extension_path`). Each wheel ships
``duckdb_extension_<name>/extensions/v<duckdb version>/<name>.duckdb_extension``.
``httpfs`` is loaded for S3 stores; ``avro`` and ``iceberg`` always, so ``iceberg_scan``
works over published Iceberg metadata.

`register_snapshot` creates one view per table (`rollup.schemas.TABLES`) named after it:
``read_parquet`` of exactly the snapshot's data files of that table, never a glob (a glob
would also read orphans of failed runs and files compaction replaced), with
``hive_partitioning=false`` (the ``date=``/``hour=`` directories add no columns),
``union_by_name=true`` (files written by different writers may order columns
differently) and every column cast to the table's type. A table without files is a view
with the same columns and types and no rows.

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
from pathlib import Path
from urllib.parse import urlsplit

import duckdb
import pyarrow as pa

from config.store_url import StoreLocation
from rollup import schemas
from rollup.manifest import Snapshot
from rollup.storage import engine_url

EXTENSIONS = ("httpfs", "avro", "iceberg")


class ExtensionMissing(RuntimeError):
    """A DuckDB extension wheel is not installed (or is for another DuckDB version)."""


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
    """The DuckDB type of a table column's Arrow type (the types `rollup.schemas` uses),
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


def view_sql(table: str, schema: pa.Schema, urls: Sequence[str]) -> str:
    """``CREATE VIEW`` of ``table`` over exactly ``urls`` (no rows when empty)."""
    casts = ", ".join(
        f"CAST({'NULL' if not urls else _identifier(f.name)} AS {duckdb_type(f.type)}) "
        f"AS {_identifier(f.name)}"
        for f in schema
    )
    if not urls:
        return f"CREATE OR REPLACE VIEW {_identifier(table)} AS SELECT {casts} WHERE false"
    files = ", ".join(_literal(url) for url in urls)
    return (
        f"CREATE OR REPLACE VIEW {_identifier(table)} AS SELECT {casts} FROM read_parquet("
        f"[{files}], hive_partitioning = false, union_by_name = true)"
    )


def register_snapshot(
    connection: duckdb.DuckDBPyConnection, snapshot: Snapshot | None, location: StoreLocation
) -> None:
    """One view per table over ``snapshot``'s data files (None: every table empty)."""
    for table, schema in schemas.TABLES.items():
        files = snapshot.data_files(table) if snapshot is not None else ()
        urls = [engine_url(location.url, f.path) for f in files]
        connection.execute(view_sql(table, schema, urls))
