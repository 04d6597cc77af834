"""``lm-rollup verify``: prove the rollup includes every accepted batch exactly once.

For every accepted hour, the setsum of ``sha256(manifest_id + "\\n" + frame_sha256)``
over the hour's accepted batches is recomputed and compared, with the batch and record
counts, against the snapshot's ``ledger.hours`` (PROTOCOL §4). An hour is *complete* when
all three agree. For an hour that does not, the snapshot's ledger files of that hour are
read and compared batch by batch: *missing N* accepted batches are not in the ledger,
*extra N* ledger rows are not accepted batches (or are there twice). A ledger whose files
agree with the accepted batches but whose header totals do not is reported too
(``detail``). Batches that arrived after retention dropped their hours are counted like
any other (they are in the ledger) and reported as late and excluded; hours before every
table's retention cutoff are reported as *retired* once proved complete.

Where the accepted batches come from:
- by default the catalog (PROTOCOL §3.7): each hour's files, a key counted once — what
  the rollup planned from, so this proves the rollup matches the index;
- with ``from_manifests`` (``lm-rollup verify --from-manifests``), ``accepted/v1/``
  itself: one listing and one GET per manifest, independent of the index (a manifest
  that is unreadable or names another key is counted in ``unparseable_keys``).
- Hours with accepted batches but no ledger yet are *missing* (the rollup is behind):
  limit the check with ``first_hour``/``last_hour`` to the hours the rollup has done.

Batches acknowledged as lost (`rollup.lifecycle.lost`: the blob is gone or corrupt) are ledger
rows like any other, so their hour is complete; the hour says how many, and the report
lists each (who acknowledged it, when and why). For hours that are not complete the
report lists the batches still *waiting* (at most `MAX_WAITING`), each with the problem
the rollup recorded for its blob (``missing-blob``/``corrupt-blob``: what
``lm-rollup acknowledge-lost`` settles) or none (the rollup is behind).

Cost: the catalog's files (or one GET per manifest); ledger files only for mismatching
hours, whose batches are read a second time. Memory: per-hour totals, plus the batches
of mismatching hours. Store errors propagate (a verification that could not read
everything has proved nothing).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

from index.catalog import list_all_files, read_hour
from protocol import keys
from protocol.records import AcceptedManifest, RecordError
from protocol.setsum import Setsum
from rollup.table import schemas
from rollup.table.commit import load_latest, load_version
from rollup.table.ledger import ledger_rows, read_ledger
from rollup.table.manifest import EMPTY_LEDGER_HOUR, LedgerHour, LostBatch, Snapshot
from rollup.table.manifest_ledger import LOST_PROBLEMS
from store.base import ObjectStore
from store.errors import NotFound


@dataclass(frozen=True, slots=True)
class HourReport:
    """One hour's verdict; ``missing``/``extra`` are None for complete hours."""

    hour: str
    accepted: LedgerHour
    ledger: LedgerHour
    missing: int | None = None
    extra: int | None = None
    detail: str = ""
    late: LedgerHour = EMPTY_LEDGER_HOUR
    """The part of ``ledger`` that arrived after retention dropped its hours."""
    retired: bool = False
    """Retention dropped this hour's data from every table; its ledger still proves it."""
    lost: LedgerHour = EMPTY_LEDGER_HOUR
    """The part of ``ledger`` acknowledged as lost (`rollup.lifecycle.lost`): no rows anywhere."""

    @property
    def complete(self) -> bool:
        return self.accepted == self.ledger and not self.detail

    def describe(self) -> str:
        if self.complete:
            if self.retired:
                text = f"retired ({self.accepted.batches} batches)"
            else:
                text = f"complete ({self.accepted.batches} batches, {self.accepted.records} records"
                if self.late.batches:
                    text += f"; {self.late.batches} late, excluded"
                text += ")"
            if self.lost.batches:
                text += f"; {self.lost.batches} lost ({self.lost.records} records), acknowledged"
            return text
        text = f"missing {self.missing} / extra {self.extra}"
        return f"{text} ({self.detail})" if self.detail else text


@dataclass(frozen=True, slots=True)
class Waiting:
    """An accepted batch the ledger lacks, and the problem the rollup recorded for its
    blob (None: none recorded; the rollup has not tried it yet, i.e. it is behind)."""

    hour: str
    manifest_key: str
    blob_key: str
    problem: str | None

    def describe(self) -> str:
        if self.problem is None:
            return f"{self.hour} {self.manifest_key}: not rolled up yet"
        return (
            f"{self.hour} {self.manifest_key}: {self.problem} {self.blob_key} (if the blob "
            f"cannot be restored: lm-rollup acknowledge-lost {self.manifest_key} --reason ...)"
        )


