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
  and ``seq_start..seq_end``); where the key spells the agent as ``h-<sha256>``
  (agent_ids over 82 bytes, PROTOCOL §3), the agent comes from the manifest key the
  entry's body names, or from that manifest; an entry whose batch cannot be known that
  way is counted in ``unparseable_keys``;
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

from protocol import derived, keys
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


async def _batch(store: ObjectStore, key: str, named: keys.KeyIdentity) -> tuple[str, str] | None:
    """``(manifest_id, frame_sha256)`` of the batch the accepted-by-time entry ``key``
    names; ``None`` when that cannot be known (an ``h-`` entry whose body is unreadable or
    names another batch)."""
    try:
        body, _ = await store.get(key)
        entry: IndexEntry | None = IndexEntry.from_json(body)
    except (NotFound, RecordError):
        entry = None
    identity = named.identity
    if identity is not None and entry is not None:
        return identity.manifest_id, entry.frame_sha256
    candidates: list[str | None]
    if identity is not None:  # the body is lost: the manifest, in either agent form
        candidates = [
            keys.accepted_manifest_key(identity),
            keys.legacy_accepted_manifest_key(identity),
        ]
    elif entry is not None:  # an h- key (PROTOCOL §3): the body names the manifest
        try:
            manifest_key = derived.by_time_source(named, body)
        except RecordError:
            return None
        source = keys.parse_accepted_manifest_key(manifest_key).identity
        if source is not None:  # a manifest key that spells the agent
            return source.manifest_id, entry.frame_sha256
        candidates = [manifest_key]
    else:
        return None
    for candidate in filter(None, candidates):
        try:
            manifest = AcceptedManifest.from_json((await store.get(candidate))[0])
        except NotFound:
            continue
        if not keys.identity_matches_key(manifest.identity, named):
            return None
        return manifest.identity.manifest_id, (entry or manifest).frame_sha256
    raise NotFound("get", str(candidates[0]))


async def _accepted(
    store: ObjectStore, prefix: str, hours: set[str] | None, concurrency: int, bad: list[str]
) -> AsyncIterator[tuple[str, str, str, int]]:
    """``(hour, manifest_id, frame_sha256, record_count)`` of each accepted batch under
    ``prefix`` whose hour is in ``hours`` (None: all), fetched in bounded chunks.

    A batch is counted once even when its entry exists in both agent forms of PROTOCOL
    §3 (a store written before the segment rule, then backfilled): entries whose key is
    not the form the rule gives (``h-``, or hex where the rule says ``h-``) are remembered
    per hour, and a second one of the same batch is skipped."""
    limit = asyncio.Semaphore(concurrency)
    long_agents: dict[str, set[keys.KeyIdentity]] = {}

    async def one(key: str, named: keys.KeyIdentity) -> tuple[str, str] | None:
        async with limit:
            return await _batch(store, key, named)

    chunk: list[tuple[str, str, keys.KeyIdentity]] = []

    async def flush() -> list[tuple[str, str, str, int]]:
        found = await asyncio.gather(*(one(key, named) for key, _, named in chunk))
        rows = []
        for (key, hour, named), batch in zip(chunk, found, strict=True):
            if batch is None:
                bad.append(key)
                continue
            rows.append((hour, batch[0], batch[1], named.seq_end - named.seq_start + 1))
        chunk.clear()
        return rows

    async for info in store.list(prefix):
        try:
            hour, named = keys.parse_accepted_by_time_key(info.key)
        except keys.KeyFormatError:
            bad.append(info.key)
            continue
        if hours is not None and hour.iso not in hours:
            continue
        identity = named.identity
        if identity is None or keys.accepted_by_time_key(hour, identity) != info.key:
            seen = long_agents.setdefault(hour.iso, set())
            if named in seen:
                continue  # the same batch's entry in the other form
            seen.add(named)
        chunk.append((info.key, hour.iso, named))
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
