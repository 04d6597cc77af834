"""The full audit's two joins, in memory-bounded form (PROTOCOL §3.7, §3.5).

1. **Records ↔ catalog**: `CatalogScan.load` reads every catalog file's ``key_digest``,
   ``etag``, ``frame_sha256``, ``accepted_frame_sha256`` and ``time_unix_ns`` columns into
   `reconciler.audit.catalog_keys.CatalogKeys` (per key: the newest row's ETag hash, hashes and
   time, and whether its rows disagree) and a `ShaPrefixSet` of referenced blob hashes
   (8 bytes a hash). The audit walk looks up each listed chunk
   (`reconciler.audit.checks`): keys the catalog lacks are read and cataloged; keys whose
   ETag differs or whose rows disagree are read and superseded; keys it never shows may
   be phantom rows.
2. **Blobs ↔ references**: `join_blobs` lists ``raw-blobs/v1/`` once; a blob whose hash the
   catalog does not reference and whose LastModified is older than the retry horizon (in
   store time) is an *orphan* (written to the audit's orphan file for the GC); the listed
   hashes form a `ShaPrefixSet`, and the referenced hashes it lacks are the candidates
   for ``missing-blob`` problems (confirmed by a HEAD: a blob created after the listing
   passed its key is not missing). With raw retention (`reconciler.gc.raw_retention`), the
   accepted rows of retired hours go to a set of their own, `CatalogScan.retired`: a blob
   only they reference is an orphan flagged ``raw_retention``, and is never missing.

Memory at 10M manifests: ~160 MB of key digests, ~80 MB of referenced prefixes, ~80 MB of
listed prefixes; orphans are held as they are found (normally few). The same joins run on
Spark beyond one machine: an S3 Inventory of the bucket (Parquet) and the catalog files
are two DataFrames; ``left_anti`` join on ``key`` gives the records to read, and
``left_anti`` of the inventory's raw-blob rows against the exploded referenced hashes
gives the orphans (see README "The index").

An unreadable catalog file is moved aside and reported (``unreadable-index-file``): its
rows then count as missing, so this audit catalogs its records again. A file that is
gone when read was compacted away after the listing; its rows are in the merged file,
which the same listing returned (compaction deletes inputs only after a grace far
longer than a listing-to-read).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from index import catalog
from index.digests import KeyDigestSet, ShaPrefixSet, digests_from_arrow, digests_of, sha_prefixes
from index.rows import IndexRow
from protocol import keys
from reconciler.audit.catalog_keys import NO_SHA, CatalogKeys, etag_hashes
from reconciler.audit.orphans import Orphan
from reconciler.context import ReconcilerContext
from reconciler.gc.raw_retention import NOTHING_RETIRED, Retired
from reconciler.problems import ProblemBook
from rollup.read.lost import acknowledged_shas
from store.base import ObjectStore
from store.errors import NotFound, StoreError

JOIN_COLUMNS = ["key_digest", "frame_sha256", "accepted_frame_sha256", "time_unix_ns"]
"""What the scan reads of a catalog file (with ``etag`` when the file has it): 16 bytes of
digest, the referenced hashes, the time and the ETag a row, never the key strings (the
listing side hashes its keys instead)."""
SHA_COLUMNS = ["frame_sha256", "accepted_frame_sha256"]
LIST_CHUNK = 5_000


@dataclass
class _RetiredHour:
    """A retired hour's accepted rows, gathered over its files (listed hour by hour)."""

    hour: keys.UtcHour
    digests: KeyDigestSet = field(default_factory=KeyDigestSet)
    prefixes: list[npt.NDArray[np.uint64]] = field(default_factory=list)
    moved_aside: bool = False


