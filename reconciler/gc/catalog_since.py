"""Rule 2 of PROTOCOL §3.5, its second half: no row of a catalog file created since the
rule-5 audit started references a candidate.

The audit's orphan file covers the catalog as it was when the audit started (the audit
joined all of it); the files created since are named by the ``index/v1/catalog-created/``
entries from the position the audit recorded at its start
(`records.AuditRecord.catalog_created_from`, `index.catalog.CatalogWriter.position`).
Those entries are the GC's only catalog read, so a run's cost does not grow with history
(it grows with the catalog files of one audit interval, and only a run with candidates
reads them).

Each entry's file is read for its ``kind`` and two hash columns (Arrow, never one Python
object per row). For a blob raw retention nominates, rule 2 is replaced (PROTOCOL §4.1):
only quarantine rows count against it (accepted rows of retired hours are what let it go;
rule 7's variant checks its manifest against the rollup ledger). Newest first: a compacted file names its inputs (`index.catalog.COMPACTED_FROM`),
and an input whose merged file was read need not be read (compaction deletes inputs by
those names after a grace, so finding one gone is expected). Any other file that is gone,
an entry that is gone or unreadable, or a file that does not decode makes the whole read
untrusted: the run deletes nothing (PROTOCOL §3.7: nobody treats an unreadable or
vanished catalog file as "no rows").

`trim_entries` deletes the entries before a position: once no audit's GC read needs them
(`reconciler.gc.collector`: before the rule-5 audit's position, which is the latest
completed audit's).
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from index.catalog import COMPACTED_FROM
from protocol import keys, records
from store.base import ObjectStore
from store.errors import NotFound

HASH_COLUMNS = ["frame_sha256", "accepted_frame_sha256"]
KIND_COLUMN = "kind"


@dataclass
class CatalogSince:
    referenced: set[str] = field(default_factory=set)
    """The candidates some row of those files references."""
    files_read: int = 0
    entries: int = 0
    untrusted: str | None = None
    """Why the read proves nothing (then no candidate may be deleted), or None."""


def _position_key(position: str) -> str:
    return f"{keys.INDEX_CATALOG_CREATED_PREFIX}{position}"


async def entries_since(store: ObjectStore, position: str) -> list[str]:
    """The ``index/v1/catalog-created/`` entry keys from ``position`` on, in order."""
    first = _position_key(position)
    return [
        info.key
        # Names are fixed-width: after ``first`` minus its last digit comes ``first``,
        # preceded only by its up to nine neighbours below (filtered out).
        async for info in store.list(keys.INDEX_CATALOG_CREATED_PREFIX, start_after=first[:-1])
        if info.key >= first
    ]


async def references_since(
    store: ObjectStore,
    position: str,
    candidates: set[str],
    *,
    by_retention: frozenset[str] = frozenset(),
    chunk: int = 8,
) -> CatalogSince:
    """Which ``candidates`` the catalog files created from ``position`` on reference (of
    ``by_retention``, the blobs raw retention nominates: which a quarantine row does)."""
    result = CatalogSince()
    entry_keys = await entries_since(store, position)
    result.entries = len(entry_keys)
    if not candidates or not entry_keys:
        return result
    wanted = pa.array(sorted(candidates - by_retention), pa.string())
    retained = pa.array(sorted(candidates & by_retention), pa.string())
    covered: set[str] = set()  # catalog keys a merged file we read holds the rows of
    entry_keys.reverse()  # newest first: merged files come before their inputs
    for start in range(0, len(entry_keys), chunk):
        outcomes = await asyncio.gather(
            *(
                _read_entry(store, key, wanted, retained, covered)
                for key in entry_keys[start : start + chunk]
            )
        )
        for outcome in outcomes:
            if isinstance(outcome, str):
                result.untrusted = outcome
                return result
            if outcome is None:
                continue  # a compacted input whose merged file was read
            hits, inputs = outcome
            result.referenced |= hits
            covered |= inputs
            result.files_read += 1
    return result


async def _read_entry(
    store: ObjectStore, entry_key: str, wanted: pa.Array, retained: pa.Array, covered: set[str]
) -> tuple[set[str], set[str]] | str | None:
    """(referenced candidates, inputs it compacted) of the entry's file; None when its
    rows are in a merged file already read; a string saying why it cannot be trusted."""
    try:
        body, _etag = await store.get(entry_key)
        catalog_key = records.CatalogCreated.from_json(body).catalog_key
        keys.parse_index_catalog_key(catalog_key)
    except NotFound:
        return f"catalog-created entry {entry_key} vanished"
    except (records.RecordError, keys.KeyFormatError) as exc:
        return f"catalog-created entry {entry_key} is unreadable: {exc}"
    if catalog_key in covered:
        return None
    try:
        body, _etag = await store.get(catalog_key)
    except NotFound:
        if catalog_key in covered:
            return None
        return f"catalog file {catalog_key} vanished and no merged file read names it"
    try:
        parquet = pq.ParquetFile(io.BytesIO(body))
        metadata = parquet.schema_arrow.metadata or {}
        names = metadata.get(COMPACTED_FROM, b"").decode()
        present = [name for name in HASH_COLUMNS if name in parquet.schema_arrow.names]
        table = parquet.read(columns=[KIND_COLUMN, *present])
    except (pa.ArrowException, OSError, ValueError, KeyError) as exc:
        return f"catalog file {catalog_key} is unreadable: {exc}"
    hits: set[str] = set()
    quarantine = pc.equal(table.column(KIND_COLUMN), "quarantine")
    for name in present:
        column = table.column(name)
        for value_set, rows in ((wanted, None), (retained, quarantine)):
            if len(value_set) == 0:
                continue
            mask = pc.fill_null(pc.is_in(column, value_set=value_set), False)
            if rows is not None:
                mask = pc.and_(mask, pc.fill_null(rows, False))
            hits.update(value for value in pc.filter(column, mask).to_pylist() if value)
    return hits, {name for name in names.split("\n") if name}


async def trim_entries(store: ObjectStore, before_position: str) -> int:
    """Delete the catalog-created entries before ``before_position``; how many."""
    bound = _position_key(before_position)
    doomed = [
        info.key async for info in store.list(keys.INDEX_CATALOG_CREATED_PREFIX) if info.key < bound
    ]
    for key in doomed:
        await store.delete(key)
    return len(doomed)
