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
rule 7's variant checks its manifest against the rollup ledger).

Compaction runs between audits (normal, PROTOCOL §3.5 rule 2), so a file listed here may
be gone by the time it is read: its merged file names it (`index.catalog.COMPACTED_FROM`,
transitively). A run therefore first reads every entry it can — newest first, at most
``chunk`` at once, skipping a file some merged file already read names — and only then
judges the files it found gone, whatever the order its reads finished in: a gone file
that a merged file it read names is covered. One that none names makes it list
``catalog-created/`` again after its last entry (a merge may have landed during the run)
and read those files too, a bounded number of times (`RELIST_ATTEMPTS`), before the file
counts as uncovered. Then, and for an entry that is gone or unreadable or a file that
does not decode, the whole read is untrusted: the run deletes nothing (PROTOCOL §3.7:
nobody treats an unreadable or vanished catalog file as "no rows"), and says why in
`CatalogSince.stalled` (one of `STALL_REASONS`: a counted event,
``lm_reconciler_gc_stalled_total{reason}``, and the GC run record's ``stalled``).

`trim_unneeded_entries` deletes the entries before the oldest position a rule still reads
from (`needed_position`): the latest completed audit's (the GC's rule-5 audit: of a
listing, or with ``gc.inventory_proves`` of either source), and the newest audit's while it
is left running (re-marking its files, `reconciler.audit.remark`). The lease holder runs it
with its periodic housekeeping, whether or not the GC is enabled (`reconciler.daemon`).
Each run lists ``catalog-created/`` from its start up to that
position only (`trim_entries`): what earlier runs deleted is not listed again, so its cost
is the entries that go plus one page.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from index.audits import iter_audits_newest_first
from index.catalog import compacted_from_names
from protocol import keys, records
from reconciler.gc.bounded import for_each_bounded
from store.base import ObjectStore, list_range
from store.errors import NotFound

HASH_COLUMNS = ["frame_sha256", "accepted_frame_sha256"]
RAW_KEY_COLUMN = "raw_blob_key"
"""Rows name a bundle by key only (PROTOCOL §3.10): a bundle candidate is referenced by a
row whose ``raw_blob_key`` is its key."""
KIND_COLUMN = "kind"
RELIST_ATTEMPTS = 3
MAX_TRIMMED_PER_RUN = 100_000
"""Entries one `trim_entries` call deletes at most (the rest go next time): its memory."""
STALL_REASONS = (
    "catalog-file-vanished",
    "catalog-file-unreadable",
    "entry-vanished",
    "entry-unreadable",
)
"""Why a GC run's catalog read proves nothing (the ``reason`` label of the stall metric)."""


@dataclass
class CatalogSince:
    referenced: set[str] = field(default_factory=set)
    """The candidates some row of those files references."""
    files_read: int = 0
    entries: int = 0
    relists: int = 0
    """Listings of ``catalog-created/`` made again because a file was found gone."""
    covered_gone: int = 0
    """Files found gone whose rows a merged file read holds (compaction meanwhile)."""
    untrusted: str | None = None
    """Why the read proves nothing (then no candidate may be deleted), or None."""
    stalled: str | None = None
    """With ``untrusted``: which of `STALL_REASONS` it is."""


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


async def entries_after(store: ObjectStore, entry_key: str) -> list[str]:
    """The entry keys listed after ``entry_key`` (exclusive), in order."""
    return [
        info.key
        async for info in store.list(keys.INDEX_CATALOG_CREATED_PREFIX, start_after=entry_key)
    ]


@dataclass(frozen=True, slots=True)
class _Untrusted:
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class _Gone:
    catalog_key: str


@dataclass(frozen=True, slots=True)
class _Read:
    catalog_key: str
    hits: set[str]
    inputs: set[str]


