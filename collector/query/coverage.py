"""What a committed snapshot provably covers: ``sealed_through_ns`` (PROTOCOL §2).

**Meaning (PROTOCOL §2; sealed hours, §3.7)**: every batch *accepted* (its manifest's
``accepted_at``) before ``sealed_through_ns`` is in the snapshot. It is the start of the
earliest accepted hour that is not both

(a) **sealed** by a completed listing audit of the index (`reconciler.audit.records`:
    ``status = completed``, ``catalog = true``, ``source = listing``): the audit started
    at least a *settle margin* after the hour ended — the margin is the longest a batch
    stamped in the hour can still be landing (``ingest.request_budget_s`` + the store's
    connect and read timeouts) plus ``store.max_clock_skew_s`` — so, by what a completed
    audit promises (PROTOCOL §3.7), the hour's catalog holds every batch accepted in it.
    A running audit, or one that worked from an S3 Inventory report (which may lag the
    bucket), seals nothing; log rows alone never do (a crash can lose them);
(b) **included** in the snapshot: its ledger hour has the catalog hour's batch count and
    setsum (PROTOCOL §4).

A batch accepted later can still carry older points, so a query over old times may get
more rows later even when ``complete``; what ``complete`` promises is that no batch
accepted before ``sealed_through_ns`` is missing. Answers count the batches they include
that were accepted later and overlap their range (``sources.late_batches``,
`collector.query.late`).

Cost: the audit records are listed at most every ``refresh_interval_s`` (few: the
reconciler trims them). A sealed hour's catalog changes rarely — an audit's superseding
row, a retraction's ``retracted`` row (PROTOCOL §3.7), its final compaction — so each is
read once per process (its totals kept: a few dozen bytes an hour of history), and read
again when a ``catalog-created`` entry names a new file in it: at the same refresh, the
entries created since the last one seen are listed (one LIST page per 1,000, at most
`MAX_PENDING_ENTRIES` waiting to be read), and, once an hour is cached, each is read
(one small GET per new catalog file: the files the reconciler wrote meanwhile, never
history). The catalog is listed only from the first hour not yet read.

**Time.** Reading an hour's totals is out of core and costs what the hour holds: ~40 ms
for an hour of 3,600 batches; for one of 3.6 million (1,000 batches/s), ~11 s once it is
settled (one merged file) and ~20 s to a minute before (bench/RESULTS.md "a settled
hour's totals", "One busy catalog hour"). A query collector that starts on a long
history has every sealed hour to read once, and one that was not asked for a day has a
day of entries to read (the reconciler writes a catalog file every pass, ~8,600 a day);
no answer should wait for either. So the reading runs in one background task per
process, started by the first answer that needs it: the new entries first,
`ENTRY_READERS` at a time, then the hours they name again, then the sealed hours not
read yet, one at a time, oldest first (its memory is one hour's, under the DuckDB
limit). An answer waits for it at most ``query.history_wait_s`` and is then answered
with what is read so far: ``sealed_through_ns`` stops at the first hour not read yet, at
an hour a new file landed in and not read again yet, and, while entries are listed but
not read (they may name any hour), at the first cached hour — conservative: ``complete``
is false until then, never wrongly true. Progress is kept hour by hour. A read that fails
(the store, an unreadable catalog file) is raised to the answer that waits for it, or
to the next one, which then starts reading again from where it stopped.

**After a restart**, with ``query.history_cache_dir``, an hour's totals come from the
disk when the hour is listed with the same files as when they were read
(`collector.query.history_cache`): the listing the reader makes anyway names them, so a
restart on an unchanged history reads no hour again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from index.audits import iter_audits_newest_first, sealed_limit_ns
from index.catalog import list_all_files, list_hour_files
from protocol import keys
from protocol.records import CatalogCreated, RecordError
from rollup.table.ledger import read_catalog_totals
from rollup.table.manifest import LedgerHour, Snapshot
from store.base import ObjectInfo, ObjectStore
from store.errors import NotFound

from .background import BackgroundRead
from .history_cache import HistoryCache, listing_digest

NS_PER_S = 1_000_000_000
MAX_HOURS_PER_LISTING = 256  # hours listed at a time by the history reader
PROGRESS_EVERY_S = 30.0  # the history reader logs its progress this often
MAX_PENDING_ENTRIES = 50_000  # catalog-created entries listed and not read yet, at most
ENTRY_READERS = 16  # entries read at once

log = structlog.get_logger("collector.query.coverage")


def _iso(ns: int) -> str:
    return keys.UtcHour.from_unix_ns(ns).iso if ns else "-"


def first_uncovered_ns(
    snapshot: Snapshot | None, catalog: dict[str, LedgerHour], limit_ns: int
) -> int:
    """``sealed_through_ns``: the first sealed catalog hour the snapshot's ledger does not
    match, else ``limit_ns``. ``catalog``: totals of sealed catalog hours."""
    ledger = snapshot.ledger_hours if snapshot is not None else {}
    for hour in sorted(catalog):
        start = keys.UtcHour.parse_iso(hour).start_ns
        if start >= limit_ns:
            break
        wanted, have = catalog[hour], ledger.get(hour)
        if wanted.batches == 0:
            continue
        if have is None or (have.batches, have.setsum) != (wanted.batches, wanted.setsum):
            return start
    return limit_ns


class Coverage:
    def __init__(
        self,
        store: ObjectStore,
        *,
        settle_margin_s: float,
        refresh_interval_s: float,
        monotonic: Callable[[], float] = time.monotonic,
        history_wait_s: float = 1.0,
        history_cache: HistoryCache | None = None,
    ) -> None:
        self._store = store
        self._disk = history_cache
        self._from_disk = 0  # hours whose totals came from the history cache
        self.margin_ns = int(settle_margin_s * NS_PER_S)
        self._refresh_s = refresh_interval_s
        self._monotonic = monotonic
        self._wait_s = history_wait_s
        self._audit_started: int | None = None
        self._checked_at: float | None = None
        self._catalog: dict[str, LedgerHour] = {}
        self._read_through_ns = 0  # sealed catalog hours before this are in _catalog
        self._entries_after: str | None = None  # catalog-created entries listed through here
        self._entries: list[str] = []  # listed entries not read yet (at most MAX_PENDING_ENTRIES)
        self._entries_unlisted = False  # a listing stopped at that bound: more may follow
        self._changed: set[str] = set()  # cached hours a new catalog file landed in
        self._rereading: str | None = None  # the cached hour being read again now
        self._reader = BackgroundRead("coverage-history")
        self._progress_at = 0.0  # when the reader last logged its progress

    # --- in the answer: the audits and the new entries' keys (LISTs) ----------------------

    async def _audit_started_ns(self) -> int | None:
        now = self._monotonic()
        if self._checked_at is None or now - self._checked_at >= self._refresh_s:
            async for record in iter_audits_newest_first(self._store):
                if record.status == "completed" and record.catalog and record.source == "listing":
                    self._audit_started = record.started_at_unix_ns
                    break
            await self._list_new_entries()
            self._checked_at = now
        elif self._entries_unlisted and len(self._entries) < MAX_PENDING_ENTRIES:
            await self._list_new_entries()  # the rest of a listing that stopped at the bound
        return self._audit_started

    async def _list_new_entries(self) -> None:
        """The ``catalog-created`` entries since the last look, for the reader to read
        (PROTOCOL §3.7: a reader caching an hour's totals reads it again when an entry
        names a new file in it). Until it has, no cached hour is trusted."""
        start = self._entries_after
        room = MAX_PENDING_ENTRIES - len(self._entries)
        listed: list[str] = []
        self._entries_unlisted = False
        async for info in self._store.list(keys.INDEX_CATALOG_CREATED_PREFIX, start_after=start):
            if len(listed) >= room:
                self._entries_unlisted = True  # listed from here at the next answer
                break
            listed.append(info.key)
        if listed:
            self._entries_after = listed[-1]
        if start is None or (not self._catalog and not self._reader.running):
            # The first look, or nothing cached nor being read: every hour is read afresh
            # anyway (an entry is created after its file, so such a read holds the file).
            return
        self._entries.extend(listed)

    # --- the history reader (one task) ---------------------------------------------------

    async def _read_history(self, limit_ns: int) -> None:
        """Until nothing is left before ``limit_ns``: read the new entries (marking the
        cached hours they name), read the marked hours again, read the next sealed hour
        not read yet (oldest first, one at a time). Progress is kept hour by hour, and
        logged every `PROGRESS_EVERY_S` and at the end."""
        started, hours, from_disk = self._monotonic(), len(self._catalog), self._from_disk
        self._progress_at = started
        listed: list[tuple[keys.UtcHour, list[ObjectInfo]]] = []  # not read yet, oldest first
        listed_through = 0  # what is read once they are
        while True:
            if self._entries:
                await self._read_entries()
            elif self._changed:
                iso = min(self._changed)
                self._changed.discard(iso)  # an entry read later marks it again
                self._rereading = iso
                try:
                    self._catalog[iso] = await self._hour_totals(keys.UtcHour.parse_iso(iso))
                finally:
                    self._rereading = None
            elif self._read_through_ns >= limit_ns:
                break
            elif not listed:
                listed, listed_through = await self._list_sealed_hours(limit_ns)
                if not listed:
                    self._read_through_ns = max(self._read_through_ns, listed_through)
            else:
                hour, files = listed.pop(0)
                self._catalog[hour.iso] = await self._hour_totals(hour, files)
                # The hours between two listed ones have no catalog file: nothing to read.
                self._read_through_ns = listed[0][0].start_ns if listed else listed_through
                self._log_progress(limit_ns)
        log.info(
            "history_read",
            read_through=_iso(self._read_through_ns),
            hours_cached=len(self._catalog),
            hours_read=len(self._catalog) - hours,
            hours_from_disk=self._from_disk - from_disk,  # of hours_read: not read again
            seconds=round(self._monotonic() - started, 3),
        )

    def _log_progress(self, limit_ns: int) -> None:
        if self._monotonic() - self._progress_at >= PROGRESS_EVERY_S:
            self._progress_at = self._monotonic()
            log.info(
                "history_reading",
                read_through=_iso(self._read_through_ns),
                limit=_iso(limit_ns),
                hours_cached=len(self._catalog),
            )

    async def _read_entries(self) -> None:
        """Read the pending entries, `ENTRY_READERS` at a time, and mark the cached hours
        they name. Entries listed meanwhile wait for the next call; a failure leaves them
        all pending."""
        taken = list(self._entries)
        slots = asyncio.Semaphore(ENTRY_READERS)

        async def one(entry_key: str) -> keys.UtcHour | None:
            async with slots:
                return await catalog_hour_of_entry(self._store, entry_key)

        named = await asyncio.gather(*(one(key) for key in taken))
        del self._entries[: len(taken)]
        self._changed.update(h.iso for h in named if h is not None and h.iso in self._catalog)

    async def _hour_totals(
        self, hour: keys.UtcHour, files: list[ObjectInfo] | None = None
    ) -> LedgerHour:
        """The hour's catalog totals: kept on disk for its listing (``files``, or listed
        now), else read (`collector.query.history_cache`)."""
        if self._disk is None:
            return await read_catalog_totals(self._store, hour)
        listing = listing_digest(
            files if files is not None else await list_hour_files(self._store, hour)
        )
        totals = self._disk.get(hour.iso, listing)
        self._from_disk += totals is not None
        if totals is None:
            totals = await read_catalog_totals(self._store, hour)
            self._disk.put(hour.iso, listing, totals)
        return totals

    async def _list_sealed_hours(
        self, limit_ns: int
    ) -> tuple[list[tuple[keys.UtcHour, list[ObjectInfo]]], int]:
        """Up to `MAX_HOURS_PER_LISTING` sealed catalog hours not read yet, oldest first,
        each with its files as listed, and the time read through once they are."""
        start_after = None
        if self._read_through_ns:
            start_after = keys.index_catalog_hour_prefix(
                keys.UtcHour.from_unix_ns(self._read_through_ns)
            )
        hours: list[tuple[keys.UtcHour, list[ObjectInfo]]] = []
        async for info in list_all_files(self._store, start_after=start_after):
            hour = keys.parse_index_catalog_key(info.key)[0]
            if hour.start_ns >= limit_ns:
                break
            if hours and hours[-1][0] == hour:
                hours[-1][1].append(info)
                continue
            if len(hours) == MAX_HOURS_PER_LISTING:
                return hours, hour.start_ns  # the rest at the next listing
            if not hours and start_after is None and self._disk is not None:
                self._disk.forget_before(hour.iso)  # the catalog's first hour
            hours.append((hour, [info]))
        return hours, limit_ns

    async def close(self) -> None:
        """Stop the reader (the process is stopping)."""
        await self._reader.close()

    # --- the answer ----------------------------------------------------------------------

    @property
    def read_through_ns(self) -> int:
        """Sealed catalog hours before this are read (the gauge
        ``lm_collector_history_read_through_timestamp_seconds``)."""
        return self._covered_through_ns(self._read_through_ns)

    def _covered_through_ns(self, limit_ns: int) -> int:
        """``limit_ns``, or less: not past an hour not read yet, nor a cached hour a new
        catalog file landed in (marked, or being read again), nor, while entries are not
        read yet (they could name any hour), the first cached hour."""
        bound = [min(limit_ns, self._read_through_ns)]
        marked = [*self._changed, *([self._rereading] if self._rereading else [])]
        bound += (keys.UtcHour.parse_iso(iso).start_ns for iso in marked)
        if self._entries or self._entries_unlisted:
            bound += (keys.UtcHour.parse_iso(iso).start_ns for iso in self._catalog)
        return min(bound)

    async def sealed_through_ns(self, snapshot: Snapshot | None) -> int:
        limit = sealed_limit_ns(await self._audit_started_ns(), self.margin_ns)
        work = self._entries or self._changed or self._read_through_ns < limit
        start = (lambda: self._read_history(limit)) if work else None
        await self._reader.wait(start, self._wait_s)
        covered = self._covered_through_ns(limit)
        return first_uncovered_ns(snapshot, self._catalog, covered)


async def catalog_hour_of_entry(store: ObjectStore, entry_key: str) -> keys.UtcHour | None:
    """The hour of the catalog file a ``catalog-created`` entry names; None when it is
    gone (trimmed) or not an entry: nothing cached to read again by it."""
    try:
        body, _etag = await store.get(entry_key)
        return keys.parse_index_catalog_key(CatalogCreated.from_json(body).catalog_key)[0]
    except (NotFound, RecordError, keys.KeyFormatError):
        return None
