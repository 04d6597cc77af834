"""Deletes in the published Iceberg metadata: position-delete files (PROTOCOL §4.1).

A rollup data file with deletes still pending on it (`rollup.table.tombstones.pending_for`:
committed at or after the file, so compaction has not rewritten it yet) gets an Iceberg
*position-delete file*: a Parquet file of ``(file_path, pos)`` rows, one per masked row
of that data file (``pos`` counts rows from 0 in file order), with Iceberg's reserved
field ids. `rollup.iceberg.metadata` lists them in a second manifest of content
``deletes``, so every Iceberg reader (DuckDB ``iceberg_scan``, pyiceberg, Spark, Trino)
skips exactly the rows the project's own reader masks. Once compaction rewrites the data
file, nothing is pending on the new file and its delete file is no longer listed.

Cost (decided here): a delete file's key is a digest of the data file's path and the
pending tombstones' ids (`delete_file_key`), so it is written once, by the first publish
that needs it: one GET of the data file and one PUT. Every later publish of a version
that still lists it reads it back (one small GET) for its row count and size. The files
live under ``rollup/v1/iceberg/<table>/metadata/`` with the other published metadata.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from protocol import keys
from rollup.table import schemas
from rollup.table.manifest import DataFile
from rollup.table.manifest import Snapshot as RollupSnapshot
from rollup.table.tombstones import Tombstone, matches, needed_columns, pending_on
from store.base import ObjectStore
from store.errors import NotFound, PreconditionFailed

# Iceberg's reserved field ids of a position-delete file (spec: "Position Delete Files").
FILE_PATH_FIELD_ID = 2147483546
POS_FIELD_ID = 2147483545
POSITION_DELETE_SCHEMA = pa.schema(
    [
        pa.field(
            "file_path",
            pa.string(),
            nullable=False,
            metadata={b"PARQUET:field_id": str(FILE_PATH_FIELD_ID).encode()},
        ),
        pa.field(
            "pos",
            pa.int64(),
            nullable=False,
            metadata={b"PARQUET:field_id": str(POS_FIELD_ID).encode()},
        ),
    ]
)


@dataclass(frozen=True, slots=True)
class PositionDeletes:
    """One published position-delete file and the data file it applies to."""

    key: str
    data_file: DataFile
    record_count: int
    size_bytes: int
    sequence_number: int
    """The version of the newest tombstone it applies: never below the data file's."""


def delete_file_key(table: str, data_path: str, pending: tuple[Tombstone, ...]) -> str:
    digest = hashlib.sha256("\n".join([data_path, *sorted(t.id for t in pending)]).encode())
    return keys.rollup_iceberg_file_key(table, f"del-{digest.hexdigest()[:40]}.parquet")


def masked_positions(table: str, rows: pa.Table, pending: tuple[Tombstone, ...]) -> np.ndarray:
    """Row positions (file order) of ``rows`` that ``pending`` masks."""
    hit = matches(pending, table, rows)
    return np.flatnonzero(np.asarray(pc.fill_null(hit, False).to_numpy(zero_copy_only=False)))


def position_delete_bytes(data_url: str, positions: np.ndarray) -> bytes:
    table = pa.Table.from_arrays(
        [pa.array([data_url] * len(positions), pa.string()), pa.array(positions, pa.int64())],
        schema=POSITION_DELETE_SCHEMA,
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


async def position_deletes(
    store: ObjectStore,
    snapshot: RollupSnapshot,
    table: str,
    data_url_of: Callable[[str], str],
) -> list[PositionDeletes]:
    """The position-delete files ``table`` needs at ``snapshot``, written if missing."""
    result: list[PositionDeletes] = []
    for data_file in sorted(snapshot.data_files(table), key=lambda f: f.path):
        pending = pending_on(snapshot.tombstones, data_file)
        if not pending:
            continue
        key = delete_file_key(table, data_file.path, pending)
        try:
            body, _ = await store.get(key)
        except NotFound:
            body = await _write(store, key, table, data_file, pending, data_url_of)
        count = pq.read_metadata(io.BytesIO(body)).num_rows
        if count:
            result.append(
                PositionDeletes(
                    key=key,
                    data_file=data_file,
                    record_count=count,
                    size_bytes=len(body),
                    sequence_number=max(t.added_version for t in pending),
                )
            )
    return result


async def _write(
    store: ObjectStore,
    key: str,
    table: str,
    data_file: DataFile,
    pending: tuple[Tombstone, ...],
    data_url_of: Callable[[str], str],
) -> bytes:
    data, _ = await store.get(data_file.path)
    schema = schemas.table_schema(table)
    columns = needed_columns(table, pending)
    rows = pq.read_table(io.BytesIO(data), columns=columns, partitioning=None)
    rows = rows.cast(pa.schema([schema.field(name) for name in columns]))
    body = position_delete_bytes(
        data_url_of(data_file.path), masked_positions(table, rows, pending)
    )
    try:
        await store.put(key, body, if_none_match=True)
    except PreconditionFailed:  # another publisher wrote it first: same rows, use theirs
        body, _ = await store.get(key)
    return body
