"""Catalog files as local copies for DuckDB (PROTOCOL §3.9: out of core, memory bounded).

`counted_copies` fetches the catalog files whose rows count from the store one at a
time into a private temporary directory (``MergeLimits.spill_dir``; nothing of an hour is
held in memory but one file's body at a time), leaving out the files a merged file holds,
and normalizing a file written before a column existed
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

from store.base import ObjectInfo, ObjectStore

from .catalog import COMPACTED_FROM, compacted_from_names
from .catalog_rank import RANK_COLUMNS, duckdb_write_rank, with_rank
from .rows import FILE_SCHEMA, RANGE_COLUMNS, IndexFileError, iter_batches

DEFAULT_MEMORY_LIMIT_MB = 256


@dataclass(frozen=True, slots=True)
class MergeLimits:
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB
    spill_dir: str | None = None
    """Where copies and DuckDB's spill files go (None: the system's temporary directory)."""
    threads: int = 1


@dataclass(frozen=True, slots=True)
class Copies:
    """Local copies of catalog files (`counted_copies`)."""

    directory: str
    counted: dict[str, str]
    """Store key -> local copy, of each file whose rows count (in the files' order)."""
    merged_from: frozenset[str]
    """Every name the fetched files' merge metadata gives (their inputs, transitively)."""
    merged: frozenset[str]
    """The fetched files a merge wrote (their ``lightmetrics.compacted_from`` metadata)."""

    @property
    def one_merged_file(self) -> bool:
        """Whether the copies whose rows count are one merged file: its keys are distinct
        (a merge writes one row per key and refuses an output holding a key twice,
        `index.catalog_merge`; merges before it kept a row per key by construction), so no
        key needs `NEWEST_PER_KEY`'s aggregate (`NO_KEY_TWICE`). A settled hour after its
        final compaction is such a file: the sealed hours' reads."""
        return len(self.counted) == 1 and not self.counted.keys() - self.merged


@contextlib.asynccontextmanager
async def counted_copies(
    store: ObjectStore, files: Sequence[ObjectInfo], limits: MergeLimits, *, fetch_all: bool = False
) -> AsyncIterator[Copies]:
    """`Copies` of ``files``, each with every `FILE_SCHEMA` column; the directory goes away
    on exit. Raises `NotFound` when a file is gone, `IndexFileError` when one is not an
    index file.

    A file that a merged file names (its ``lightmetrics.compacted_from`` metadata: its
    inputs and, transitively, theirs) holds no row the merged file lacks: the merge kept
    the row that counts of each of its keys, rank included (PROTOCOL §3.7). So such a file
    is not fetched once its merged file has been. The files are fetched newest first (a
    catalog name sorts in creation order, `protocol.keys.catalog_created_key`, and a merge
    is written after its inputs), so an hour read while compaction's inputs wait out the
    readers' grace costs one GET of its merged file, not one of every level. A file
    fetched before the merged file that names it is left out all the same: the order
    saves work, it decides nothing. ``fetch_all``: fetch every file all the same (a merge
    names its inputs' inputs too, and a merged file written before those names were
    transitive lacks them)."""
    with tempfile.TemporaryDirectory(prefix="lm-catalog-", dir=limits.spill_dir) as tmp:
        fetched: dict[str, str] = {}
        merged_from: set[str] = set()
        merged: set[str] = set()
        newest_first = sorted(files, key=lambda info: info.key, reverse=True)
        for i, info in enumerate(newest_first):
            if info.key in merged_from and not fetch_all:
                continue
            body, _etag = await store.get(info.key)
            path = Path(tmp, f"{i:08d}.parquet")
            metadata = await asyncio.to_thread(write_normalized, path, body, info.key)
            del body
            fetched[info.key] = str(path)
            if COMPACTED_FROM in metadata:
                merged.add(info.key)
                merged_from.update(compacted_from_names(metadata))
        counted = {
            info.key: fetched[info.key]
            for info in files
            if info.key in fetched and info.key not in merged_from
        }
        yield Copies(tmp, counted, frozenset(merged_from), frozenset(merged))


def connect(limits: MergeLimits, tmp: str) -> duckdb.DuckDBPyConnection:
    config: dict[str, str | bool | int | float | list[str]] = {
        "memory_limit": f"{limits.memory_limit_mb}MB",
        "temp_directory": os.path.join(tmp, "duckdb-spill"),
        "threads": limits.threads,
        "preserve_insertion_order": False,
    }
    return duckdb.connect(config=config)


def sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def sql_list(paths: Sequence[str]) -> str:
    return "[" + ", ".join(sql_string(p) for p in paths) + "]"


def row_id(prefix: str = "") -> str:
    """A row of a ``read_parquet`` list as one ``BIGINT``: its file's index in the list and
    its row number there (``prefix``: the table alias and a dot; read the files with
    ``file_row_number = true``)."""
    return f"(({prefix}file_index::BIGINT << 32) | {prefix}file_row_number)"


NEWEST_PER_KEY = """
CREATE TEMP TABLE newest AS
SELECT key, arg_max({row}, {rank}) AS pick
FROM read_parquet({files}, file_row_number = true)
GROUP BY key HAVING count(*) > 1
""".replace("{rank}", duckdb_write_rank()).replace("{row}", row_id())
"""Keys held more than once — in more than one file (a superseding row, a row cataloged
twice, a merged file and its input not yet deleted) or twice in one file (two log rows of
one key in one chunk) — and the one row that counts for each (`row_id`): the highest rank
(`index.catalog_rank`: the copies' rank columns are filled, `write_normalized`); a tie is
one row held twice (the same content), and either copy counts. Read the files with
`ONE_ROW_PER_KEY`. Every aggregate state is fixed-size (a ``BIGINT`` picked by a
``HUGEINT``), so the aggregate spills within DuckDB's memory limit: a ``max`` over a
struct holding the file's name did not (an hour of 3.6M keys in 360 files at the 256 MB
limit: 406 MiB above the imports against 826 MiB, 1.32x sooner; bench/RESULTS.md)."""

NO_KEY_TWICE = NEWEST_PER_KEY.replace("GROUP BY key", "WHERE false GROUP BY key")
"""`NEWEST_PER_KEY`'s table, empty, for files whose keys are distinct
(`Copies.one_merged_file`): an hour of millions of keys is read without the aggregate over
all of them (a settled hour of 3.6M rows: 1.14x sooner; bench/RESULTS.md)."""

ONE_ROW_PER_KEY = """read_parquet({files}, filename = true, file_row_number = true) AS r
    LEFT JOIN newest AS n ON r.key = n.key
    WHERE (n.key IS NULL OR {row} = n.pick)""".replace("{row}", row_id("r."))
"""``FROM`` this (after `NEWEST_PER_KEY`) gives every key's one row as ``r``; more
conditions go after an ``AND``."""


def write_normalized(
    path: Path, body: bytes, name: str, *, ranges_may_lack: bool = False
) -> dict[bytes, bytes]:
    """``body`` (the catalog file ``name``) at ``path`` with every `FILE_SCHEMA` column and
    every row's rank filled (`index.catalog_rank.with_rank`: a row first written in this
    file, or a file written before the rank columns, ranks as this file); returns the
    file's key-value metadata (a merged file's `COMPACTED_FROM` and level; the copy keeps
    them). Raises `IndexFileError` when it is not an index file.

    ``ranges_may_lack``: a ranked file written before ``raw_offset``/``raw_length``
    (`index.rows.RANGE_COLUMNS`, PROTOCOL §3.10) is kept as it is, its readers taking the
    columns as null (DuckDB's ``union_by_name``): the full audit copies the whole catalog,
    and a rewrite costs 2.5-4 s a million rows where the copy costs 0.3-0.4."""
    try:
        parquet = pq.ParquetFile(io.BytesIO(body))
        present = set(parquet.schema_arrow.names)
    except Exception as exc:
        raise IndexFileError(f"{name}: not an index file: {exc}") from None
    metadata = parquet.metadata.metadata or {}
    wanted = set(FILE_SCHEMA.names) - (RANGE_COLUMNS if ranges_may_lack else frozenset())
    if present >= wanted and _ranked(parquet):
        path.write_bytes(body)  # a merged file of this version: as it is
        return metadata
    # A batch at a time (a merged hour of before the rank columns holds millions of rows),
    # with its key-value metadata: a merged file's inputs (`COMPACTED_FROM`) and level.
    schema = FILE_SCHEMA.with_metadata(parquet.schema_arrow.metadata)
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        position = 0
        for batch in iter_batches(body, source=name):
            table = with_rank(pa.Table.from_batches([batch]), name, first_position=position)
            writer.write_table(table.cast(FILE_SCHEMA).replace_schema_metadata(schema.metadata))
            position += batch.num_rows
    return metadata


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
