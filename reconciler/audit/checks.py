"""The full audit's record join: each listed chunk against the catalog, and at the end the
cataloged keys the listing lacked (PROTOCOL §3.7, §3.9).

Per listed record (`RecordJoin.process`):
- **not cataloged**: read, and cataloged if well-formed (``source = "audit"``);
- **ETag differs** (both normalized: `reconciler.audit.catalog_keys.etag_hashes`) from the
  newest row's, or the key's rows **disagree** (cataloged in two hours, or with two
  different ``frame_sha256``): read, and the store's record written as a *superseding
  row* (``source = "audit"``) unless the newest row already is the store's record (ETag
  and fields equal: an old row of another hour stays in its hour, and only costs this
  read at each audit). A row without an ETag (written before the column) takes the
  listed ETag: it matches, nothing is written. Such rows were all written from the
  reconciler's own reads of immutable records, so rewriting them (one catalog file and
  one rollup work marker per hour of history) would attest nothing new; the two-hours
  and two-hashes checks apply to them all the same.
- **fields differed** (the store's ``frame_sha256``, ``accepted_frame_sha256`` or
  ``time_unix_ns`` is not the newest row's, or the rows disagreed): a ``catalog-mismatch``.
  It is an event (log ``catalog_mismatch`` and the ``lm_reconciler_catalog_mismatches``
  counter) *and* a problem record, written before the superseding row and removed once
  that row is written: PROTOCOL §3.5 rule 5 has the GC delete nothing while a
  catalog-mismatch exists, and the only time one exists is between finding it and
  writing its correction — which a crash or a failed write can stretch until the next
  audit writes it. The other fields of a row are functions of its key and of the frame
  its hash names, checked when it was cataloged (a well-formed row).

After the blob join (`RecordJoin.supersede_for_missing`): a referenced blob that does not
exist makes the audit read a record that references it; if the store's record names
another hash, its row is superseded the same way (a row with a wrong hash but the right
ETag, which the ETag comparison cannot see). A wrong hash that names a blob which exists
is not seen by the audit (the steady pass's read-backs and sample are what catch it; the
GC's targeted proof reads the manifest before deleting its blob).

At the end (`check_phantoms`), for a listing audit that walked everything in one run (a
resumed run does not know what the part before its resume showed, and an S3 Inventory
may lack recent objects): a cataloged key the listing never showed, whose newest row's
record time is older than the audit's start minus the settle margin
(`config.Settings.settle_margin_s`), that a HEAD does not find and that no operator
retracted (`reconciler.retractions`), is a ``phantom-row`` problem. Open phantom-row
problems whose key this audit listed (or that were retracted) are resolved.
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from index import catalog
from index.digests import KeyDigestSet, digests_from_arrow, digests_of, sha_prefixes
from index.rows import IndexRow
from protocol import keys
from reconciler.audit.catalog_keys import NO_SHA, etag_hashes, fields_hashes
from reconciler.audit.join import BlobJoin, CatalogScan
from reconciler.audit.walks import Listed
from reconciler.cataloger import CatalogBatch, Cataloger
from reconciler.context import ReconcilerContext
from reconciler.problems import ProblemBook
from reconciler.retractions import retracted_keys
from store.errors import NotFound

SOURCE = "audit"


@dataclass
class ChunkResult:
    batch: CatalogBatch
    """Rows to write: records cataloged now and superseding rows."""
    mismatches: list[str]
    """Keys whose catalog-mismatch problem the write of ``batch`` resolves."""
    superseded: int = 0


class RecordJoin:
    def __init__(
        self, ctx: ReconcilerContext, scan: CatalogScan, cataloger: Cataloger, problems: ProblemBook
    ) -> None:
        self._ctx = ctx
        self._scan = scan
        self._cataloger = cataloger
        self._problems = problems
        self.superseded = 0
        self.mismatches = 0
        self._written: set[str] = set()  # keys this audit superseded (few: mismatches)

    async def process(self, chunk: list[Listed]) -> ChunkResult:
        """Look ``chunk`` up; read what is missing or held otherwise (see module)."""
        record_keys = [key for key, _etag in chunk]
        known = self._scan.record_keys
        entries = known.lookup(digests_of(record_keys))
        known.mark_seen(entries)
        present = entries >= 0
        listed = etag_hashes([etag for _key, etag in chunk])
        suspect = present.copy()
        at = entries[present]
        suspect[present] = known.conflict[at] | known.etag_differs(at, listed[present])
        missing = [key for key, entry in zip(record_keys, entries, strict=True) if entry < 0]
        check = {
            key: int(entry)
            for key, entry, flagged in zip(record_keys, entries, suspect, strict=True)
            if flagged
        }
        batch = await self._cataloger.read([*missing, *check], source=SOURCE)
        if not check:
            return ChunkResult(batch, [])
        kept: list[IndexRow] = []
        mismatches: list[str] = []
        superseded = 0
        for row in batch.rows:
            entry = check.get(row.key)
            if entry is None:
                kept.append(row)
                continue
            fields = self._fields_differ(row, entry)
            if not fields and not self._etag_differs(row, entry):
                continue  # the newest row is the store's record already
            kept.append(row)
            superseded += 1
            self._written.add(row.key)  # the audit stops if its write fails
            if fields:
                mismatches.append(row.key)
                await self._mismatch(row, fields)
        batch.rows = kept
        return ChunkResult(batch, mismatches, superseded)

    def _fields_differ(self, row: IndexRow, entry: int) -> list[str]:
        """What differs between the store's record and the key's catalog rows."""
        known = self._scan.record_keys
        differs = []
        if row_fields_hash(row) != known.fields[entry]:
            differs.append("frame_sha256, accepted_frame_sha256 or time_unix_ns")
        if known.conflict[entry]:
            differs.append("rows in two hours or with two hashes")
        return differs

    def _etag_differs(self, row: IndexRow, entry: int) -> bool:
        return bool(etag_hashes([row.etag])[0] != self._scan.record_keys.etag[entry])

    async def _mismatch(self, row: IndexRow, fields: list[str]) -> None:
        self.mismatches += 1
        self._ctx.metrics.catalog_mismatches.inc()
        self._ctx.log.error("catalog_mismatch", key=row.key, source=SOURCE, fields=fields)
        await self._problems.record(
            "catalog-mismatch",
            row.key,
            f"the catalog's row differs from the store's record in {', '.join(fields)}; "
            f"the audit writes the store's record as a superseding row",
        )

    async def supersede_for_missing(self, joined: BlobJoin) -> ChunkResult:
        """After the blob join: a referenced blob that does not exist makes the audit read
        the record the join names as referencing it. If the store's record does not
        reference that blob, the catalog row was wrong (a log row with a wrong hash whose
        ETag was right, so the record join could not tell): the store's record is written
        as a superseding row (a ``catalog-mismatch``), the hash is no longer missing, and
        the blobs the record references are no orphans. Only the rows to write are
        returned; ``joined`` is updated in place."""
        if not joined.missing:
            return ChunkResult(CatalogBatch(), [])
        batch = await self._cataloger.read(sorted(set(joined.missing.values())), source=SOURCE)
        rows: list[IndexRow] = []
        for row in batch.rows:
            wrong = [s for s, key in joined.missing.items() if key == row.key]
            wrong = [sha for sha in wrong if sha not in row.referenced_shas]
            if not wrong:
                continue  # the record names that blob: it is missing indeed
            for sha in wrong:
                del joined.missing[sha]  # only a stale or wrong row references it
            if row.key in self._written or self._newest_is(row):
                continue  # an older row of the key, superseded already (compaction drops it)
            rows.append(row)
            await self._mismatch(row, [f"frame_sha256 (the catalog's {wrong[0]} has no blob)"])
        kept = {sha for row in rows for sha in row.referenced_shas}
        joined.orphans = [orphan for orphan in joined.orphans if orphan[0] not in kept]
        return ChunkResult(CatalogBatch(rows=rows), [row.key for row in rows], len(rows))

    def _newest_is(self, row: IndexRow) -> bool:
        """Whether the key's newest catalog row is ``row`` (the store's record) already."""
        [entry] = self._scan.record_keys.lookup(digests_of([row.key])).tolist()
        return entry >= 0 and not (
            self._fields_differ(row, entry) or self._etag_differs(row, entry)
        )

    async def written(self, result: ChunkResult) -> None:
        """``result``'s rows are written: the mismatches they correct are resolved."""
        self.superseded += result.superseded
        for key in result.mismatches:
            await self._problems.resolve("catalog-mismatch", key)


