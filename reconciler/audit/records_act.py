"""Acting on the record join's results (``records.parquet``, `reconciler.audit.engines.sql.RECORD_JOIN`),
in bounded batches (PROTOCOL §3.7, §3.9).

Per listed record the join names (``reason``):
- ``missing`` (not cataloged) and ``junk`` (a key not well-formed, never cataloged): read,
  and cataloged if well-formed (``source = "audit"``; a junk key becomes the cataloger's
  ``unparseable-*`` problem);
- ``etag`` (the newest row's normalized ETag differs from the listed one) and ``conflict``
  (the key's rows are in two hours or have two different ``frame_sha256``, raw keys or
  ranges, PROTOCOL §3.7): read, and the
  store's record written as a *superseding row* unless the newest row already is the
  store's record (ETag and fields equal: an old row of another hour stays in its hour, and
  only costs this read at each audit). A row without an ETag takes the listed one (the
  join does not flag it); the two-hours and two-hashes checks apply to it all the same.
- ``rank`` (the first audit after the rank columns came, `index.catalog_rank`: the key
  has rows of more than one rank, and a merge of before may have made a stale row
  outrank a superseding one): read, and checked as ``etag`` is — a superseding row
  (a ``catalog-mismatch`` when the fields differed) unless the row that counts already is
  the store's record.
- **fields differed** (the store's ``frame_sha256``, ``accepted_frame_sha256``,
  ``time_unix_ns``, raw key or range is not the newest row's, or the rows disagreed): a
  ``catalog-mismatch``.
  It is an event (log ``catalog_mismatch`` and the ``lm_reconciler_catalog_mismatches``
  counter) *and* a problem record, written before the superseding row and resolved once
  that row is written: PROTOCOL §3.5 rule 5 has the GC delete nothing while a
  catalog-mismatch exists, and the only time one exists is between finding it and
  writing its correction — which a crash or a failed write can stretch until the next
  audit writes it. The other fields of a row are functions of its key and of the frame
  its hash names, checked when it was cataloged (a well-formed row).
- ``phantom`` (cataloged, never listed, newest row's hour ended before the audit's start
  minus the settle margin): for a listing audit (an S3 Inventory may lack recent
  objects), a candidate that a HEAD does not find and that no operator retracted
  (`reconciler.retractions`) is a ``phantom-row`` problem; open phantom-row problems that
  are no longer candidates are resolved (`finish_phantoms`). A resumed audit checks
  phantoms too: its listing parts, kept in the store, cover every range (the part before
  the crash included). A candidate an operator retracted (`reconciler.retractions`) is
  no phantom: the audit writes its ``retracted`` rows (`retraction_rows`: a copy of the
  row that counts in every hour where the key has a row, PROTOCOL §3.7), so the key
  counts as absent everywhere from then on — and is no candidate again.

Every row written is also appended to a local Parquet file (`ADDED_SCHEMA`, one per
batch) for the blob join: it references its blobs as catalog rows do.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from index.catalog_tables import read_key_rows
from index.rows import IndexRow, rows_of
from protocol import keys
from reconciler.audit.engines.duckdb_joins import ADDED_SCHEMA
from reconciler.audit.engines.engine import EngineJoins
from reconciler.cataloger import CatalogBatch, Cataloger
from reconciler.context import ReconcilerContext
from reconciler.problems import ProblemBook
from reconciler.retractions import retracted_keys
from store.errors import NotFound
from store.etag_check import normalized_etag

SOURCE = "audit"
CHUNK = 32
"""Records acted on at once (read concurrently, then written as one commit)."""


@dataclass(frozen=True, slots=True)
class Newest:
    """What the record join says of a key's newest catalog row."""

    etag: str | None
    frame_sha256: str | None
    accepted_frame_sha256: str | None
    time_unix_ns: int | None
    conflict: bool
    raw: tuple[str | None, int | None, int | None] = (None, None, None)
    """``raw_blob_key``, ``raw_offset``, ``raw_length`` (PROTOCOL §3.10)."""


@dataclass
class ChunkResult:
    batch: CatalogBatch
    """Rows to write: records cataloged now and superseding rows."""
    mismatches: list[str]
    """Keys whose catalog-mismatch problem the write of ``batch`` resolves."""
    seen: dict[str, int] = field(default_factory=dict)
    """Listed records checked, per kind (``accepted``/``quarantine``), gone ones excluded."""


