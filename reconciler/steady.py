"""Steady-state discovery: accepted-by-time hours from a durable, CAS-updated checkpoint.

Each pass scans every ``accepted-by-time/v1/`` hour from ``checkpoint.next_hour -
lookback`` on (future hours included: collector clocks may run ahead), and for each entry
reads its manifest, backfills the manifest's other derived entries and HEADs its raw
blob (`reconciler.repair`). An entry whose key spells the agent as ``h-<sha256>``
(agent_ids over 82 bytes, PROTOCOL §3), or the long form where the rule says ``h-``
(written before the rule), does not name the manifest key by itself: its body's
``source_key`` does (one more GET; `protocol.derived.manifest_key_of_by_time_key`). The lookback (``reconciler.lookback_s``, rounded up to whole
hours) re-scans hours already passed, to catch entries written late: skewed collector
clocks, retried background writes, slow queues. Entries older than the lookback that are
missing altogether are the full audit's job.

Checkpoint (`ReconcilerCheckpoint`, ``reconciler/v1/checkpoint.json``): ``next_hour`` is
the first hour not known to be complete. A pass that finished without failures moves it
to the current hour (which stays open, so it is re-scanned next time), never backwards,
and never past now (a far-future hour from a broken clock must not hide the present).
A pass with failures leaves it where it was. The first pass ever starts at ``now -
lookback``: everything older is covered by the first full audit, which the daemon runs
on its first pass too.

Lag (status and ``lm_reconciler_lag_hours``): the number of hours from
``checkpoint.next_hour`` to the newest accepted-by-time hour not after now; 0 when the
checkpoint covers every existing hour. Without a checkpoint, every existing hour counts.

Entries examined by this process are remembered (a 64-bit digest per key, per hour, for
the hours inside the lookback window) so the re-scan lists them again but does not redo
their reads and writes; a restarted process re-checks its lookback window once. Closed
hours (before the current one) that a pass scanned completely are listed again only every
`CLOSED_HOUR_RESCAN_PASSES` passes; the current hour and later ones, every pass.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from dataclasses import dataclass, field

from protocol import derived, keys
from protocol.records import ReconcilerCheckpoint, RecordError
from store.base import ObjectStore
from store.cas import update_object
from store.errors import NotFound, StoreError
from store.lease import LeaseLost

from . import store_calls
from .context import ReconcilerContext
from .listing import hours_with_entries
from .problems import ProblemBook
from .repair import BlobCheck, Repairer, RepairOutcome

CHUNK = 64  # entries read and repaired concurrently (bounded by `concurrency` as well)
# A closed hour (before the current one) that a pass scanned completely is listed again
# only every this many passes: late entries are rare, and listing every lookback hour on
# every pass would cost more LIST requests than everything else the reconciler does.
CLOSED_HOUR_RESCAN_PASSES = 6
MAX_REMEMBERED = 2_000_000  # beyond this, forget everything (costs a re-check, no harm)


@dataclass
class SteadyResult:
    hours_scanned: int = 0
    hours_skipped: int = 0
    """Closed hours scanned completely by a recent pass and left alone this time."""
    entries_seen: int = 0
    entries_checked: int = 0
    outcome: RepairOutcome = field(default_factory=RepairOutcome)
    complete: bool = True
    checkpoint: ReconcilerCheckpoint | None = None
    lag_hours: int = 0


async def read_checkpoint(store: ObjectStore) -> ReconcilerCheckpoint | None:
    """The stored checkpoint, ``None`` when there is none. Raises `RecordError`."""
    try:
        body, _etag = await store.get(keys.RECONCILER_CHECKPOINT_KEY)
    except NotFound:
        return None
    return ReconcilerCheckpoint.from_json(body)


def lag_hours(
    next_hour: keys.UtcHour | None, oldest: keys.UtcHour | None, newest: keys.UtcHour | None
) -> int:
    """Hours of accepted-by-time data the checkpoint does not cover (see the module doc)."""
    if newest is None:
        return 0
    if next_hour is None:
        assert oldest is not None
        return _hours(oldest, newest) + 1
    return max(0, _hours(next_hour, newest))


def _hours(first: keys.UtcHour, last: keys.UtcHour) -> int:
    return (last.start_ns - first.start_ns) // (3600 * keys.NS_PER_S)


class SteadyScanner:
    """Runs steady-state passes; keep one per daemon so it remembers what it checked."""

    def __init__(self, ctx: ReconcilerContext) -> None:
        self._ctx = ctx
        self._seen: dict[keys.UtcHour, set[int]] = {}
        self._remembered = 0
        self._passes = 0
        self._closed_scanned_at: dict[keys.UtcHour, int] = {}  # hour -> pass number

    async def run_pass(self) -> SteadyResult:
        """One pass. Raises `LeaseLost` (stop: not the leader) and `RecordError` (the
        checkpoint is unreadable: an operator must look); store errors end it incomplete."""
        ctx = self._ctx
        await ctx.check_fence()
        result = SteadyResult()
        self._passes += 1
        try:
            checkpoint = await read_checkpoint(ctx.store)
        except StoreError as exc:
            ctx.metrics.store_failures.labels("checkpoint").inc()
            ctx.log.warning("checkpoint_read_failed", error=str(exc))
            result.complete = False
            return result
        now_hour = keys.UtcHour.from_unix_ns(ctx.clock.now_ns())
        base = keys.UtcHour.parse_iso(checkpoint.next_hour) if checkpoint else now_hour
        start = base.shifted(-math.ceil(ctx.reconciler_settings.lookback_s / 3600))
        self._forget_before(start)
        problems = ProblemBook(ctx)
        repairer = Repairer(ctx, problems)
        oldest: keys.UtcHour | None = None
        newest: keys.UtcHour | None = None
        try:
            await problems.load()
            async for hour in hours_with_entries(
                ctx.store, keys.ACCEPTED_BY_TIME_PREFIX, first=start
            ):
                if ctx.stopping.is_set():
                    result.complete = False
                    break
                if hour <= now_hour:
                    oldest = oldest or hour
                    newest = hour
                if hour < now_hour and self._recently_scanned(hour):
                    result.hours_skipped += 1
                    continue
                result.hours_scanned += 1
                if await self._scan_hour(hour, repairer, result) and hour < now_hour:
                    self._closed_scanned_at[hour] = self._passes
        except StoreError as exc:
            ctx.metrics.store_failures.labels("steady_list").inc()
            ctx.log.warning("steady_listing_failed", error=str(exc))
            result.complete = False
        result.checkpoint = checkpoint
        if result.complete:
            advanced = await self._advance(max(base, now_hour))
            if advanced is None:
                result.complete = False
            else:
                result.checkpoint = advanced
        covered = keys.UtcHour.parse_iso(result.checkpoint.next_hour) if result.checkpoint else None
        result.lag_hours = lag_hours(covered, oldest, newest)
        ctx.metrics.lag_hours.set(result.lag_hours)
        ctx.metrics.steady_passes.labels("complete" if result.complete else "incomplete").inc()
        eventful = result.entries_checked or result.outcome.problems or not result.complete
        (ctx.log.info if eventful else ctx.log.debug)(
            "steady_pass_done",
            hours=result.hours_scanned,
            entries=result.entries_seen,
            checked=result.entries_checked,
            repaired=dict(result.outcome.created),
            problems=dict(result.outcome.problems),
            failed=result.outcome.failed,
            complete=result.complete,
            next_hour=result.checkpoint.next_hour if result.checkpoint else None,
        )
        return result

    def _recently_scanned(self, hour: keys.UtcHour) -> bool:
        last = self._closed_scanned_at.get(hour)
        return last is not None and self._passes - last < CLOSED_HOUR_RESCAN_PASSES

    async def _scan_hour(
        self, hour: keys.UtcHour, repairer: Repairer, result: SteadyResult
    ) -> bool:
        """Check every entry of ``hour`` not checked before; True if all went well."""
        ctx = self._ctx
        seen = self._seen.setdefault(hour, set())
        failed_before = result.outcome.failed
        chunk: list[tuple[str, int]] = []
        async for info in ctx.store.list(keys.accepted_by_time_hour_prefix(hour)):
            result.entries_seen += 1
            ctx.metrics.entries_scanned.inc()
            digest = _digest(info.key)
            if digest not in seen:
                chunk.append((info.key, digest))
            if len(chunk) >= CHUNK:
                await self._check_chunk(hour, chunk, seen, repairer, result)
                chunk = []
                if ctx.stopping.is_set():
                    result.complete = False
                    return False
        if chunk:
            await self._check_chunk(hour, chunk, seen, repairer, result)
        return result.outcome.failed == failed_before

    async def _check_chunk(
        self,
        hour: keys.UtcHour,
        chunk: list[tuple[str, int]],
        seen: set[int],
        repairer: Repairer,
        result: SteadyResult,
    ) -> None:
        limit = asyncio.Semaphore(self._ctx.reconciler_settings.concurrency)

        async def one(key: str) -> RepairOutcome:
            async with limit:
                return await self._check_entry(hour, key, repairer)

        outcomes = await asyncio.gather(*(one(key) for key, _ in chunk))
        for (_key, digest), outcome in zip(chunk, outcomes, strict=True):
            result.outcome.add(outcome)
            result.entries_checked += 1
            if outcome.failed:
                result.complete = False
            else:
                seen.add(digest)
                self._remembered += 1
        if self._remembered > MAX_REMEMBERED:
            self._seen.clear()
            self._remembered = 0

    async def _check_entry(self, hour: keys.UtcHour, key: str, repairer: Repairer) -> RepairOutcome:
        ctx = self._ctx
        try:
            _hour, named = keys.parse_accepted_by_time_key(key)
        except keys.KeyFormatError:
            ctx.metrics.dangling_entries.inc()
            ctx.log.warning("index_entry_malformed", key=key)
            return RepairOutcome()
        manifest_key = derived.manifest_key_of_by_time_key(hour, named, key)
        if manifest_key is None:  # an h- entry, or a long one of before the segment rule
            try:
                body = await store_calls.read(ctx, key)
                if body is None:
                    return RepairOutcome()  # gone since the listing: nothing to check
                manifest_key = derived.by_time_source(named, body)
            except StoreError as exc:
                ctx.metrics.store_failures.labels("read_index_entry").inc()
                ctx.log.warning("index_entry_read_failed", key=key, error=str(exc))
                return RepairOutcome(failed=1)
            except RecordError as exc:
                ctx.metrics.dangling_entries.inc()
                ctx.log.warning("index_entry_malformed", key=key, error=str(exc))
                return RepairOutcome()
        outcome = await repairer.manifest_at(
            manifest_key, blob_check=BlobCheck.HEAD, listed_in_hour=hour
        )
        if outcome.missing_source:
            ctx.metrics.dangling_entries.inc()
            ctx.log.warning("index_entry_dangling", key=key, manifest_key=manifest_key)
        return outcome

    async def _advance(self, next_hour: keys.UtcHour) -> ReconcilerCheckpoint | None:
        """CAS the checkpoint forward to ``next_hour``; ``None`` if the store did not settle."""
        ctx = self._ctx
        epoch = ctx.epoch
        now = ctx.clock.now_ns()

        def mutate(body: bytes | None) -> bytes:
            target = next_hour
            if body is not None:
                current = ReconcilerCheckpoint.from_json(body)
                if current.owner_epoch > epoch:
                    # A newer leader wrote it: we are stale even if our clock disagrees.
                    raise LeaseLost(
                        keys.RECONCILER_LEASE_KEY,
                        epoch,
                        f"checkpoint written under epoch {current.owner_epoch}",
                    )
                target = max(target, keys.UtcHour.parse_iso(current.next_hour))
            return ReconcilerCheckpoint(
                next_hour=target.iso, updated_at_unix_ns=now, owner_epoch=epoch
            ).to_json()

        await ctx.check_fence()
        try:
            stored = await update_object(
                ctx.store,
                keys.RECONCILER_CHECKPOINT_KEY,
                mutate,
                backoff=ctx.backoff,
                rng=ctx.rng,
                clock=ctx.clock,
            )
        except StoreError as exc:
            ctx.metrics.store_failures.labels("checkpoint").inc()
            ctx.log.warning("checkpoint_update_failed", error=str(exc))
            return None
        except RecordError as exc:
            ctx.log.error("checkpoint_unreadable", error=str(exc))
            raise
        assert stored.body is not None
        checkpoint = ReconcilerCheckpoint.from_json(stored.body)
        ctx.metrics.note_checkpoint(checkpoint.updated_at_unix_ns)
        return checkpoint

    def _forget_before(self, start: keys.UtcHour) -> None:
        for hour in [h for h in self._seen if h < start]:
            self._remembered -= len(self._seen.pop(hour))
        for hour in [h for h in self._closed_scanned_at if h < start]:
            del self._closed_scanned_at[hour]


def _digest(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
