"""The Spark audit's result files between the store and the driver
(`reconciler.audit.engines.spark_joins`): the schemas of the results (those DuckDB writes for the
same statements: ``tests/reconciler/test_audit_spark_joins.py`` checks they agree), the
driver's local files copied to the store as parts for the executors (`upload_parts`), and
the parts the executors wrote concatenated into one local file (`download_parts`). One
batch or one part in memory at a time."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from reconciler.audit.engines.duckdb_joins import BATCH_ROWS, iter_batches
from rollup.table.storage import StoreAccess, open_parquet_writer, read_object

RECORDS_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("kind", pa.string()),
        ("listed_etag", pa.string()),
        ("last_modified_ns", pa.int64()),
        ("etag", pa.string()),
        ("frame_sha256", pa.string()),
        ("accepted_frame_sha256", pa.string()),
        ("raw_blob_key", pa.string()),
        ("raw_offset", pa.int64()),
        ("raw_length", pa.int64()),
        ("time_unix_ns", pa.int64()),
        ("conflict", pa.bool_()),
        ("reason", pa.string()),
    ]
)
BLOBS_SCHEMA = pa.schema(
    [
        ("raw_key", pa.string()),
        ("frame_sha256", pa.string()),
        ("size", pa.int64()),
        ("last_modified_ns", pa.int64()),
        ("raw_retention", pa.bool_()),
        ("reason", pa.string()),
    ]
)
REFERENCING_SCHEMA = pa.schema([("raw_key", pa.string()), ("record_key", pa.string())])
BAD_RANGES_SCHEMA = pa.schema(
    [
        ("record_key", pa.string()),
        ("raw_key", pa.string()),
        ("raw_offset", pa.int64()),
        ("raw_length", pa.int64()),
        ("size", pa.int64()),
    ]
)
BUNDLES_SCHEMA = pa.schema(
    [
        ("raw_key", pa.string()),
        ("size", pa.int64()),
        ("live_bytes", pa.int64()),
        ("frames", pa.int64()),
        ("dead_bytes", pa.int64()),
        ("pinned", pa.bool_()),
    ]
)
"""The result files' schemas (see module)."""
PART_ROWS = 1_000_000
"""Rows per part `upload_parts` writes (~100 MB of the audit's own rows)."""


def upload_parts(
    access: StoreAccess, prefix: str, paths: Sequence[str], schema: pa.Schema
) -> list[str]:
    """The local Parquet files ``paths`` (of ``schema``) as parts of up to `PART_ROWS` rows
    under ``prefix`` in the store; their keys, in order."""
    parts: list[str] = []
    part: tuple[pq.ParquetWriter, pa.NativeFile] | None = None
    rows = 0
    try:
        for path in paths:
            for batch in iter_batches(path):
                if part is None or rows >= PART_ROWS:
                    _close(part)
                    part = None
                    key = f"{prefix}{len(parts):05d}.parquet"
                    part = open_parquet_writer(access, key, schema, compression="zstd")
                    parts.append(key)
                    rows = 0
                part[0].write_batch(batch)
                rows += batch.num_rows
    finally:
        _close(part)
    return parts


def download_parts(access: StoreAccess, parts: Sequence[str], schema: pa.Schema, path: str) -> None:
    """The store's Parquet ``parts`` concatenated in order into one local file at ``path``
    (written aside, then renamed)."""
    tmp = path + ".tmp"
    with pq.ParquetWriter(tmp, schema, compression="zstd") as out:
        for key in parts:
            part = pq.ParquetFile(io.BytesIO(read_object(access, key)))
            for batch in part.iter_batches(batch_size=BATCH_ROWS):
                out.write_table(pa.Table.from_batches([batch], schema=schema))
    os.replace(tmp, path)


def _close(part: tuple[pq.ParquetWriter, pa.NativeFile] | None) -> None:
    if part is not None:
        part[0].close()
        part[1].close()