class RecordActs:
    def __init__(
        self,
        ctx: ReconcilerContext,
        cataloger: Cataloger,
        problems: ProblemBook,
        added_dir: str,
    ) -> None:
        self._ctx = ctx
        self._cataloger = cataloger
        self._problems = problems
        self._added_dir = added_dir
        os.makedirs(added_dir, exist_ok=True)
        self.added: list[str] = []
        """Local Parquet files of the rows written (`ADDED_SCHEMA`)."""
        self.written: set[str] = set()
        """Keys this audit superseded (few: mismatches)."""
        self.superseded = 0
        self.mismatches = 0
        self.phantom_candidates: list[str] = []
        self.retracted_candidates: list[str] = []
        """Phantom candidates an operator retracted: their ``retracted`` rows are due."""

    async def process(self, chunk: list[dict[str, object]]) -> ChunkResult:
        """Read what ``chunk`` (rows of ``records.parquet``) names; the rows to write."""
        check: dict[str, Newest] = {}
        read: list[str] = []
        listed: dict[str, str] = {}
        for entry in chunk:
            key = str(entry["key"])
            if entry["reason"] == "phantom":
                self.phantom_candidates.append(key)
                continue
            listed[key] = str(entry["kind"])
            read.append(key)
            if entry["reason"] in ("etag", "conflict", "rank"):
                check[key] = Newest(
                    _opt(entry["etag"]),
                    _opt(entry["frame_sha256"]),
                    _opt(entry["accepted_frame_sha256"]),
                    _opt_int(entry["time_unix_ns"]),
                    bool(entry["conflict"]),
                    (
                        _opt(entry["raw_blob_key"]),
                        _opt_int(entry["raw_offset"]),
                        _opt_int(entry["raw_length"]),
                    ),
                )
        batch = CatalogBatch()
        seen: dict[str, int] = {}
        for kind in ("accepted", "quarantine"):
            of_kind = [key for key in read if listed[key] == kind]
            if of_kind:
                part = await self._cataloger.read(of_kind, source=SOURCE)
                seen[kind] = len(of_kind) - part.missing
                batch.add(part)
        kept: list[IndexRow] = []
        mismatches: list[str] = []
        for row in batch.rows:
            newest = check.get(row.key)
            if newest is None:
                kept.append(row)
                continue
            fields = fields_differ(row, newest)
            if not fields and not etag_differs(row, newest):
                continue  # the newest row is the store's record already
            kept.append(row)
            self.superseded += 1
            self.written.add(row.key)  # the audit stops if its write fails
            if fields:
                mismatches.append(row.key)
                await self.mismatch(row, fields)
        batch.rows = kept
        return ChunkResult(batch, mismatches, seen)

    async def mismatch(self, row: IndexRow, fields: list[str]) -> None:
        self.mismatches += 1
        self._ctx.metrics.catalog_mismatches.inc()
        self._ctx.log.error("catalog_mismatch", key=row.key, source=SOURCE, fields=fields)
        await self._problems.record(
            "catalog-mismatch",
            row.key,
            f"the catalog's row differs from the store's record in {', '.join(fields)}; "
            f"the audit writes the store's record as a superseding row",
        )

    async def written_ok(self, result: ChunkResult) -> None:
        """``result``'s rows are written: keep them for the blob join, resolve the
        mismatches they correct."""
        rows = result.batch.rows
        if rows:
            path = os.path.join(self._added_dir, f"{len(self.added):08d}.parquet")
            table = pa.Table.from_pydict(
                {name: [getattr(row, name) for row in rows] for name in ADDED_SCHEMA.names},
                schema=ADDED_SCHEMA,
            )
            pq.write_table(table, path)
            self.added.append(path)
        for key in result.mismatches:
            await self._problems.resolve("catalog-mismatch", key)

    async def finish_phantoms(self) -> int:
        """Record the phantom rows among the candidates (see module), resolve the open
        ones that are not; returns how many. Raises `StoreError`."""
        phantoms: list[str] = []
        if self.phantom_candidates:
            retracted = await retracted_keys(self._ctx.store)
            for key in sorted(set(self.phantom_candidates)):
                if key in retracted:
                    self.retracted_candidates.append(key)
                    continue
                try:
                    await self._ctx.store.head(key)
                except NotFound:
                    phantoms.append(key)
        for key in phantoms:
            await self._problems.record(
                "phantom-row",
                key,
                "cataloged, but the audit's listing lacked it and a HEAD found nothing; its "
                "record time is older than the audit's start minus the settle margin. The GC "
                "deletes nothing until a later audit lists it or it is retracted "
                "(lm-reconciler retract KEY --reason ...)",
            )
        open_now = set(phantoms)
        async for subject in self._problems.subjects("phantom-row"):
            if subject not in open_now:
                await self._problems.resolve("phantom-row", subject)
        if phantoms:
            self._ctx.log.error("phantom_rows", count=len(phantoms), first=phantoms[0])
        return len(phantoms)


def fields_differ(row: IndexRow, newest: Newest) -> list[str]:
    """What differs between the store's record (``row``) and the key's catalog rows."""
    differs = []
    if (
        row.frame_sha256 != newest.frame_sha256
        or row.accepted_frame_sha256 != newest.accepted_frame_sha256
        or row.time_unix_ns != newest.time_unix_ns
    ):
        differs.append("frame_sha256, accepted_frame_sha256 or time_unix_ns")
    if (row.raw_blob_key, row.raw_offset, row.raw_length) != newest.raw:
        differs.append("raw_blob_key, raw_offset or raw_length")
    if newest.conflict:
        differs.append("rows in two hours or with two hashes, raw keys or ranges")
    return differs


def etag_differs(row: IndexRow, newest: Newest) -> bool:
    """Whether the store's ETag (normalized) differs from the newest row's; a row without
    one takes the store's."""
    return newest.etag is not None and normalized_etag(row.etag) != newest.etag


def _opt(value: object) -> str | None:
    return None if value is None else str(value)


def _opt_int(value: object) -> int | None:
    return None if value is None else int(str(value))


async def retraction_rows(
    ctx: ReconcilerContext, joins: EngineJoins, retracted: list[str]
) -> list[IndexRow]:
    """The ``retracted`` rows of the keys ``retracted`` (few: each an operator's act): in
    every hour whose catalog holds a row of the key, a copy of the row that counts there
    (PROTOCOL §3.7), first written now, so it outranks every row of the key before it."""
    by_hour: dict[int, list[str]] = {}
    for key, hours in joins.key_hours(sorted(set(retracted))).items():
        for hour_ns in hours:
            by_hour.setdefault(hour_ns, []).append(key)
    rows: list[IndexRow] = []
    for hour_ns, hour_keys in sorted(by_hour.items()):
        table = await read_key_rows(ctx.store, keys.UtcHour.from_unix_ns(hour_ns), hour_keys)
        for row in rows_of(table):
            if row.kind in ("accepted", "quarantine"):
                rows.append(
                    dataclasses.replace(
                        row, kind="retracted", source="retraction", etag=None, own_create=None
                    )
                )
    return rows
