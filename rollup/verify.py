"""``lm-rollup verify``: prove the rollup includes every accepted batch exactly once.

For every accepted hour, the setsum of ``sha256(manifest_id + "\\n" + frame_sha256)``
over the batches listed under ``accepted-by-time/v1/<hour>/`` is recomputed and compared,
with the batch and record counts, against the snapshot's ``ledger.hours`` (PROTOCOL §4).
An hour is *complete* when all three agree. For an hour that does not, the snapshot's
ledger files of that hour are read and compared batch by batch: *missing N* accepted
batches are not in the ledger, *extra N* ledger rows are not accepted batches (or are
there twice). A ledger whose files agree with the accepted batches but whose header
totals do not is reported too (``detail``).

Where the inputs come from (decision):
- ``manifest_id`` and the record count come from the accepted-by-time *key* (identity
  and ``seq_start..seq_end``);
- ``frame_sha256`` comes from the entry's body (`IndexEntry.frame_sha256`), as PROTOCOL
  §4 says anyone can recompute from ``accepted-by-time/v1/``; when a body is missing or
  unreadable, from the accepted manifest it names (``accepted/v1/...``, the authority).
  Keys that are not accepted-by-time keys are counted in ``unparseable_keys``.
- Hours with accepted batches but no ledger yet are *missing* (the rollup is behind):
  limit the check with ``first_hour``/``last_hour`` to the hours the rollup has done.

Cost: one listing of the index and one GET per accepted batch (bounded concurrency);
ledger files only for mismatching hours. Memory: per-hour totals, plus the batches of
mismatching hours. Store errors propagate (a verification that could not read
everything has proved nothing).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from protocol import keys
from protocol.records import AcceptedManifest, IndexEntry, RecordError
from protocol.setsum import Setsum
from rollup.commit import load_latest, load_version
from rollup.ledger import ledger_rows, read_ledger
from rollup.manifest import EMPTY_LEDGER_HOUR, LedgerHour, Snapshot
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

    @property
    def complete(self) -> bool:
        return self.accepted == self.ledger and not self.detail

    def describe(self) -> str:
        if self.complete:
            return f"complete ({self.accepted.batches} batches, {self.accepted.records} records)"
        text = f"missing {self.missing} / extra {self.extra}"
        return f"{text} ({self.detail})" if self.detail else text


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Every checked hour, oldest first; ``ok`` when all are complete."""

    version: int | None
    hours: list[HourReport]
    unparseable_keys: int = 0

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


async def _frame_sha256(store: ObjectStore, key: str, identity: keys.BatchIdentity) -> str:
    try:
        body, _ = await store.get(key)
        return IndexEntry.from_json(body).frame_sha256
    except (NotFound, RecordError):
        body, _ = await store.get(keys.accepted_manifest_key(identity))
        return AcceptedManifest.from_json(body).frame_sha256


async def _accepted(
    store: ObjectStore, prefix: str, hours: set[str] | None, concurrency: int, bad: list[str]
) -> AsyncIterator[tuple[str, str, str, int]]:
    """``(hour, manifest_id, frame_sha256, record_count)`` of each accepted batch under
    ``prefix`` whose hour is in ``hours`` (None: all), fetched in bounded chunks."""
    limit = asyncio.Semaphore(concurrency)

    async def one(key: str, identity: keys.BatchIdentity) -> str:
        async with limit:
            return await _frame_sha256(store, key, identity)

    chunk: list[tuple[str, str, keys.BatchIdentity]] = []

    async def flush() -> list[tuple[str, str, str, int]]:
        shas = await asyncio.gather(*(one(key, ident) for key, _, ident in chunk))
        rows = [
            (hour, ident.manifest_id, sha, ident.seq_end - ident.seq_start + 1)
            for (_, hour, ident), sha in zip(chunk, shas, strict=True)
        ]
        chunk.clear()
        return rows

    async for info in store.list(prefix):
        try:
            hour, identity = keys.parse_accepted_by_time_key(info.key)
        except keys.KeyFormatError:
            bad.append(info.key)
            continue
        if hours is None or hour.iso in hours:
            chunk.append((info.key, hour.iso, identity))
        if len(chunk) >= 1000:
            for row in await flush():
                yield row
    for row in await flush():
        yield row


def _prefix_for(first: keys.UtcHour | None, last: keys.UtcHour | None) -> list[str]:
    if first is None or last is None:
        return [keys.ACCEPTED_BY_TIME_PREFIX]
    return [keys.accepted_by_time_hour_prefix(h) for h in keys.hours_between(first, last)]


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
) -> VerifyReport:
    """Check every accepted hour in ``[first_hour, last_hour]`` (default: all) against
    the latest snapshot (or ``version``). Before the first commit every accepted hour is
    missing everything."""
    loaded = await (load_latest(store) if version is None else load_version(store, version))
    snapshot = loaded.snapshot if loaded is not None else None
    bad: list[str] = []
    totals: dict[str, _HourTotals] = {}
    for prefix in _prefix_for(first_hour, last_hour):
        async for hour, manifest_id, sha, records in _accepted(
            store, prefix, None, concurrency, bad
        ):
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
    for hour in checked:
        accepted = totals[hour].frozen() if hour in totals else EMPTY_LEDGER_HOUR
        reports[hour] = HourReport(hour, accepted, ledger_hours.get(hour, EMPTY_LEDGER_HOUR))
    wrong = {h for h, r in reports.items() if not r.complete}
    if wrong:
        reports.update(await _explain(store, snapshot, reports, wrong, concurrency))
    return VerifyReport(
        version=snapshot.version if snapshot is not None else None,
        hours=[reports[h] for h in checked],
        unparseable_keys=len(bad),
    )


async def _explain(
    store: ObjectStore,
    snapshot: Snapshot | None,
    reports: dict[str, HourReport],
    wrong: set[str],
    concurrency: int,
) -> dict[str, HourReport]:
    """Batch-by-batch comparison of the mismatching hours."""
    accepted: dict[str, Counter[tuple[str, str]]] = {h: Counter() for h in wrong}
    for hour in sorted(wrong):
        prefix = keys.accepted_by_time_hour_prefix(keys.UtcHour.parse_iso(hour))
        async for row_hour, manifest_id, sha, _ in _accepted(
            store, prefix, {hour}, concurrency, []
        ):
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
    for hour in wrong:
        report = reports[hour]
        missing = sum((accepted[hour] - included[hour]).values())
        extra = sum((included[hour] - accepted[hour]).values())
        detail = ""
        if file_totals[hour].frozen() != report.ledger:
            detail = "ledger totals disagree with the ledger files"
        explained[hour] = HourReport(hour, report.accepted, report.ledger, missing, extra, detail)
    return explained
