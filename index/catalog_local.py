"""Catalog files as local copies for DuckDB (PROTOCOL §3.9: out of core, memory bounded).

`local_copies` fetches catalog files from the store one at a time into a private
temporary directory (``MergeLimits.spill_dir``; nothing of an hour is held in memory but
one file's body at a time), normalizing a file written before a column existed
(`index.rows.read_table` adds it as nulls) so every copy has `FILE_SCHEMA`, with every
row's rank filled in (`index.catalog_rank`: which row of a key counts). `connect` opens
DuckDB under the memory limit, spilling into the same directory. `index.catalog_merge`
(compaction) and `index.catalog_tables.read_hour_totals` (ledger checks) run on these.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from store.base import ObjectStore

from .catalog import COMPACTED_FROM
from .catalog_rank import DUCKDB_RANK_STRUCT, RANK_COLUMNS, with_rank
from .rows import FILE_SCHEMA, RANGE_COLUMNS, IndexFileError, iter_batches

DEFAULT_MEMORY_LIMIT_MB = 256


@dataclass(frozen=True, slots=True)
class MergeLimits:
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB
    spill_dir: str | None = None
    """Where copies and DuckDB's spill files go (None: the system's temporary directory)."""
    threads: int = 1


@contextlib.asynccontextmanager
async def local_copies(
    store: ObjectStore, names: Sequence[str], limits: MergeLimits
) -> AsyncIterator[tuple[str, list[str]]]:
    """``(directory, paths)``: each of ``names`` (in the given order) as a local file with
    every `FILE_SCHEMA` column; the directory goes away on exit. Raises `NotFound` when a
    file is gone, `IndexFileError` when one is not an index file."""
    with tempfile.TemporaryDirectory(prefix="lm-catalog-", dir=limits.spill_dir) as tmp:
        paths = []
        for i, name in enumerate(names):
            body, _etag = await store.get(name)
            path = Path(tmp, f"{i:08d}.parquet")
            await asyncio.to_thread(write_normalized, path, body, name)
            del body
            paths.append(str(path))
        yield tmp, paths


def connect(limits: MergeLimits, tmp: str) -> duckdb.DuckDBPyConnection:
    config: dict[str, str | bool | int | float | list[str]] = {
        "memory_limit": f"{limits.memory_limit_mb}MB",
        "temp_directory": os.path.join(tmp, "duckdb-spill"),
        "threads": limits.threads,
        "preserve_insertion_order": False,
    }
    return duckdb.connect(config=config)


def effective(names: Sequence[str], paths: Sequence[str]) -> list[str]:
    """The local copies whose rows count: a file that another listed file was merged
    from (its ``lightmetrics.compacted_from`` metadata) is contained in that file (which
    holds the newest row of each of its keys), so it is left out — the hour is read once,
    not once per level, while compaction's inputs wait for their deletion."""
    merged_from: set[str] = set()
    for path in paths:
        meta = pq.read_metadata(path).metadata or {}
        merged_from.update(n for n in meta.get(COMPACTED_FROM, b"").decode().split("\n") if n)
    return [path for name, path in zip(names, paths, strict=True) if name not in merged_from]


def one_merged_file(paths: Sequence[str]) -> bool:
    """Whether the copies whose rows count (`effective`) are one merged file: its keys
    are distinct (a merge writes one row per key and refuses an output holding a key
    twice, `index.catalog_merge`; merges before it kept a row per key by construction),
    so no key needs `NEWEST_PER_KEY`'s aggregate (`NO_KEY_TWICE`). A settled hour after
    its final compaction is such a file: the sealed hours' reads."""
    if len(paths) != 1:
        return False
    return COMPACTED_FROM in (pq.read_metadata(paths[0]).metadata or {})


def sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def sql_list(paths: Sequence[str]) -> str:
    return "[" + ", ".join(sql_string(p) for p in paths) + "]"