@dataclass
class CatalogScan:
    record_keys: CatalogKeys = field(default_factory=CatalogKeys)
    referenced: ShaPrefixSet = field(default_factory=ShaPrefixSet)
    retired: ShaPrefixSet = field(default_factory=ShaPrefixSet)
    """Blobs referenced by accepted rows of retired hours (`reconciler.gc.raw_retention`):
    they do not keep a blob alive, and a blob they alone reference is never missing."""
    retired_batches: int = 0
    files: int = 0
    rows: int = 0
    moved_aside: int = 0

    @classmethod
    async def load(
        cls, ctx: ReconcilerContext, problems: ProblemBook, retired: Retired = NOTHING_RETIRED
    ) -> CatalogScan:
        """``retired``: raw retention's retired hours (`reconciler.gc.raw_retention`); an
        accepted row of such an hour references its blob only as `retired` does."""
        scan = cls()
        pending: _RetiredHour | None = None
        async for info in catalog.list_all_files(ctx.store):
            hour = keys.parse_index_catalog_key(info.key)[0]
            if pending is not None and pending.hour != hour:
                await scan._settle(pending, retired, problems)
                pending = None
            if retired.covers(hour) and pending is None:
                pending = _RetiredHour(hour)
            try:
                body, _etag = await ctx.store.get(info.key)
            except NotFound:
                continue  # compacted away after the listing: the merged file holds its rows
            try:
                table = _join_columns(body, kind=pending is not None)
                digests = digests_from_arrow(table.column("key_digest"))
                if pending is not None:
                    accepted = pc.fill_null(pc.equal(table.column("kind"), "accepted"), False)
                    kept = table.filter(pc.invert(accepted))
                    retiring = table.filter(accepted)
                    pending.digests.add(digests_from_arrow(retiring.column("key_digest")))
                    pending.prefixes.append(sha_prefixes(retiring.column("frame_sha256")))
                else:
                    kept = table
                refs = [sha_prefixes(kept.column(name)) for name in SHA_COLUMNS]
            except (pa.ArrowException, OSError, KeyError, ValueError) as exc:
                await problems.record("unreadable-index-file", info.key, str(exc))
                await _move_aside(ctx, info.key)
                scan.moved_aside += 1
                if pending is not None:
                    pending.moved_aside = True
                continue
            _, epoch, sequence = keys.parse_index_catalog_key(info.key)
            scan.record_keys.add(
                digests,
                etags=etag_hashes(table.column("etag")),
                shas=_prefixes_or_none(table.column("frame_sha256")),
                accepted_shas=_prefixes_or_none(table.column("accepted_frame_sha256")),
                times=table.column("time_unix_ns").to_numpy(),
                epoch=epoch,
                sequence=sequence,
            )
            for prefixes in refs:
                scan.referenced.add(prefixes)
            scan.files += 1
            scan.rows += table.num_rows
        if pending is not None:
            await scan._settle(pending, retired, problems)
        scan.record_keys.finish()
        return scan

    async def _settle(self, hour: _RetiredHour, retired: Retired, problems: ProblemBook) -> None:
        """A retired hour, all files read: its accepted rows' blobs are `retired` only if
        the hour still holds (`Retired.holds`), else they stay referenced."""
        subject = keys.index_catalog_hour_prefix(hour.hour)
        prefixes = np.concatenate(hour.prefixes) if hour.prefixes else np.empty(0, np.uint64)
        batches = len(hour.digests)
        if not hour.moved_aside and retired.holds(hour.hour, batches):
            self.retired.add(prefixes)
            self.retired_batches += batches
            await problems.resolve("raw-retention-mismatch", subject)
            return
        self.referenced.add(prefixes)
        ledger = retired.ledger.get(hour.hour.iso)
        await problems.record(
            "raw-retention-mismatch",
            subject,
            f"accepted hour {hour.hour.iso} is retired, but its catalog holds {batches} "
            f"accepted batches and the rollup ledger {ledger.batches if ledger else 0}"
            f"{' (a catalog file was moved aside)' if hour.moved_aside else ''}: its raw "
            f"blobs are kept until they agree",
        )

    def missing(self, record_keys: list[str]) -> list[str]:
        """The keys of ``record_keys`` the catalog does not hold."""
        entries = self.record_keys.lookup(digests_of(record_keys))
        return [key for key, entry in zip(record_keys, entries, strict=True) if entry < 0]

    def references(self, sha: str) -> bool:
        """Whether a catalog row references the blob ``sha`` (by its 64-bit prefix: a false
        match only ever keeps a blob, see `index.digests`)."""
        return bool(self.referenced.contains(sha_prefixes([sha]))[0])

    def cataloged(self, rows: list[IndexRow]) -> None:
        """Rows this audit cataloged count as references for the blob join."""
        for row in rows:
            self.referenced.add(sha_prefixes(list(row.referenced_shas)))


def _join_columns(body: bytes, *, kind: bool) -> pa.Table:
    """The join's columns of one catalog file; ``etag`` null in a file written before it
    existed (such rows take the listed ETag, PROTOCOL §3.7)."""
    parquet = pq.ParquetFile(io.BytesIO(body))
    present = set(parquet.schema_arrow.names)
    columns = [*JOIN_COLUMNS, "kind"] if kind else list(JOIN_COLUMNS)
    if "etag" in present:
        columns.append("etag")
    table = parquet.read(columns=columns)
    if "etag" not in present:
        table = table.append_column("etag", pa.nulls(table.num_rows, pa.string()))
    return table


def _prefixes_or_none(column: pa.ChunkedArray) -> npt.NDArray[np.uint64]:
    """`sha_prefixes` of a column with nulls kept in place (as `NO_SHA`)."""
    out = np.full(len(column), NO_SHA, dtype=np.uint64)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    if valid.any():
        out[valid] = sha_prefixes(column)
    return out


