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
entries created since the last one seen are listed (one LIST, and, once an hour is
cached, one small GET per new catalog file: the files the reconciler wrote meanwhile,
never history). The catalog is listed only from the first hour not yet read.

**Time.** Reading an hour's totals is out of core and costs what the hour holds: ~40 ms
for an hour of 3,600 batches, about a minute for one of 3.6 million (1,000 batches/s,
bench/RESULTS.md "One busy catalog hour"). A query collector that starts on a long
history has every sealed hour to read once, which no query should wait for. So the
reading runs in one background task per process, one hour at a time, oldest first (its
memory is one hour's, under the DuckDB limit), started by the first answer that needs
it; an answer waits for it at most ``query.history_wait_s`` and is then answered with what is
read so far: ``sealed_through_ns`` stops at the first hour not read yet, or whose new
file is not read yet (conservative: ``complete`` is false until then, never wrongly
true). Progress is kept hour by hour. A read that fails (the store, an unreadable
catalog file) is raised to the answer that waits for it, or to the next one, which then
starts reading again from where it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from index.audits import iter_audits_newest_first, sealed_limit_ns
from protocol import keys
from protocol.records import CatalogCreated, RecordError
from rollup.table.ledger import read_catalog_totals
from rollup.table.manifest import LedgerHour, Snapshot
from store.base import ObjectStore
from store.errors import NotFound

NS_PER_S = 1_000_000_000
MAX_HOURS_PER_LISTING = 256  # hours listed at a time by the history reader
PROGRESS_EVERY_S = 30.0  # the history reader logs its progress this often

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
    ) -> None:
        self._store = store
        self.margin_ns = int(settle_margin_s * NS_PER_S)
        self._refresh_s = refresh_interval_s
        self._monotonic = monotonic
        self._wait_s = history_wait_s
        self._audit_started: int | None = None
        self._checked_at: float | None = None
        self._catalog: dict[str, LedgerHour] = {}
        self._read_through_ns = 0  # sealed catalog hours before this are in _catalog
        self._entries_after: str | None = None  # catalog-created entries seen through here
        self._changed: set[str] = set()  # cached hours a new catalog file landed in
        self._reading: str | None = None  # the hour the reader is reading now
        self._reader: asyncio.Task[None] | None = None
        self._progress_at = 0.0  # when the reader last logged its progress

    async def _audit_started_ns(self) -> int | None:
        now = self._monotonic()
        if self._checked_at is None or now - self._checked_at >= self._refresh_s:
            async for record in iter_audits_newest_first(self._store):
                if record.status == "completed" and record.catalog and record.source == "listing":
                    self._audit_started = record.started_at_unix_ns
                    break
            await self._note_new_catalog_files()
            self._checked_at = now
        return self._audit_started

    async def _note_new_catalog_files(self) -> None:
        """The cached hours a catalog file created since the last look landed in
        (PROTOCOL §3.7: a reader caching an hour's totals reads it again then); the hour
        being read counts as cached (its read may have listed before the file landed)."""
        prefix = keys.INDEX_CATALOG_CREATED_PREFIX
        start = self._entries_after
        listed = [info.key async for info in self._store.list(prefix, start_after=start)]
        if listed:
            self._entries_after = listed[-1]
        if start is None or (not self._catalog and self._reading is None):
            # The first look, or nothing cached yet: every hour is read afresh anyway (an
            # entry is created after its file, so such a read holds the file).
            return
        for entry_key in listed:
            try:
                body, _etag = await self._store.get(entry_key)
                hour = keys.parse_index_catalog_key(CatalogCreated.from_json(body).catalog_key)[0]
            except (NotFound, RecordError, keys.KeyFormatError):
                continue  # trimmed, or not an entry: nothing cached to refresh by it
            if hour.iso in self._catalog or hour.iso == self._reading:
                self._changed.add(hour.iso)

    # --- the history reader (one task) ---------------------------------------------------

    async def _read_history(self, limit_ns: int) -> None:
        """Read hours changed since they were cached, then sealed hours before
        ``limit_ns`` not read yet, oldest first, one at a time; progress is kept hour by
        hour, and logged at each listing and at the end."""
        started, hours = self._monotonic(), len(self._catalog)
        self._progress_at = started
        while self._changed:
            iso = min(self._changed)
            self._changed.discard(iso)  # a file landing during the read marks it again
            self._catalog[iso] = await self._read_hour(keys.UtcHour.parse_iso(iso))
        while self._read_through_ns < limit_ns:
            await self._read_sealed_catalog(limit_ns)
        log.info(
            "history_read",
            read_through=_iso(self._read_through_ns),
            hours_cached=len(self._catalog),
            hours_read=len(self._catalog) - hours,
            seconds=round(self._monotonic() - started, 3),
        )

    async def _read_hour(self, hour: keys.UtcHour) -> LedgerHour:
        self._reading = hour.iso
        try:
            return await read_catalog_totals(self._store, hour)
        finally:
            self._reading = None

    async def _read_sealed_catalog(self, limit_ns: int) -> None:
        """List up to `MAX_HOURS_PER_LISTING` sealed catalog hours not read yet and read
        them, oldest first."""
        start_after = None
        if self._read_through_ns:
            start_after = keys.index_catalog_hour_prefix(
                keys.UtcHour.from_unix_ns(self._read_through_ns)
            )
        hours: list[keys.UtcHour] = []
        read_through = limit_ns
        async for info in self._store.list(keys.INDEX_CATALOG_PREFIX, start_after=start_after):
            try:
                hour = keys.parse_index_catalog_key(info.key)[0]
            except keys.KeyFormatError:
                continue
            if hour.start_ns >= limit_ns:
                break
            if hours and hours[-1] == hour:
                continue
            if len(hours) == MAX_HOURS_PER_LISTING:
                read_through = hour.start_ns  # the rest at the next listing
                break
            hours.append(hour)
        for i, hour in enumerate(hours):
            self._catalog[hour.iso] = await self._read_hour(hour)
            # The hours between two listed ones have no catalog file: nothing to read.
            self._read_through_ns = hours[i + 1].start_ns if i + 1 < len(hours) else read_through
            if self._monotonic() - self._progress_at >= PROGRESS_EVERY_S:
                self._progress_at = self._monotonic()
                log.info(
                    "history_reading",
                    read_through=_iso(self._read_through_ns),
                    limit=_iso(limit_ns),
                    hours_cached=len(self._catalog),
                )
        self._read_through_ns = max(self._read_through_ns, read_through)

    def _start_reading(self, limit_ns: int) -> asyncio.Task[None] | None:
        """The reader, started when there is something to read and it is not running. A
        reader that failed after its answer stopped waiting raises here, once."""
        reader = self._reader
        if reader is not None and reader.done():
            self._reader = None
            if not reader.cancelled():
                reader.result()  # its failure, if it failed
        if self._reader is None and (self._changed or self._read_through_ns < limit_ns):
            self._reader = asyncio.get_running_loop().create_task(
                self._read_history(limit_ns), name="coverage-history"
            )
        return self._reader

    async def close(self) -> None:
        """Stop the reader (the process is stopping)."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None

    @property
    def read_through_ns(self) -> int:
        """Sealed catalog hours before this are read (the gauge
        ``lm_collector_history_read_through_timestamp_seconds``)."""
        return self._covered_through_ns(self._read_through_ns)

    def _covered_through_ns(self, limit_ns: int) -> int:
        bound = min(limit_ns, self._read_through_ns)
        pending = [keys.UtcHour.parse_iso(iso).start_ns for iso in self._changed]
        if self._reading is not None and self._reading in self._catalog:
            pending.append(keys.UtcHour.parse_iso(self._reading).start_ns)  # read again now
        return min([bound, *pending])

    async def sealed_through_ns(self, snapshot: Snapshot | None) -> int:
        limit = sealed_limit_ns(await self._audit_started_ns(), self.margin_ns)
        reader = self._start_reading(limit)
        if reader is not None:
            await asyncio.wait([reader], timeout=self._wait_s)
            if reader.done():
                if self._reader is reader:  # (another answer may have started the next)
                    self._reader = None
                if not reader.cancelled():
                    reader.result()  # its failure, if it failed
        covered = self._covered_through_ns(limit)
        return first_uncovered_ns(snapshot, self._catalog, covered)