class _Reads:
    """The state of one run's read: what merged files read cover, which files were gone."""

    def __init__(
        self,
        store: ObjectStore,
        wanted: pa.Array,
        retained: pa.Array,
        bundle_keys: dict[str, str] | None = None,
    ) -> None:
        self.store = store
        self.wanted = wanted
        self.retained = retained
        self.bundle_keys = bundle_keys or {}  # raw key -> sha of the bundle candidates
        self.covered: set[str] = set()  # catalog keys a merged file we read holds the rows of
        self.gone: set[str] = set()
        self.result = CatalogSince()

    async def read(self, entry_keys: list[str], chunk: int) -> bool:
        """Read ``entry_keys``' files (newest first, ``chunk`` at once); False when one
        makes the read untrusted (recorded in ``result``)."""
        ordered = list(reversed(entry_keys))  # merged files come before their inputs
        for start in range(0, len(ordered), chunk):
            outcomes = await asyncio.gather(
                *(self._one(key) for key in ordered[start : start + chunk])
            )
            for outcome in outcomes:
                if isinstance(outcome, _Untrusted):
                    self.result.untrusted = outcome.detail
                    self.result.stalled = outcome.reason
                    return False
                if isinstance(outcome, _Gone):
                    self.gone.add(outcome.catalog_key)
                elif isinstance(outcome, _Read):
                    self.result.referenced |= outcome.hits
                    self.covered |= outcome.inputs
                    self.result.files_read += 1
        return True

    def uncovered(self) -> list[str]:
        return sorted(self.gone - self.covered)

    async def _one(self, entry_key: str) -> _Read | _Gone | _Untrusted | None:
        """The entry's file read; None when its rows are in a merged file already read."""
        try:
            body, _etag = await self.store.get(entry_key)
            catalog_key = records.CatalogCreated.from_json(body).catalog_key
            keys.parse_index_catalog_key(catalog_key)
        except NotFound:
            return _Untrusted("entry-vanished", f"catalog-created entry {entry_key} vanished")
        except (records.RecordError, keys.KeyFormatError) as exc:
            return _Untrusted(
                "entry-unreadable", f"catalog-created entry {entry_key} is unreadable: {exc}"
            )
        if catalog_key in self.covered:
            return None
        try:
            body, _etag = await self.store.get(catalog_key)
        except NotFound:
            return _Gone(catalog_key)  # judged after every read (`uncovered`)
        try:
            parquet = pq.ParquetFile(io.BytesIO(body))
            inputs = compacted_from_names(parquet.schema_arrow.metadata)
            present = [name for name in HASH_COLUMNS if name in parquet.schema_arrow.names]
            if self.bundle_keys and RAW_KEY_COLUMN in parquet.schema_arrow.names:
                present.append(RAW_KEY_COLUMN)
            table = parquet.read(columns=[KIND_COLUMN, *present])
        except (pa.ArrowException, OSError, ValueError, KeyError) as exc:
            return _Untrusted(
                "catalog-file-unreadable", f"catalog file {catalog_key} is unreadable: {exc}"
            )
        return _Read(catalog_key, self._hits(table, present), set(inputs))

    def _hits(self, table: pa.Table, present: list[str]) -> set[str]:
        hits: set[str] = set()
        quarantine = pc.equal(table.column(KIND_COLUMN), "quarantine")
        if RAW_KEY_COLUMN in present:
            present = [name for name in present if name != RAW_KEY_COLUMN]
            column = table.column(RAW_KEY_COLUMN)
            retained = set(self.retained.to_pylist())
            for by_retention in (False, True):
                wanted = [
                    k for k, sha in self.bundle_keys.items() if (sha in retained) == by_retention
                ]
                if not wanted:
                    continue
                mask = pc.fill_null(
                    pc.is_in(column, value_set=pa.array(wanted, pa.string())), False
                )
                if by_retention:  # as for a frame blob: only quarantine rows count
                    mask = pc.and_(mask, pc.fill_null(quarantine, False))
                hits.update(self.bundle_keys[k] for k in pc.filter(column, mask).to_pylist())
        for name in present:
            column = table.column(name)
            for value_set, rows in ((self.wanted, None), (self.retained, quarantine)):
                if len(value_set) == 0:
                    continue
                mask = pc.fill_null(pc.is_in(column, value_set=value_set), False)
                if rows is not None:
                    mask = pc.and_(mask, pc.fill_null(rows, False))
                hits.update(value for value in pc.filter(column, mask).to_pylist() if value)
        return hits


