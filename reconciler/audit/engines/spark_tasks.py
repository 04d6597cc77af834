"""What the Spark audit's executors run (`reconciler.audit.engines.spark_joins`): picklable
callables for ``mapInArrow``, each reaching the store with its own client
(`rollup.table.storage.StoreAccess`, cached per Python worker).

- `ReadCatalog`: pinned catalog files → ``catalog_base`` rows (`CATALOG_DDL`): every row's
  `CATALOG_COLUMNS` (its rank filled in by `index.catalog_rank.with_rank`, as the local
  engine's copies are), its ``row_rank`` (file rank x `ROWS_PER_FILE_RANK` + its place in
  the file), its file's hour and rank; a file that is not an index file is one row with
  ``error`` (`fetch_catalog`'s "unreadable"); a file that is gone fails the task with
  `MISSING` in its message (the driver raises `PinnedFileMissing`).
- `ReadListing`: listing parts → ``listing`` rows (`LISTING_DDL`).
- `ReadParts`: Parquet parts → their rows (the audit's own rows, `ADDED_DDL`).
- `WriteResult`: one partition of a result → one Parquet part in the store.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from index.catalog_rank import RANK_COLUMNS, with_rank
from index.rows import IndexFileError, read_table
from reconciler.audit.engines.duckdb_joins import (
    CATALOG_COLUMNS,
    INTEGER_COLUMNS,
    ROWS_PER_FILE_RANK,
    STRING_COLUMNS,
)
from rollup.table.storage import StoreAccess, open_parquet_writer, read_object

LISTING_DDL = "kind string, key string, etag string, size long, last_modified_ns long"
CATALOG_DDL = (
    "key string, kind string, etag string, frame_sha256 string, accepted_frame_sha256 string, "
    "raw_blob_key string, time_unix_ns long, raw_offset long, raw_length long, "
    "first_epoch long, first_sequence long, first_position long, "
    "row_rank long, hour_start_ns long, file_rank long, error string"
)
PART_DDL = "part long, key string, rows long"
ADDED_DDL = (
    "key string, frame_sha256 string, accepted_frame_sha256 string, raw_blob_key string, "
    "raw_offset long, raw_length long"
)
"""The rows the audit wrote itself (`reconciler.audit.engines.duckdb_joins.ADDED_SCHEMA`)."""
MISSING = "pinned catalog file gone:"
_BATCH_ROWS = 65_536


@dataclass(frozen=True, slots=True)
class ReadCatalog:
    """``mapInArrow``: catalog files (``name, rank, hour_start_ns``) → `CATALOG_DDL` rows;
    an unreadable file is one row with ``error``; a file that is gone fails the task."""

    access: StoreAccess

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for item in batch.to_pylist():
                yield from self._file(item["name"], int(item["rank"]), int(item["hour_start_ns"]))

    def _file(self, name: str, rank: int, hour_ns: int) -> Iterator[pa.RecordBatch]:
        try:
            body = read_object(self.access, name)
        except FileNotFoundError:
            raise FileNotFoundError(f"{MISSING} {name!r}") from None
        try:
            table = with_rank(read_table(body, source=name), name).select(CATALOG_COLUMNS)
        except (IndexFileError, pa.ArrowException) as exc:
            yield _catalog_batch(
                pa.table({c: pa.nulls(1) for c in CATALOG_COLUMNS}), rank, hour_ns, str(exc), 0
            )
            return
        for offset in range(0, table.num_rows, _BATCH_ROWS):
            yield _catalog_batch(table.slice(offset, _BATCH_ROWS), rank, hour_ns, None, offset)


def _catalog_batch(
    table: pa.Table, rank: int, hour_ns: int, error: str | None, offset: int
) -> pa.RecordBatch:
    n = table.num_rows
    columns = {c: table.column(c).cast(pa.string()) for c in STRING_COLUMNS}
    return pa.RecordBatch.from_pydict(
        {
            **{c: columns[c].combine_chunks() for c in columns},
            **{
                c: table.column(c).cast(pa.int64()).combine_chunks()
                for c in (*INTEGER_COLUMNS, *RANK_COLUMNS)
            },
            "row_rank": pa.array(
                range(rank * ROWS_PER_FILE_RANK + offset, rank * ROWS_PER_FILE_RANK + offset + n),
                pa.int64(),
            ),
            "hour_start_ns": pa.array([hour_ns] * n, pa.int64()),
            "file_rank": pa.array([rank] * n, pa.int64()),
            "error": pa.array([error] * n, pa.string()),
        }
    )


@dataclass(frozen=True, slots=True)
class ReadListing:
    """``mapInArrow``: listing parts (``kind, key``) → `LISTING_DDL` rows."""

    access: StoreAccess

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for item in batch.to_pylist():
                part = pq.read_table(io.BytesIO(read_object(self.access, item["key"])))
                modified = pc.multiply(part.column("last_modified").cast(pa.int64()), 1000)
                yield from pa.table(
                    {
                        "kind": pa.array([item["kind"]] * part.num_rows, pa.string()),
                        "key": part.column("key"),
                        "etag": part.column("etag"),
                        "size": part.column("size"),
                        "last_modified_ns": modified,
                    }
                ).to_batches(max_chunksize=_BATCH_ROWS)


@dataclass(frozen=True, slots=True)
class ReadParts:
    """``mapInArrow``: Parquet objects (``key``) → their ``columns``."""

    access: StoreAccess
    columns: tuple[str, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for key in batch.column("key").to_pylist():
                body = read_object(self.access, str(key))
                part = pq.read_table(io.BytesIO(body), columns=list(self.columns))
                yield from part.to_batches(max_chunksize=_BATCH_ROWS)


@dataclass(frozen=True, slots=True)
class WriteResult:
    """``mapInArrow``: a partition of a result → one Parquet part in the store."""

    access: StoreAccess
    prefix: str
    schema: pa.Schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        key = f"{self.prefix}{part:05d}.parquet"
        writer, stream = open_parquet_writer(self.access, key, self.schema, compression="zstd")
        rows = 0
        try:
            for batch in batches:
                writer.write_table(pa.Table.from_batches([batch]).cast(self.schema))
                rows += batch.num_rows
        finally:
            writer.close()
            stream.close()
        yield pa.RecordBatch.from_pydict(
            {"part": [part], "key": [key], "rows": [rows]},
            schema=pa.schema([("part", pa.int64()), ("key", pa.string()), ("rows", pa.int64())]),
        )
