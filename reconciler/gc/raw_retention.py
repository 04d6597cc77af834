"""Raw retention (PROTOCOL §4.1): which accepted hours no longer keep their raw blobs.

Off by default (``[retention] raw_days``). Raw retention never deletes anything itself:
it *retires* accepted hours, and a retired hour's accepted rows stop counting as
references in the audit's blob join (`reconciler.audit.engines.sql`, `reconciler.audit.retired`). A blob referenced only by
such rows is then an orphan of kind ``raw-retention`` in the audit's orphan file, and the
GC deletes it by the whole procedure of PROTOCOL §3.5 — mark, grace, veto, the targeted
proof in raw retention's variant (the manifest names the blob, its hour is still retired,
the latest ledger includes the batch: `reconciler.gc.proof`), the ``deleting`` state, a
signed DELETE within the lease — with "rolled up and past raw retention" in place of
rule 2. The manifests stay: a re-send is
still answered as a duplicate (its blob may be created again; it is retired again).

**Bundles** (PROTOCOL §3.10) go only whole. The audit joins rows to raw objects by key,
so a bundle is a ``raw-retention`` orphan only when every row naming it is retired (every
frame whose manifest names it is of a retired hour); rule 7's variant then checks every
such frame's manifest against the ledger (`reconciler.gc.proof`), and frames whose
manifests name another raw object (duplicates: dead bytes) do not count. A frame that
will never retire — late-excluded or lost (its hour's catalog never equals its ledger
hour, so the hour is never retired), or retracted — keeps its whole bundle: *pinned*
(`lm-reconciler status` shows the bytes, from the audit).

**Retiring** (`RawRetentionAdvance`, run before each GC run): accepted hours are retired
in order, never skipped, and ``gc/v1/raw-retention.json`` (`records.RawRetention`) only
moves forward. An hour H is retired when all hold:
1. H ended at least ``raw_days`` ago in store time (PROTOCOL §3.8);
2. H is *sealed*: a completed listing audit of the index started at least the settle
   margin (`config.Settings.settle_margin_s`) after H ended, so H's catalog holds every
   batch accepted in H (PROTOCOL §3.7) and no later batch can be stamped in H;
3. the rollup's latest snapshot includes every one of them: its ledger hour has the
   catalog hour's batch count and setsum (PROTOCOL §4).

**Re-checked by every audit** (`Retired.holds`, in `reconciler.audit.retired.settle_retired`): a retired hour
lets go of its accepted rows' blobs only while its catalog holds exactly as many
accepted batches as the ledger hour (unique keys) and none of its catalog files was
moved aside. The catalog of a sealed hour only grows, and at retirement its batches were
the ledger's, so an equal count means the same batches: a batch cataloged into a retired
hour later (which sealing rules out, but a broken clock or log could cause) makes the
counts differ, the hour keeps its blobs, and a ``raw-retention-mismatch`` problem names
it. Quarantine rows reference their blobs in every hour, retired or not.

**Cost**: per GC run, one GET of the state (and, when an hour may be retirable, the
audit records' listing, the rollup pointer and snapshot, and one catalog LIST from the
first unretired hour); each accepted hour's catalog is read once, when it retires (an
hour that cannot retire yet is read again only once the snapshot version or its catalog
files changed); one PUT when the state moves. Per audit: one GET of the state and two of
the snapshot (only when something is retired). Per retired batch, the GC's deletion
(measured in `tests/reconciler/test_raw_retention.py`): 2 PUTs (the mark, ``deleting``)
and a share of the run's one log file, 2 DELETEs (the blob, the mark), HEADs of the blob
and the veto, 4-5 GETs of the mark over the two runs it takes, and the targeted proof
twice (the blob read whole, a GET of its manifest, a LIST of its quarantine prefix) —
more than the batch's acceptance (2 PUTs); the README's
"Raw retention" says when that pays for the storage it frees. A bundle of n frames costs
the same per object, and per frame only its manifest GETs (2n over the two proofs) plus 2
LISTs per agent/boot pair (`tests/reconciler/test_gc_bundles.py` counts them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import structlog

from index.audits import sealed_limit_ns
from protocol import keys, records
from rollup.table.commit import load_latest
from rollup.table.ledger import read_catalog_totals
from rollup.table.manifest import LedgerHour, RollupManifestError
from store.base import ObjectInfo, ObjectStore
from store.errors import NotFound, PreconditionFailed, StoreError

log = structlog.get_logger("reconciler.gc.raw_retention")
Fence = Callable[[], Awaitable[None]]
NS_PER_DAY = 86_400 * keys.NS_PER_S
MAX_HOURS_PER_RUN = 1_000
"""Catalog hours one run reads at most: a first run over a long history retires it over
several runs, each bounded in time and requests (progress is logged every 100 hours)."""
MAX_BATCHES_PER_RUN = 100_000
"""A run stops retiring before the next hour once it retired this many batches (at least
one hour always): every retired batch becomes a mark and a deletion of the GC's, whose
runs hold their marks in memory, so a first run over a long history must not hand it
millions at once."""


@dataclass(frozen=True, slots=True)
class Retired:
    """What an audit may treat as retired: hours before ``before_ns``, each re-checked
    against ``ledger`` (the rollup snapshot's ledger hours)."""

    before_ns: int = 0
    ledger: Mapping[str, LedgerHour] = field(default_factory=dict)

    def covers(self, hour: keys.UtcHour) -> bool:
        return hour.start_ns < self.before_ns

    def holds(self, hour: keys.UtcHour, accepted_batches: int) -> bool:
        """Whether ``hour``, whose catalog holds ``accepted_batches`` unique accepted
        batches, may let go of its accepted rows' blobs (see the module docstring)."""
        ledger = self.ledger.get(hour.iso)
        return self.covers(hour) and accepted_batches == (ledger.batches if ledger else 0)


NOTHING_RETIRED = Retired()


async def read_state(store: ObjectStore) -> tuple[records.RawRetention | None, str | None]:
    """The state and its ETag; ``(None, None)`` before anything was retired. Raises
    `records.RecordError` when it does not parse (nobody may take that for "none")."""
    try:
        body, etag = await store.get(keys.RAW_RETENTION_KEY)
    except NotFound:
        return None, None
    return records.RawRetention.from_json(body), etag


async def retired_for_audit(store: ObjectStore) -> Retired:
    """The retired hours an audit may use. Fails closed: with a state but no readable
    rollup snapshot, nothing counts as retired (blobs are kept; deleted ones are then
    reported missing, which is the truth as far as this audit can prove)."""
    try:
        state, _etag = await read_state(store)
        if state is None:
            return NOTHING_RETIRED
        loaded = await load_latest(store)
    except (StoreError, records.RecordError, RollupManifestError) as exc:
        log.error("raw_retention_unreadable", error=str(exc))
        return NOTHING_RETIRED
    if loaded is None:
        log.error("raw_retention_without_snapshot", retired_before=state.retired_before)
        return NOTHING_RETIRED
    before = keys.UtcHour.parse_iso(state.retired_before).start_ns
    return Retired(before, dict(loaded.snapshot.ledger_hours))


def first_unexpired_ns(now_ns: int, raw_days: float) -> int:
    """Start of the first accepted hour that did not end ``raw_days`` before ``now_ns``."""
    return keys.UtcHour.from_unix_ns(max(0, now_ns - int(raw_days * NS_PER_DAY))).start_ns


@dataclass(frozen=True, slots=True)
class _Blocked:
    """The hour a run could not retire, and what it saw: it is read again only when the
    snapshot version or the hour's catalog files changed."""

    hour: str
    version: int
    files: tuple[tuple[str, str], ...]


class RawRetentionAdvance:
    """Moves ``gc/v1/raw-retention.json`` forward (one per reconciler process: it keeps
    the hour it could not retire, so an unchanged hour is not read again)."""

    def __init__(
        self,
        *,
        raw_days: float,
        settle_margin_s: float,
        max_batches_per_run: int = MAX_BATCHES_PER_RUN,
    ) -> None:
        self.raw_days = raw_days
        self.margin_ns = int(settle_margin_s * keys.NS_PER_S)
        self.max_batches_per_run = max_batches_per_run
        self._blocked: _Blocked | None = None

    async def run(
        self,
        store: ObjectStore,
        *,
        now_ns: int,
        audit_started_ns: int | None,
        fence: Fence,
        dry_run: bool = False,
    ) -> records.RawRetention | None:
        """Retire what can be retired; the state after it (None: nothing retired ever).

        ``now_ns`` is store time; ``audit_started_ns`` the start of the newest completed
        listing audit of the index. Raises store errors (nothing was written then, or the
        state moved to a value this run proved)."""
        state, etag = await read_state(store)
        limit_ns = min(
            first_unexpired_ns(now_ns, self.raw_days),
            sealed_limit_ns(audit_started_ns, self.margin_ns),
        )
        start_ns = keys.UtcHour.parse_iso(state.retired_before).start_ns if state else 0
        if start_ns >= limit_ns:
            return state
        loaded = await load_latest(store)
        if loaded is None:
            return state  # nothing is rolled up yet: no hour can be included
        snapshot = loaded.snapshot
        before, retired = await self._walk(
            store, snapshot.version, snapshot.ledger_hours, start_ns, limit_ns
        )
        if before.start_ns <= start_ns or retired == 0:
            return state  # only empty hours passed: nothing to write (they cost one LIST)
        new = records.RawRetention(
            retired_before=before.iso,
            retired_batches=(state.retired_batches if state else 0) + retired,
            updated_at_unix_ns=now_ns,
            raw_days=self.raw_days,
        )
        log.info(
            "raw_retention_advanced",
            retired_before=new.retired_before,
            batches=retired,
            dry_run=dry_run,
        )
        if dry_run:
            return new
        await fence()
        try:
            if etag is None:
                await store.put(keys.RAW_RETENTION_KEY, new.to_json(), if_none_match=True)
            else:
                await store.put(keys.RAW_RETENTION_KEY, new.to_json(), if_match=etag)
        except PreconditionFailed:
            log.warning("raw_retention_changed_under_us")  # another leader moved it: next run
            return state
        return new

    async def _walk(
        self,
        store: ObjectStore,
        version: int,
        ledger: Mapping[str, LedgerHour],
        start_ns: int,
        limit_ns: int,
    ) -> tuple[keys.UtcHour, int]:
        """The first hour not retired and the batches retired, walking the catalog's
        hours in ``[start_ns, limit_ns)``. Hours without catalog files hold no batch."""
        start = keys.UtcHour.from_unix_ns(start_ns)
        retired = 0
        hours_read = 0
        files_of: dict[keys.UtcHour, list[ObjectInfo]] = {}
        async for info in store.list(
            keys.INDEX_CATALOG_PREFIX, start_after=keys.index_catalog_hour_prefix(start)
        ):
            try:
                hour = keys.parse_index_catalog_key(info.key)[0]
            except keys.KeyFormatError:
                continue
            if hour.start_ns >= limit_ns:
                break
            if hour not in files_of and len(files_of) == MAX_HOURS_PER_RUN:
                break
            files_of.setdefault(hour, []).append(info)
        for hour, files in files_of.items():  # the listing starts at ``start``
            if retired >= self.max_batches_per_run:
                return hour, retired  # the rest next run
            seen = tuple((info.key, info.etag) for info in files)
            if self._blocked == _Blocked(hour.iso, version, seen):
                return hour, retired
            totals = await read_catalog_totals(store, hour)
            have = ledger.get(hour.iso)
            if totals.batches and (
                have is None or (have.batches, have.setsum) != (totals.batches, totals.setsum)
            ):
                self._blocked = _Blocked(hour.iso, version, seen)
                log.info(
                    "raw_retention_waits_for_rollup",
                    hour=hour.iso,
                    catalog_batches=totals.batches,
                    ledger_batches=have.batches if have else 0,
                )
                return hour, retired
            retired += totals.batches
            hours_read += 1
            if hours_read % 100 == 0:
                log.info("raw_retention_progress", through=hour.iso, batches=retired)
        if len(files_of) == MAX_HOURS_PER_RUN:
            return max(files_of).next(), retired
        return keys.UtcHour.from_unix_ns(limit_ns), retired