async def _move_aside(ctx: ReconcilerContext, key: str) -> None:
    await ctx.check_fence()
    try:
        aside = await catalog.move_aside(ctx.store, key)
        ctx.log.error("catalog_file_moved_aside", key=key, to=aside)
    except StoreError as exc:
        ctx.log.warning("catalog_move_aside_failed", key=key, error=str(exc))
        raise


@dataclass
class BlobJoin:
    listed: int = 0
    orphans: list[Orphan] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    """Referenced hashes whose blob neither the listing nor a HEAD found, each with the key
    of a record that references it."""


async def join_blobs(ctx: ReconcilerContext, scan: CatalogScan, *, store_now_ns: int) -> BlobJoin:
    """List ``raw-blobs/v1/`` and join it with the references. Raises `StoreError`.

    Memory: one flag per referenced hash (which ones the listing showed), not a set of the
    listed ones; the listing streams past page by page."""
    horizon_ns = store_now_ns - int(ctx.settings.gc.retry_horizon_s * 1e9)
    result = BlobJoin()
    referenced = scan.referenced
    seen = np.zeros(len(referenced), dtype=bool)
    page: list[tuple[str, int, int]] = []

    def take(page: list[tuple[str, int, int]]) -> None:
        at = referenced.find(sha_prefixes([sha for sha, _size, _lm in page]))
        seen[at[at >= 0]] = True
        unreferenced = [entry for entry, position in zip(page, at, strict=True) if position < 0]
        if not unreferenced:
            return
        by_retention = scan.retired.contains(sha_prefixes([sha for sha, _s, _m in unreferenced]))
        for (sha, size, modified), retired in zip(unreferenced, by_retention, strict=True):
            if modified < horizon_ns:
                result.orphans.append((sha, size, modified, bool(retired)))

    async for info in ctx.store.list(keys.RAW_BLOBS_PREFIX):
        try:
            sha = keys.parse_raw_blob_key(info.key)
        except keys.KeyFormatError:
            continue
        page.append((sha, info.size, info.last_modified_ns))
        result.listed += 1
        if len(page) >= LIST_CHUNK:
            take(page)
            page = []
    if page:
        take(page)
    absent = referenced.values[~seen]
    # A hash a retired hour's accepted row also references (a quarantine row of a re-send
    # that conflicted with a retired batch) may be gone by raw retention: not missing.
    absent = absent[~scan.retired.contains(absent)]
    if len(absent):
        result.missing = await _confirm_missing(ctx, absent)
    return result


async def _confirm_missing(
    ctx: ReconcilerContext, absent: npt.NDArray[np.generic]
) -> dict[str, str]:
    """The full hashes behind referenced prefixes the listing lacked, HEADed: only those
    still absent are missing, each with a record referencing it (rare: this re-reads the
    catalog's key and hash columns, vectorized, keeping only rows whose prefix is wanted)."""
    wanted = np.asarray(absent, dtype=np.uint64)
    referenced_by: dict[str, str] = {}
    async for info in catalog.list_all_files(ctx.store):
        try:
            body, _etag = await ctx.store.get(info.key)
            table = pq.read_table(io.BytesIO(body), columns=["key", *SHA_COLUMNS])
            for name in SHA_COLUMNS:
                rows = table.filter(pc.is_valid(table.column(name)))
                hits = np.flatnonzero(np.isin(sha_prefixes(rows.column(name)), wanted))
                found = rows.take(pa.array(hits, pa.int64()))
                for sha, key in zip(found[name].to_pylist(), found["key"].to_pylist(), strict=True):
                    referenced_by.setdefault(sha, key)
        except (NotFound, pa.ArrowException, OSError, ValueError):
            continue  # compacted away, or unreadable (the scan moved it aside)
    missing = {}
    for sha, record_key in sorted(referenced_by.items()):
        try:
            await ctx.store.head(keys.raw_blob_key(sha))
        except NotFound:
            missing[sha] = record_key
    return missing


async def record_missing_blobs(
    store: ObjectStore, problems: ProblemBook, missing: dict[str, str]
) -> int:
    """Record a ``missing-blob`` problem per hash of ``missing`` (with a record that
    references it), except those an operator acknowledged as lost (`rollup.lifecycle.lost`:
    settled); resolve the open ones no longer missing. Returns how many."""
    if missing:
        for sha in await acknowledged_shas(store) & set(missing):
            del missing[sha]
    for sha, record_key in sorted(missing.items()):
        await problems.record(
            "missing-blob",
            keys.raw_blob_key(sha),
            f"raw blob does not exist; referenced by {record_key}",
        )
    async for subject in problems.subjects("missing-blob"):
        if keys.parse_raw_blob_key(subject) not in missing:
            await problems.resolve("missing-blob", subject)
    return len(missing)