NEWEST_PER_KEY = """
CREATE TEMP TABLE newest AS
SELECT key, max(struct_pack(
    rank := {rank}, f := filename, r := file_row_number)) AS pick
FROM read_parquet({files}, filename = true, file_row_number = true)
GROUP BY key HAVING count(*) > 1
""".replace("{rank}", DUCKDB_RANK_STRUCT.format(p=""))
"""Keys held more than once — in more than one file (a superseding row, a row cataloged
twice, a merged file and its input not yet deleted) or twice in one file (two log rows of
one key in one chunk) — and the one row that counts for each: the highest rank
(`index.catalog_rank`: the copies' rank columns are filled, `write_normalized`); a tie is
one row held twice, and the copy and row number pick one. A narrow aggregate that spills.
Read the files with `ONE_ROW_PER_KEY`."""

NO_KEY_TWICE = NEWEST_PER_KEY.replace("GROUP BY key", "WHERE false GROUP BY key")
"""`NEWEST_PER_KEY`'s table, empty, for files whose keys are distinct (`one_merged_file`):
an hour of millions of keys is read without the aggregate over all of them (a settled
hour of 3.6M rows: 1.75x sooner, 286 MiB less; bench/RESULTS.md)."""

ONE_ROW_PER_KEY = """read_parquet({files}, filename = true, file_row_number = true) AS r
    LEFT JOIN newest AS n ON r.key = n.key
    WHERE (n.key IS NULL OR (r.filename = n.pick.f AND r.file_row_number = n.pick.r))"""
"""``FROM`` this (after `NEWEST_PER_KEY`) gives every key's one row as ``r``; more
conditions go after an ``AND``."""


def write_normalized(path: Path, body: bytes, name: str, *, ranges_may_lack: bool = False) -> None:
    """``body`` (the catalog file ``name``) at ``path`` with every `FILE_SCHEMA` column and
    every row's rank filled (`index.catalog_rank.with_rank`: a row first written in this
    file, or a file written before the rank columns, ranks as this file). Raises
    `IndexFileError` when it is not an index file.

    ``ranges_may_lack``: a ranked file written before ``raw_offset``/``raw_length``
    (`index.rows.RANGE_COLUMNS`, PROTOCOL §3.10) is kept as it is, its readers taking the
    columns as null (DuckDB's ``union_by_name``): the full audit copies the whole catalog,
    and a rewrite costs 2.5-4 s a million rows where the copy costs 0.3-0.4."""
    try:
        parquet = pq.ParquetFile(io.BytesIO(body))
        present = set(parquet.schema_arrow.names)
    except Exception as exc:
        raise IndexFileError(f"{name}: not an index file: {exc}") from None
    wanted = set(FILE_SCHEMA.names) - (RANGE_COLUMNS if ranges_may_lack else frozenset())
    if present >= wanted and _ranked(parquet):
        path.write_bytes(body)  # a merged file of this version: as it is
        return
    # A batch at a time (a merged hour of before the rank columns holds millions of rows),
    # with its key-value metadata: a merged file's inputs (`COMPACTED_FROM`) and level.
    schema = FILE_SCHEMA.with_metadata(parquet.schema_arrow.metadata)
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        position = 0
        for batch in iter_batches(body, source=name):
            table = with_rank(pa.Table.from_batches([batch]), name, first_position=position)
            writer.write_table(table.cast(FILE_SCHEMA).replace_schema_metadata(schema.metadata))
            position += batch.num_rows


def _ranked(parquet: pq.ParquetFile) -> bool:
    """Whether the footer's statistics show no null in any rank column."""
    meta = parquet.metadata
    names = parquet.schema_arrow.names
    for group in range(meta.num_row_groups):
        for name in RANK_COLUMNS:
            stats = meta.row_group(group).column(names.index(name)).statistics
            if stats is None or not stats.has_null_count or stats.null_count:
                return False
    return True
