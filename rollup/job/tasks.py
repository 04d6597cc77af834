"""The executor side of a rollup run: what stage 1 and stage 2 exchange, and how they
write. Plain functions over Arrow, no Spark (`rollup.job.stages` wires them into Spark).

Stage 1 (`rollup.job.frame_stage`, one call per input partition through ``mapInArrow``)
turns accepted batches into ``points`` files, per-(minute, series) partials and records.
Stage 2 (`rollup.job.hour_stage`, one call per hour through ``groupBy("hour")
.applyInArrow``) merges an hour's partials with the committed ``rollup_1m`` rows and
writes the replacement file and the hour's ledger file. Between them Spark shuffles
`STAGE1_SCHEMA` rows: a few large Arrow IPC blobs per (task, hour) for the partials and
the series' metric and labels, plus JSON records. Measured on this machine, shuffling
partials as Spark rows cost ~16 µs of JVM CPU per row (more than all the pyarrow work);
as blobs the JVM only moves bytes, and the label maps never become Spark values.

Nothing here commits: every file has a fresh UUID name and stays an orphan until the
driver's commit names it. A failed or retried task's files are orphans too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from protocol import keys
from rollup.table.batch_frames import MAX_RAW_BYTES
from rollup.table.schemas import POINTS_ROW_GROUP_ROWS
from rollup.table.storage import StoreAccess, open_parquet_writer
from rollup.table.tombstones import Tombstone

WORK_SCHEMA = pa.schema(
    [
        pa.field("manifest_id", pa.string()),
        pa.field("frame_sha256", pa.string()),
        pa.field("raw_blob_key", pa.string()),
        pa.field("accepted_hour", pa.string()),
        pa.field("record_count", pa.int64()),
        pa.field("raw_offset", pa.int64()),
        pa.field("raw_length", pa.int64()),
        pa.field("raw_object_bytes", pa.int64()),
    ]
)
"""One accepted batch to include: stage 1's input rows. ``raw_blob_key`` is the raw
object the batch's catalog row names, ``raw_offset``/``raw_length`` its range there (null:
a frame blob, read whole) and ``raw_object_bytes`` the planner's lower bound of that
bundle's size (`rollup.job.plan_sql`; null for a frame blob): what `index.raw_reads.
plan_reads` decides whole-or-ranges by (PROTOCOL §3.10 "Readers")."""

WORK_BLOB_SCHEMA = pa.schema([pa.field("work", pa.binary())])
"""What the driver parallelizes: one row per stage-1 task, its `WORK_SCHEMA` rows as one
Arrow IPC stream (`work_blob`), never a pickled Python tuple per batch."""

STAGE1_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string()),
        pa.field("hour", pa.string()),
        pa.field("body", pa.string()),
        pa.field("data", pa.binary()),
    ]
)
"""Stage 1's rows: ``partials``/``series``/``series_counts`` carry an Arrow IPC stream in
``data``; the record kinds carry JSON in ``body``."""

RESULT_SCHEMA = pa.schema(
    [pa.field("kind", pa.string()), pa.field("hour", pa.string()), pa.field("body", pa.string())]
)
"""Stage 2's rows for the driver: ``points_file``/``rollup_file``/``series_file`` (a
written data file),
``ledger_file``, ``problem``; ``body`` is JSON."""

HourFunction = Callable[[tuple[pa.Scalar, ...], pa.Table], pa.Table]

_OUTPUT_SLICE = 65_536
MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """How executors write Parquet (from ``[rollup]``)."""

    access: StoreAccess
    compression: str = "zstd"
    row_group_size: int = 1_000_000
    max_raw_bytes: int = MAX_RAW_BYTES
    points_row_group_size: int = POINTS_ROW_GROUP_ROWS
    """Rows per ``points`` row group (small, for single-series reads: PROTOCOL §5)."""

    @property
    def parquet_compression(self) -> str:
        return "NONE" if self.compression == "none" else self.compression

    @property
    def chunk_rows(self) -> int:
        """Points buffered before they are aggregated and written (one row group)."""
        return max(1, min(self.row_group_size, 1_000_000))


@dataclass(frozen=True, slots=True)
class HourInputs:
    """What stage 2 must know of the base snapshot, per hour (``YYYY-MM-DDTHH``): the
    committed ``rollup_1m`` files (merged and superseded) and ``points`` files (read only
    to break first/last ties against committed rows)."""

    rollup_files: dict[str, tuple[str, ...]] = field(default_factory=dict)
    points_files: dict[str, tuple[str, ...]] = field(default_factory=dict)
    tombstones: tuple[Tombstone, ...] = ()
    """The base snapshot's deletes: both stages apply them to what they write."""
    first_kept: dict[str, datetime] = field(default_factory=dict)
    """Per table with retention, the start of the first hour kept: rows before it are
    not written (this run's cutoffs, committed with its files)."""


def work_blob(items: pa.Table) -> bytes:
    """``items`` (`WORK_SCHEMA`) as one compressed Arrow IPC stream: a task's work."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, WORK_SCHEMA, options=options) as writer:
        writer.write_table(items.cast(WORK_SCHEMA))
    return bytes(sink.getvalue())


def work_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `WORK_SCHEMA` batches of every blob in ``batches`` (`WORK_BLOB_SCHEMA`)."""
    for batch in batches:
        for blob in batch.column("work"):
            if not blob.is_valid:
                continue
            with pa.ipc.open_stream(blob.as_buffer()) as reader:
                yield from reader


@dataclass(frozen=True, slots=True)
class WorkBlobs:
    """A stage over `WORK_SCHEMA` batches as a picklable callable over `WORK_BLOB_SCHEMA`
    rows (``mapInArrow``): the task decodes its blob, then runs ``stage``."""

    stage: Any
    """An object with ``run(Iterator[RecordBatch]) -> Iterator[RecordBatch]``
    (`rollup.job.frame_stage.FrameStage`)."""

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from self.stage.run(work_batches(batches))


# --- shared by both stages -----------------------------------------------------------


def write_parquet(options: WriteOptions, path: str, table: pa.Table, schema: pa.Schema) -> int:
    """Write ``table`` as one Parquet file at object key ``path``; its size in bytes."""
    writer, stream = open_parquet_writer(
        options.access, path, schema, compression=options.parquet_compression
    )
    try:
        writer.write_table(table, row_group_size=options.row_group_size)
    finally:
        writer.close()
    size = int(stream.tell())
    stream.close()
    return size


def utc_hour(hours_since_epoch: int) -> keys.UtcHour:
    """The `UtcHour` of an hour number (hours since the epoch)."""
    return keys.UtcHour.from_unix_ns(hours_since_epoch * 3600 * keys.NS_PER_S)


def record(kind: str, hour: str, body: dict[str, Any]) -> dict[str, Any]:
    """One record row: ``kind``, the ``hour`` that routes it, ``body`` as JSON."""
    return {"kind": kind, "hour": hour, "body": json.dumps(body, separators=(",", ":"))}


def records_table(records: list[dict[str, Any]]) -> pa.Table:
    """Records as `STAGE1_SCHEMA` rows (every other column null)."""
    rows = len(records)
    columns: list[pa.Array] = []
    for spec in STAGE1_SCHEMA:
        if spec.name != "data":
            columns.append(pa.array([r[spec.name] for r in records], pa.string()))
        else:
            columns.append(pa.nulls(rows, spec.type))
    return pa.Table.from_arrays(columns, schema=STAGE1_SCHEMA)


def file_body(
    table: str,
    path: str,
    hour: keys.UtcHour,
    rows: int,
    size: int,
    low: dict[str, Any],
    high: dict[str, Any],
) -> dict[str, Any]:
    """The JSON body of a ``points_file``/``rollup_file`` record: a `DataFile` without
    ``added_version``, which only the commit knows."""
    return {
        "table": table,
        "path": path,
        "partition": hour.iso,
        "row_count": rows,
        "size_bytes": size,
        "min": low,
        "max": high,
    }


def output_batches(table: pa.Table, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``table`` as record batches of ``schema``, at most `_OUTPUT_SLICE` rows each."""
    table = table.cast(schema)
    for start in range(0, max(table.num_rows, 1), _OUTPUT_SLICE):
        yield from table.slice(start, _OUTPUT_SLICE).to_batches()


def to_ipc(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream (a blob for the shuffle), string columns
    dictionary-encoded: a series string repeats once per minute, an agent id far more."""
    table = pa.Table.from_arrays(
        [
            pc.dictionary_encode(column) if pa.types.is_string(column.type) else column
            for column in table.columns
        ],
        names=table.column_names,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def from_ipc(blobs: pa.ChunkedArray, schema: pa.Schema) -> pa.Table:
    """The rows of every IPC blob in ``blobs``, as one table of ``schema``."""
    tables = [pa.ipc.open_stream(blob.as_buffer()).read_all() for blob in blobs]
    return pa.concat_tables(tables).cast(schema) if tables else schema.empty_table()


def distinct_series_info(info: pa.Table) -> pa.Table:
    """``info`` (`aggregate.SERIES_INFO_SCHEMA`) with one row per series (the first)."""
    if info.num_rows == 0:
        return info
    _, first = np.unique(
        np.asarray(pc.dictionary_encode(info.column("series").combine_chunks()).indices),
        return_index=True,
    )
    return info.take(pa.array(first))
