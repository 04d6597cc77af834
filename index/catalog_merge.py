"""Merging catalog files out of core (PROTOCOL §3.7 compaction, §3.9 "geometric").

`merge_files` merges some of an hour's catalog files into one: each input is fetched to a
local spill directory one at a time (never the hour in memory), and DuckDB — under a
memory limit, spilling to that directory — keeps the newest file's row per key (file
names are ``<epoch>-<sequence>``: name order is write order), sorts by key and writes one
Parquet file whose key-value metadata names its inputs (``lightmetrics.compacted_from``)
and its level (``lightmetrics.level``). The merged body is created with If-None-Match like
every catalog file (`CatalogWriter.write_encoded`) and read back: its SHA-256 must be what
was sent. The inputs are not deleted here: `index.catalog.delete_compacted_inputs` does
that after the readers' grace, by the names the merged file records.

An input written before a column existed is normalized first (`index.rows.read_table`
adds the column as nulls), so DuckDB always sees `FILE_SCHEMA`.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from protocol import keys
from store.base import ObjectInfo, ObjectStore

from .catalog import COMPACTED_FROM, CatalogWriter, Compaction
from .rows import FILE_SCHEMA, IndexFileError, read_table

LEVEL = b"lightmetrics.level"
DEFAULT_MEMORY_LIMIT_MB = 256


@dataclass(frozen=True, slots=True)
class MergeLimits:
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB
    spill_dir: str | None = None
    """Where inputs and DuckDB's spill files go (None: the system's temporary directory)."""
    threads: int = 1


def file_level(body_footer: dict[bytes, bytes] | None) -> int:
    """The level a merged file records (0 for a file the steady pass or audit wrote)."""
    raw = (body_footer or {}).get(LEVEL)
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0


async def merge_files(
    store: ObjectStore,
    writer: CatalogWriter,
    hour: keys.UtcHour,
    inputs: Sequence[ObjectInfo],
    *,
    level: int,
    limits: MergeLimits = MergeLimits(),
) -> Compaction:
    """Merge ``inputs`` (files of ``hour``) into one file of ``level``. Raises
    `IndexFileError` when an input is not a catalog file, `NotFound` when one is gone,
    the store's error when the create does not settle."""
    names = sorted(info.key for info in inputs)
    if len(names) < 2:
        raise ValueError("a merge needs at least two files")
    with tempfile.TemporaryDirectory(prefix="lm-catalog-merge-", dir=limits.spill_dir) as tmp:
        paths = []
        for i, name in enumerate(names):
            body, _etag = await store.get(name)
            path = Path(tmp, f"{i:08d}.parquet")
            await asyncio.to_thread(_write_normalized, path, body, name)
            del body
            paths.append(str(path))
        out = Path(tmp, "merged.parquet")
        metadata = {COMPACTED_FROM.decode(): "\n".join(names), LEVEL.decode(): str(level)}
        rows = await asyncio.to_thread(_merge, paths, out, metadata, limits, tmp)
        body = await asyncio.to_thread(out.read_bytes)
    digest = hashlib.sha256(body).hexdigest()
    merged = await writer.write_encoded(hour, body)
    del body
    stored, _etag = await store.get(merged)
    if hashlib.sha256(stored).hexdigest() != digest:
        raise IndexFileError(f"{merged}: the merged file read back differs from what was sent")
    return Compaction(merged, tuple(names), rows)


def _write_normalized(path: Path, body: bytes, name: str) -> None:
    """The input as a local file with every `FILE_SCHEMA` column (as is when it has them)."""
    try:
        present = set(pq.read_schema(io.BytesIO(body)).names)
    except Exception as exc:
        raise IndexFileError(f"{name}: not an index file: {exc}") from None
    if present >= set(FILE_SCHEMA.names):
        path.write_bytes(body)
        return
    pq.write_table(read_table(body, source=name), path, compression="zstd")


def _merge(
    paths: list[str], out: Path, metadata: dict[str, str], limits: MergeLimits, tmp: str
) -> int:
    columns = ", ".join(f'"{name}"' for name in FILE_SCHEMA.names)
    files = "[" + ", ".join(_sql_string(p) for p in paths) + "]"
    kv = "{" + ", ".join(f"{_sql_string(k)}: {_sql_string(v)}" for k, v in metadata.items()) + "}"
    config: dict[str, str | bool | int | float | list[str]] = {
        "memory_limit": f"{limits.memory_limit_mb}MB",
        "temp_directory": os.path.join(tmp, "duckdb-spill"),
        "threads": limits.threads,
        "preserve_insertion_order": False,
    }
    try:
        with duckdb.connect(config=config) as con:
            con.execute(
                f"COPY (SELECT {columns} FROM read_parquet({files}, filename = true) "
                "QUALIFY row_number() OVER (PARTITION BY key ORDER BY filename DESC) = 1 "
                f"ORDER BY key) TO {_sql_string(str(out))} "
                f"(FORMAT parquet, COMPRESSION zstd, KV_METADATA {kv})"
            )
            counted = con.execute(
                f"SELECT count(*), count(DISTINCT key) FROM read_parquet({_sql_string(str(out))})"
            ).fetchone()
    except duckdb.Error as exc:
        raise IndexFileError(f"merging catalog files failed: {exc}") from None
    assert counted is not None
    rows, distinct = counted
    if rows != distinct:
        raise IndexFileError(f"merged file has {rows} rows but {distinct} keys")
    return int(rows)


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