async def references_since(
    store: ObjectStore,
    position: str,
    candidates: set[str],
    *,
    by_retention: frozenset[str] = frozenset(),
    chunk: int = 8,
    bundle_keys: dict[str, str] | None = None,
) -> CatalogSince:
    """Which ``candidates`` the catalog files created from ``position`` on reference (of
    ``by_retention``, the blobs raw retention nominates: which a quarantine row does).
    ``bundle_keys`` (raw key -> hash) are the candidates that are bundles: a row naming
    one by ``raw_blob_key`` references it."""
    entry_keys = await entries_since(store, position)
    if not candidates or not entry_keys:
        return CatalogSince(entries=len(entry_keys))
    reads = _Reads(
        store,
        pa.array(sorted(candidates - by_retention), pa.string()),
        pa.array(sorted(candidates & by_retention), pa.string()),
        bundle_keys,
    )
    result = reads.result
    result.entries = len(entry_keys)
    if not await reads.read(entry_keys, chunk):
        return result
    last = entry_keys[-1]
    for _attempt in range(RELIST_ATTEMPTS):
        if not reads.uncovered():
            break
        # A merge may have landed during the run: its entry comes after our last one.
        newer = await entries_after(store, last)
        result.relists += 1
        if not newer:
            break
        result.entries += len(newer)
        last = newer[-1]
        if not await reads.read(newer, chunk):
            return result
    if uncovered := reads.uncovered():
        result.untrusted = (
            f"catalog file {uncovered[0]} vanished and no merged file read names it"
            + (f" ({len(uncovered) - 1} more)" if len(uncovered) > 1 else "")
        )
        result.stalled = "catalog-file-vanished"
    result.covered_gone = len(reads.gone) - len(uncovered)
    return result


async def trim_entries(store: ObjectStore, before_position: str, *, concurrency: int = 8) -> int:
    """Delete the catalog-created entries before ``before_position``, ``concurrency`` at a
    time; how many. Lists from the start of ``catalog-created/`` up to the position only
    (`store.base.list_range`: no page past it), at most `MAX_TRIMMED_PER_RUN` entries."""
    bound = _position_key(before_position)
    doomed: list[str] = []
    async for info in list_range(store, keys.INDEX_CATALOG_CREATED_PREFIX, None, bound):
        if info.key >= bound or len(doomed) >= MAX_TRIMMED_PER_RUN:
            break
        doomed.append(info.key)
    await for_each_bounded(doomed, store.delete, concurrency)
    return len(doomed)


async def needed_position(store: ObjectStore) -> str | None:
    """The oldest catalog-created position a rule still reads from, or None when no audit
    records one (then nothing may go). Among the audits of the index (``catalog``): the
    latest completed listing audit's (PROTOCOL §3.5 rule 2: the GC reads from its rule-5
    audit's position), the latest completed audit's of either source (an inventory audit
    serves rule 5 with ``gc.inventory_proves``, a setting that may change while its entries
    are kept), and the newest audit's while it is ``running`` (re-marking its files after it
    stopped, `reconciler.audit.remark`; an older one left running needs nothing: the audit
    after it re-marked its files before starting). A position only grows: a new audit
    records the writer's position when it starts, at or after every entry then written."""
    positions: list[str] = []
    newest = True
    any_completed = False
    async for audit in iter_audits_newest_first(store):
        if not audit.catalog:
            continue  # an audit of the version before the index: no position
        position = audit.catalog_created_from
        if newest and audit.status == "running" and position is not None:
            positions.append(position)
        newest = False
        if audit.status != "completed":
            continue
        if not any_completed and position is not None:
            positions.append(position)
        any_completed = True
        if audit.source == "listing":
            if position is not None:
                positions.append(position)
            break  # every later rule-5 audit started after this one
    return min(positions, default=None)


async def trim_unneeded_entries(
    store: ObjectStore, *, fence: Callable[[], Awaitable[None]], concurrency: int = 8
) -> tuple[str | None, int]:
    """Delete the catalog-created entries before `needed_position` (``fence()`` checked
    first: the lease holder's); returns that position (None: nothing went) and how many."""
    position = await needed_position(store)
    if position is None:
        return None, 0
    await fence()
    return position, await trim_entries(store, position, concurrency=concurrency)
