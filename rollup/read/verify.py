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

Per hour, the catalog without retracted rows = included + retired + late_excluded + lost
(all in ``ledger.hours``); batches removed after their key was retracted are beside it
(``ledger.retracted``, shown per hour) and no longer in the ledger files.

Batches acknowledged as lost (`rollup.lifecycle.lost`: the blob is gone or corrupt) are ledger
rows like any other, so their hour is complete; the hour says how many, and the report
lists each (who acknowledged it, when and why). For hours that are not complete the
report lists the batches still *waiting* (at most `MAX_WAITING`), each with the problem
the rollup recorded for its raw object (``missing-blob``/``corrupt-blob``/``bad-range``:
what ``lm-rollup acknowledge-lost`` settles) or none (the rollup is behind); a bundled
batch's problem names its bundle, found through its manifest only when some recorded
problem matched no frame blob (PROTOCOL §3.10).

A batch the ledger already holds otherwise than the catalog row that counts for its key
fails its hour, naming the key and the differing fields (PROTOCOL §3.7: an audit wrote a
superseding row after the rollup included the batch; the hour must be rebuilt): another
``frame_sha256`` or ``record_count`` than the ledger's, or the key's newest row in another
of the checked hours (`rollup.read.verify_ledger`; a key moved to an hour outside
``first_hour``/``last_hour`` is not seen: check the whole range).

Cost: the catalog's files (or one GET per manifest); ledger files only for mismatching
hours and hours holding a superseded key's older row. Memory: bounded, never an hour as
Python objects (PROTOCOL §3.9): each hour's batches are written out of core by DuckDB to
a local work directory (``limits.spill_dir``; disk grows with the hours checked), and
compared with the ledger there (`rollup.read.verify_sources`, `rollup.read.verify_ledger`). Store
errors propagate (a verification that could not read everything has proved nothing).
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa

from index.catalog_local import MergeLimits
from index.catalog_tables import write_empty_batches
from protocol import keys
from protocol.records import AcceptedManifest, RecordError
from rollup.read.verify_ledger import compare_hour, moved_rows
from rollup.read.verify_sources import catalog_hours, in_range, manifest_batches
from rollup.table import schemas
from rollup.table.commit import load_latest, load_version
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
    superseded: tuple[str, ...] = ()
    """Batches the ledger holds otherwise than the catalog row that counts (another hash
    or record count, or the key's newest row in another hour), each naming its key and
    the fields (`rollup.read.verify_ledger`, at most `MAX_NAMED`)."""
    superseded_total: int = 0
    retracted: LedgerHour = EMPTY_LEDGER_HOUR
    """Batches removed after their key was retracted (`rollup.table.ledger_retracted`):
    beside ``ledger``, which the catalog without retracted rows must equal."""

    @property
    def complete(self) -> bool:
        return self.accepted == self.ledger and not self.detail and not self.superseded_total

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
            if self.retracted.batches:
                text += f"; {self.retracted.batches} retracted"
            return text
        text = f"missing {self.missing} / extra {self.extra}"
        text = f"{text} ({self.detail})" if self.detail else text
        if self.superseded_total:
            text += (
                f"; {self.superseded_total} batch(es) in the ledger superseded in the catalog "
                f"(rebuild the hour): " + "; ".join(self.superseded)
            )
        return text


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