MAX_WAITING = 100
"""Waiting batches a report lists at most (``waiting_total`` counts them all)."""


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Every checked hour, oldest first; ``ok`` when all are complete. ``lost``: the
    batches of the checked hours acknowledged as lost; ``waiting``: up to `MAX_WAITING`
    batches missing from the ledger, with what keeps each out."""

    version: int | None
    hours: list[HourReport]
    unparseable_keys: int = 0
    lost: tuple[LostBatch, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    waiting_total: int = 0

    @property
    def ok(self) -> bool:
        return all(h.complete for h in self.hours) and self.unparseable_keys == 0


@dataclass(slots=True)
class _HourTotals:
    batches: int = 0
    records: int = 0
    setsum: Setsum = field(default_factory=Setsum)

    def frozen(self) -> LedgerHour:
        return LedgerHour(self.batches, self.records, self.setsum.hex)


AcceptedRow = tuple[str, str, str, int]
"""``(accepted hour, manifest_id, frame_sha256, record_count)`` of one accepted batch."""


async def _from_catalog(
    store: ObjectStore,
    first: keys.UtcHour | None,
    last: keys.UtcHour | None,
    hours: set[str] | None,
) -> AsyncIterator[AcceptedRow]:
    """The accepted rows of every catalog hour in range (one listing, the hours' files)."""
    seen: set[keys.UtcHour] = set()
    async for info in list_all_files(store):
        hour, _epoch, _sequence = keys.parse_index_catalog_key(info.key)
        if hour in seen or not _in_range(hour.iso, first, last):
            continue
        if hours is not None and hour.iso not in hours:
            continue
        seen.add(hour)
        for row in (await read_hour(store, hour)).batches():
            assert row.record_count is not None
            yield hour.iso, row.manifest_id, row.frame_sha256, row.record_count


async def _from_manifests(
    store: ObjectStore, concurrency: int, hours: set[str] | None, bad: list[str]
) -> AsyncIterator[AcceptedRow]:
    """Every accepted manifest under ``accepted/v1/``, read one by one (bounded
    concurrency): independent of the index, the authority itself. A batch stored under
    both agent key forms (PROTOCOL §3) counts once, as the catalog counts it
    (`index.catalog.CatalogHour.batches`): the first listed, the long form (only ids of
    agents long enough to have two forms are remembered)."""
    limit = asyncio.Semaphore(concurrency)
    two_forms: set[str] = set()

    async def one(key: str) -> tuple[AcceptedRow, bool] | None:
        """The row, and whether its agent has two key forms."""
        async with limit:
            try:
                body, _ = await store.get(key)
                manifest = AcceptedManifest.from_json(body)
            except (NotFound, RecordError):
                bad.append(key)
                return None
        legacy = keys.legacy_accepted_manifest_key(manifest.identity)
        if key not in (manifest.manifest_key, legacy):
            bad.append(key)
            return None
        hour = manifest.accepted_hour.iso
        row = (hour, manifest.identity.manifest_id, manifest.frame_sha256, manifest.record_count)
        return row, legacy is not None

    chunk: list[str] = []

    async def flush() -> list[AcceptedRow]:
        rows: list[AcceptedRow] = []
        for found in await asyncio.gather(*(one(k) for k in chunk)):  # in listing order
            if found is None:
                continue
            row, two_form = found
            if two_form:
                if row[1] in two_forms:
                    continue  # its other key form was listed first
                two_forms.add(row[1])
            rows.append(row)
        chunk.clear()
        return [r for r in rows if hours is None or r[0] in hours]

    async for info in store.list(keys.ACCEPTED_PREFIX):
        chunk.append(info.key)
        if len(chunk) >= 1000:
            for row in await flush():
                yield row
    for row in await flush():
        yield row


def _in_range(hour: str, first: keys.UtcHour | None, last: keys.UtcHour | None) -> bool:
    parsed = keys.UtcHour.parse_iso(hour)
    return (first is None or parsed >= first) and (last is None or parsed <= last)


async def verify(
    store: ObjectStore,
    *,
    version: int | None = None,
    first_hour: keys.UtcHour | None = None,
    last_hour: keys.UtcHour | None = None,
    concurrency: int = 32,
    from_manifests: bool = False,
) -> VerifyReport:
    """Check every accepted hour in ``[first_hour, last_hour]`` (default: all) against
    the latest snapshot (or ``version``). Before the first commit every accepted hour is
    missing everything. ``from_manifests``: the accepted batches come from
    ``accepted/v1/`` itself instead of the catalog."""
    loaded = await (load_latest(store) if version is None else load_version(store, version))
    snapshot = loaded.snapshot if loaded is not None else None
    bad: list[str] = []
    totals: dict[str, _HourTotals] = {}

    def source(hours: set[str] | None) -> AsyncIterator[AcceptedRow]:
        if from_manifests:
            return _from_manifests(store, concurrency, hours, bad)
        return _from_catalog(store, first_hour, last_hour, hours)

    async for hour, manifest_id, sha, records in source(None):
        if not _in_range(hour, first_hour, last_hour):
            continue
        hour_totals = totals.setdefault(hour, _HourTotals())
        hour_totals.batches += 1
        hour_totals.records += records
        hour_totals.setsum = hour_totals.setsum.add(manifest_id, sha)
    ledger_hours = snapshot.ledger_hours if snapshot is not None else {}
    checked = sorted(
        h for h in set(totals) | set(ledger_hours) if _in_range(h, first_hour, last_hour)
    )
    reports: dict[str, HourReport] = {}
    late = snapshot.ledger_late if snapshot is not None else {}
    lost = snapshot.lost_hours if snapshot is not None else {}
    retired_before = _retired_before(snapshot)
    for hour in checked:
        accepted = totals[hour].frozen() if hour in totals else EMPTY_LEDGER_HOUR
        reports[hour] = HourReport(
            hour,
            accepted,
            ledger_hours.get(hour, EMPTY_LEDGER_HOUR),
            late=late.get(hour, EMPTY_LEDGER_HOUR),
            retired=retired_before is not None and hour < retired_before,
            lost=lost.get(hour, EMPTY_LEDGER_HOUR),
        )
    wrong = {h for h, r in reports.items() if not r.complete}
    waiting: list[tuple[str, str, str]] = []
    if wrong:
        explained, waiting = await _explain(store, snapshot, reports, wrong, source)
        reports.update(explained)
    return VerifyReport(
        version=snapshot.version if snapshot is not None else None,
        hours=[reports[h] for h in checked],
        unparseable_keys=len(bad),
        lost=tuple(
            b for b in (snapshot.ledger_lost if snapshot else ()) if b.accepted_hour in reports
        ),
        waiting=await _waiting(store, sorted(waiting)[:MAX_WAITING]),
        waiting_total=len(waiting),
    )


async def _waiting(store: ObjectStore, missing: list[tuple[str, str, str]]) -> tuple[Waiting, ...]:
    """``(hour, manifest_id, frame_sha256)`` as `Waiting`, each with the rollup's problem
    record for its blob if one exists (one listing per problem kind)."""
    if not missing:
        return ()
    recorded: dict[str, str] = {}
    for kind in LOST_PROBLEMS:
        async for info in store.list(f"{keys.RECONCILER_PROBLEMS_PREFIX}{kind}/"):
            recorded[info.key] = kind
    found = []
    for hour, manifest_id, sha in missing:
        identity = keys.parse_manifest_id(manifest_id).identity
        assert identity is not None  # a manifest_id always spells the agent in hex
        blob = keys.raw_blob_key(sha)
        problem = next(
            (kind for kind in LOST_PROBLEMS if keys.problem_key(kind, blob) in recorded), None
        )
        found.append(Waiting(hour, keys.accepted_manifest_key(identity), blob, problem))
    return tuple(found)


async def _explain(
    store: ObjectStore,
    snapshot: Snapshot | None,
    reports: dict[str, HourReport],
    wrong: set[str],
    source: Callable[[set[str] | None], AsyncIterator[AcceptedRow]],
) -> tuple[dict[str, HourReport], list[tuple[str, str, str]]]:
    """Batch-by-batch comparison of the mismatching hours (their batches read again), and
    the batches missing from the ledger as ``(hour, manifest_id, frame_sha256)``."""
    accepted: dict[str, Counter[tuple[str, str]]] = {h: Counter() for h in wrong}
    async for row_hour, manifest_id, sha, _ in source(wrong):
        accepted[row_hour][(manifest_id, sha)] += 1
    included: dict[str, Counter[tuple[str, str]]] = {h: Counter() for h in wrong}
    file_totals: dict[str, _HourTotals] = {h: _HourTotals() for h in wrong}
    if snapshot is not None:
        for row in ledger_rows(await read_ledger(store, snapshot, wrong)):
            included[row.accepted_hour][(row.manifest_id, row.frame_sha256)] += 1
            totals = file_totals[row.accepted_hour]
            totals.batches += 1
            totals.records += row.record_count
            totals.setsum = totals.setsum.add(row.manifest_id, row.frame_sha256)
    explained: dict[str, HourReport] = {}
    waiting: list[tuple[str, str, str]] = []
    for hour in wrong:
        report = reports[hour]
        absent = accepted[hour] - included[hour]
        waiting += [(hour, mid, sha) for mid, sha in absent]
        missing = sum(absent.values())
        extra = sum((included[hour] - accepted[hour]).values())
        detail = ""
        if file_totals[hour].frozen() != report.ledger:
            detail = "ledger totals disagree with the ledger files"
        explained[hour] = replace(report, missing=missing, extra=extra, detail=detail)
    return explained, waiting


def _retired_before(snapshot: Snapshot | None) -> str | None:
    """The first accepted hour not retired: hours before it are before every table's
    retention cutoff (None: some table keeps everything)."""
    if snapshot is None or set(snapshot.retention) != set(schemas.TABLES):
        return None
    return min(snapshot.retention.values())
