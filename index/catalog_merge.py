"""Merging catalog files out of core (PROTOCOL §3.7 compaction, §3.9 "geometric").

`merge_files` merges some of an hour's catalog files into one: each input is fetched to a
local spill directory one at a time (never the hour in memory), and DuckDB — under a
memory limit, spilling to that directory — keeps the row that counts per key
(`index.catalog_rank`; every row keeps the rank of the file it was first written in, so a
merge never makes an old row newer than a superseding one), sorts by key and writes one
Parquet file whose key-value metadata names its inputs (``lightmetrics.compacted_from``;
transitively, so a reader finding an input's input gone knows where its rows are)
and its level (``lightmetrics.level``). The merged file is created with If-None-Match like
every catalog file, uploaded from the local file (`CatalogWriter.create_file`,
`ObjectStore.put_file`: never held in memory whole) and checked by a HEAD: the size and
the ETag the create answered (where the ETags disagree it is read back and hashed). The inputs are not deleted here: `index.catalog.delete_compacted_inputs` does
that after the readers' grace, by the names the merged file records.

An input written before a column existed is normalized first (`index.rows.read_table`
adds the column as nulls), so DuckDB always sees `FILE_SCHEMA`.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from pathlib import Path

import duckdb

from protocol import keys
from store.base import ObjectInfo, ObjectStore
from store.etag_check import normalized_etag

from .catalog import (
    COMPACTED_FROM,
    CatalogWriter,
    Compaction,
    file_sha256,
)
from .catalog_local import (
    NEWEST_PER_KEY,
    ONE_ROW_PER_KEY,
    MergeLimits,
    connect,
    counted_copies,
    sql_list,
    sql_string,
)
from .rows import FILE_SCHEMA, IndexFileError

LEVEL = b"lightmetrics.level"


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
    limits: MergeLimits = MergeLimits(),  # noqa: B008 - a frozen value
) -> Compaction:
    """Merge ``inputs`` (files of ``hour``) into one file of ``level``. Raises
    `IndexFileError` when an input is not a catalog file, `NotFound` when one is gone,
    the store's error when the create does not settle."""
    names = sorted(info.key for info in inputs)
    if len(names) < 2:
        raise ValueError("a merge needs at least two files")
    async with counted_copies(store, inputs, limits, fetch_all=True) as copies:
        tmp = copies.directory
        out = Path(tmp, "merged.parquet")
        # Transitively: the inputs' own inputs too (`index.catalog.compacted_from_names`);
        # an input another input was merged from is contained in it (not counted).
        metadata = {
            COMPACTED_FROM.decode(): "\n".join(sorted(copies.merged_from | set(names))),
            LEVEL.decode(): str(level),
        }
        counted = list(copies.counted.values())
        rows = await asyncio.to_thread(_merge, counted, out, metadata, limits, tmp)
        size = (await asyncio.to_thread(out.stat)).st_size
        merged, etag = await writer.create_file(hour, str(out), writer="compaction")
        # Read back without holding the file: the store attests what it holds by a HEAD
        # (its size, and the ETag its create answered). Only where those disagree (a store
        # whose ETags differ between PUT and HEAD, PROTOCOL §3.6, or a create whose answer
        # was lost) is the whole file read back and hashed.
        info = await store.head(merged)
        if info.size != size:
            raise IndexFileError(f"{merged}: the store holds {info.size} bytes, {size} were sent")
        if etag is None or normalized_etag(info.etag) != normalized_etag(etag):
            digest = await asyncio.to_thread(file_sha256, str(out))
            stored, _etag = await store.get(merged)
            if hashlib.sha256(stored).digest() != digest:
                raise IndexFileError(
                    f"{merged}: the merged file read back differs from what was sent"
                )
    return Compaction(merged, tuple(names), rows)


def _merge(
    paths: list[str], out: Path, metadata: dict[str, str], limits: MergeLimits, tmp: str
) -> int:
    qualified = ", ".join(f'r."{name}"' for name in FILE_SCHEMA.names)
    files = sql_list(paths)
    kv = "{" + ", ".join(f"{sql_string(k)}: {sql_string(v)}" for k, v in metadata.items()) + "}"
    try:
        with connect(limits, tmp) as con:
            con.execute(NEWEST_PER_KEY.format(files=files))
            con.execute(
                f"COPY (SELECT {qualified} FROM {ONE_ROW_PER_KEY.format(files=files)} "
                f"ORDER BY r.key) TO {sql_string(str(out))} "
                f"(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 16384, KV_METADATA {kv})"
            )
            counted = con.execute(
                f"SELECT count(*), count(DISTINCT key) FROM read_parquet({sql_string(str(out))})"
            ).fetchone()
    except duckdb.Error as exc:
        raise IndexFileError(f"merging catalog files failed: {exc}") from None
    assert counted is not None
    rows, distinct = counted
    if rows != distinct:
        raise IndexFileError(f"merged file has {rows} rows but {distinct} keys")
    return int(rows)