async def verify(
    store: ObjectStore,
    *,
    version: int | None = None,
    first_hour: keys.UtcHour | None = None,
    last_hour: keys.UtcHour | None = None,
    concurrency: int = 32,
    from_manifests: bool = False,
    limits: MergeLimits | None = None,
) -> VerifyReport:
    """Check every accepted hour in ``[first_hour, last_hour]`` (default: all) against
    the latest snapshot (or ``version``). Before the first commit every accepted hour is
    missing everything. ``from_manifests``: the accepted batches come from
    ``accepted/v1/`` itself instead of the catalog. ``limits``: DuckDB's memory limit and
    the local work directory (the checked hours' batches are written there)."""
    loaded = await (load_latest(store) if version is None else load_version(store, version))
    snapshot = loaded.snapshot if loaded is not None else None
    limits = limits or MergeLimits()
    bad: list[str] = []
    with tempfile.TemporaryDirectory(prefix="lm-verify-", dir=limits.spill_dir) as work:
        if from_manifests:
            path = str(Path(work, "manifests.parquet"))
            totals = await manifest_batches(store, concurrency, first_hour, last_hour, bad, path)
            files = {hour: path for hour in totals}
            moved = pa.table({})  # a manifest is in one hour
        else:
            totals, files = await catalog_hours(store, first_hour, last_hour, work, limits)
            moved = await asyncio.to_thread(moved_rows, sorted(set(files.values())), limits, work)
        ledger_hours = snapshot.ledger_hours if snapshot is not None else {}
        checked = sorted(
            h for h in set(totals) | set(ledger_hours) if in_range(h, first_hour, last_hour)
        )
        reports: dict[str, HourReport] = {}
        late = snapshot.ledger_late if snapshot is not None else {}
        lost = snapshot.lost_hours if snapshot is not None else {}
        retracted = snapshot.retracted_hours if snapshot is not None else {}
        retired_before = _retired_before(snapshot)
        for hour in checked:
            reports[hour] = HourReport(
                hour,
                totals.get(hour, EMPTY_LEDGER_HOUR),
                ledger_hours.get(hour, EMPTY_LEDGER_HOUR),
                late=late.get(hour, EMPTY_LEDGER_HOUR),
                retired=retired_before is not None and hour < retired_before,
                lost=lost.get(hour, EMPTY_LEDGER_HOUR),
                retracted=retracted.get(hour, EMPTY_LEDGER_HOUR),
            )
        # Batch by batch: hours whose totals disagree, and hours holding a row of a key
        # whose newest row is in another hour (their totals may agree: PROTOCOL §3.7).
        moved_hours = set(moved.column("accepted_hour").to_pylist()) if moved.num_rows else set()
        explain = {h for h, r in reports.items() if not r.complete} | (moved_hours & set(reports))
        waiting: list[tuple[str, str, str]] = []
        waiting_total = 0
        for hour in sorted(explain):
            batches = files.get(hour) or str(Path(work, f"empty-{hour}.parquet"))
            if hour not in files:
                await asyncio.to_thread(write_empty_batches, batches)
            found = await compare_hour(
                store, snapshot, hour, batches, moved, limits, limit=MAX_WAITING
            )
            report = reports[hour]
            detail = ""
            if found.ledger_totals != report.ledger:
                detail = "ledger totals disagree with the ledger files"
            if report.complete and not detail and not found.superseded_total:
                continue  # a moved key this hour's ledger does not hold
            reports[hour] = replace(
                report,
                missing=found.missing,
                extra=found.extra,
                detail=detail,
                superseded=tuple(found.superseded),
                superseded_total=found.superseded_total,
            )
            waiting += [(hour, mid, sha) for mid, sha in found.absent]
            waiting_total += found.missing
    return VerifyReport(
        version=snapshot.version if snapshot is not None else None,
        hours=[reports[h] for h in checked],
        unparseable_keys=len(bad),
        lost=tuple(
            b for b in (snapshot.ledger_lost if snapshot else ()) if b.accepted_hour in reports
        ),
        waiting=await _waiting(store, sorted(waiting)[:MAX_WAITING]),
        waiting_total=waiting_total,
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
        found.append(
            _waiting_one(
                hour, keys.accepted_manifest_key(identity), keys.raw_blob_key(sha), recorded
            )
        )
    # A bundled batch's problem names its bundle (PROTOCOL §3.10), which only its manifest
    # says: read the manifests of batches without a problem, only when a recorded problem
    # matched none (none recorded, or all matched: no request at all).
    matched = {keys.problem_key(w.problem, w.blob_key) for w in found if w.problem is not None}
    if set(recorded) - matched:
        for i, waiting in enumerate(found):
            if waiting.problem is None:
                raw_key = await _raw_key_of(store, waiting.manifest_key)
                if raw_key is not None and raw_key != waiting.blob_key:
                    found[i] = _waiting_one(waiting.hour, waiting.manifest_key, raw_key, recorded)
    return tuple(found)


def _waiting_one(hour: str, manifest_key: str, raw_key: str, recorded: dict[str, str]) -> Waiting:
    problem = next(
        (kind for kind in LOST_PROBLEMS if keys.problem_key(kind, raw_key) in recorded), None
    )
    return Waiting(hour, manifest_key, raw_key, problem)


async def _raw_key_of(store: ObjectStore, manifest_key: str) -> str | None:
    """The raw object the stored manifest names (None: gone or unreadable)."""
    try:
        body, _etag = await store.get(manifest_key)
        return AcceptedManifest.from_json(body, reads_bundles=True).raw_blob_key
    except (NotFound, RecordError):
        return None


def _retired_before(snapshot: Snapshot | None) -> str | None:
    """The first accepted hour not retired: hours before it are before every table's
    retention cutoff (None: some table keeps everything)."""
    if snapshot is None or set(snapshot.retention) != set(schemas.TABLES):
        return None
    return min(snapshot.retention.values())