def row_fields_hash(row: IndexRow) -> np.uint64:
    """`fields_hashes` of one row (the store's record, read)."""
    accepted = row.accepted_frame_sha256
    hashes = fields_hashes(
        sha_prefixes([row.frame_sha256]),
        sha_prefixes([accepted]) if accepted else np.array([NO_SHA], dtype=np.uint64),
        np.array([row.time_unix_ns], dtype=np.int64),
    )
    return np.uint64(hashes[0])


async def check_phantoms(
    ctx: ReconcilerContext, scan: CatalogScan, problems: ProblemBook, *, started_ns: int
) -> int:
    """Record the phantom rows (see module), resolve the ones gone; returns how many."""
    limit_ns = started_ns - int(ctx.settings.settle_margin_s() * keys.NS_PER_S)
    candidates = scan.record_keys.unseen_before(limit_ns)
    phantoms: list[str] = []
    if len(candidates):
        retracted = await retracted_keys(ctx.store)
        for key in sorted(await _keys_of(ctx, candidates)):
            if key in retracted:
                continue
            try:
                await ctx.store.head(key)
            except NotFound:
                phantoms.append(key)
    for key in phantoms:
        await problems.record(
            "phantom-row",
            key,
            "cataloged, but the audit's listing lacked it and a HEAD found nothing; its "
            "record time is older than the audit's start minus the settle margin. The GC "
            "deletes nothing until a later audit lists it or it is retracted "
            "(lm-reconciler retract KEY --reason ...)",
        )
    open_now = set(phantoms)
    async for subject in problems.subjects("phantom-row"):
        if subject not in open_now:
            await problems.resolve("phantom-row", subject)
    if phantoms:
        ctx.log.error("phantom_rows", count=len(phantoms), first=phantoms[0])
    return len(phantoms)


async def _keys_of(ctx: ReconcilerContext, digests: npt.NDArray[np.void]) -> set[str]:
    """The keys behind ``digests``: the catalog's ``key`` column, read again (rare: only
    when the listing lacked a cataloged key)."""
    wanted = KeyDigestSet()
    wanted.add(digests)
    found: set[str] = set()
    async for info in catalog.list_all_files(ctx.store):
        try:
            body, _etag = await ctx.store.get(info.key)
            table = await asyncio.to_thread(
                pq.read_table, io.BytesIO(body), columns=["key", "key_digest"]
            )
        except (NotFound, pa.ArrowException, OSError, ValueError):
            continue  # compacted away (its merged file is listed too), or moved aside
        hits = wanted.contains(digests_from_arrow(table.column("key_digest")))
        found.update(table.filter(pa.array(hits)).column("key").to_pylist())
    return found
