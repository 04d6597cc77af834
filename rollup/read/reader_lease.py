"""Reader leases (PROTOCOL §4.1 "Readers and vacuum"): a long read pins its snapshot.

A lease is ``rollup/v1/readers/<id>.json`` (`protocol.records.RollupReaderLease`): the
snapshot's version and manifest key, an expiry in store time (`store.time`, PROTOCOL
§3.8), and what the read is for. It is created with If-None-Match under a fresh id,
renewed with If-Match by a background task every third of its TTL while the read runs,
and deleted when the read ends. `rollup.lifecycle.vacuum` keeps every file of a snapshot an
unexpired lease pins, and deletes leases that have expired (a reader that crashed).
Which reads take one, and what a read does when a file vanishes anyway:
`rollup.read.read_guard`.

Bounds: renewals stop after ``max_hold_s`` (a hung reader cannot hold vacuum back for
ever) and when a renewal finds the lease changed or gone; a failed renewal is retried
after a short jittered delay while the lease has more than a sixth of its TTL left (a
renewal must land well before the expiry vacuum judges by), then the lease lapses.
Either way the read goes on, guarded by `rollup.read.read_guard`.

A vacuum already running: vacuum reads the leases once, after taking the owner lease
and listing what it could delete, so a lease written later does not protect that run's
deletions. A lease therefore protects a read from the moment no vacuum that missed it
is running: after writing it a reader reads the owner lease (one GET), and while a
vacuum (`rollup.table.owner.VACUUM_OWNER_PREFIX`) holds it unexpired and the pinned snapshot is
not the current one (one more GET tells; see `wait_out_running_vacuum` for why the
current one is safe), the reader waits, polling with jittered
delays, for at most ``max_hold_s``. Every vacuum that takes the owner lease afterwards
reads the leases after that and sees ours, so from then on no file of the snapshot
goes; one that vacuum removed before is found missing by the read, which retries or
fails clearly (`rollup.read.read_guard`), never returning fewer rows. (Vacuum checks its
owner lease just before deleting, so one whose lease ran out deletes nothing.)
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

import structlog

from protocol import keys
from protocol.clock import Clock
from protocol.records import LeaseRecord, RecordError, RollupReaderLease
from rollup.table.commit import LoadedSnapshot, load_latest
from rollup.table.owner import VACUUM_OWNER_PREFIX
from store.base import ObjectInfo, ObjectStore
from store.errors import (
    ConditionConflict,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    StoreError,
    Unavailable,
)
from store.retry import Backoff
from store.time import store_clock

log = structlog.get_logger(__name__)

_TAKE_BACKOFF = Backoff(attempts=4, base_s=0.05, cap_s=1.0)


class ReaderLeaseLost(Exception):
    """Our lease record changed or is gone (vacuum deleted it as expired): it no longer
    pins anything. The read goes on; a vanished file is then retried or reported."""


class ReaderLease:
    """A lease we hold on one snapshot. Take with `ReaderLease.take`."""

    def __init__(
        self,
        store: ObjectStore,
        record: RollupReaderLease,
        etag: str,
        *,
        ttl_s: float,
        clock: Clock,
    ) -> None:
        self.store = store
        self.record = record
        self.etag = etag
        self.ttl_s = ttl_s
        self.clock = store_clock(store, clock)
        self.lost: str | None = None

    @property
    def key(self) -> str:
        return keys.rollup_reader_key(self.record.reader)

    @classmethod
    async def take(
        cls,
        store: ObjectStore,
        loaded: LoadedSnapshot,
        *,
        purpose: str,
        ttl_s: float,
        clock: Clock,
        rng: random.Random | None = None,
    ) -> ReaderLease:
        """Create a lease pinning ``loaded`` for ``ttl_s`` seconds of store time."""
        if ttl_s <= 0:
            raise ValueError(f"reader lease ttl_s must be > 0, got {ttl_s}")
        now_ns = store_clock(store, clock).now_ns()
        record = RollupReaderLease(
            reader=str(uuid.uuid4()),
            version=loaded.snapshot.version,
            manifest_key=loaded.manifest_key,
            expires_at_unix_ns=now_ns + int(ttl_s * 1e9),
            purpose=purpose[:200],
        )
        key, body = keys.rollup_reader_key(record.reader), record.to_json()
        delays = _TAKE_BACKOFF.delays(rng or random.Random())
        while True:
            # Safe to repeat: the key is new (a random id) and the create is
            # If-None-Match, so a repeat creates it once or finds our own bytes.
            try:
                etag = await store.put(key, body, if_none_match=True)
                break
            except PreconditionFailed:
                stored, etag = await store.get(key)
                if stored != body:
                    raise
                break  # an earlier attempt whose answer was lost did land
            except (ConditionConflict, Unavailable):
                delay = next(delays, None)
                if delay is None:
                    raise
                await clock.sleep(delay)
        return cls(store, record, etag, ttl_s=ttl_s, clock=clock)

    def is_valid(self, margin_s: float = 0.0) -> bool:
        """True while the latest the store's clock may read is before the expiry."""
        return (
            self.lost is None
            and self.clock.latest_ns() + int(margin_s * 1e9) < self.record.expires_at_unix_ns
        )

    async def renew(self) -> None:
        """Push the expiry to ``ttl_s`` from now (If-Match on our last write).
        `ReaderLeaseLost` if the record changed or is gone; store errors as they come
        (`Unavailable`: did not land, retry while `is_valid`)."""
        if self.lost is not None:
            raise ReaderLeaseLost(self.lost)
        record = self.record.model_copy(
            update={"expires_at_unix_ns": self.clock.now_ns() + int(self.ttl_s * 1e9)}
        )
        body = record.to_json()
        try:
            self.etag = await self.store.put(self.key, body, if_match=self.etag)
        except PreconditionFailed as exc:
            self.lost = f"reader lease {self.key} changed or was deleted"
            raise ReaderLeaseLost(self.lost) from exc
        except OutcomeUnknown:
            # The answer was lost: our bytes there mean it landed.
            try:
                stored, etag = await self.store.get(self.key)
            except NotFound as exc:
                self.lost = f"reader lease {self.key} was deleted"
                raise ReaderLeaseLost(self.lost) from exc
            if stored != body:
                raise
            self.etag = etag
        self.record = record

    async def release(self) -> None:
        """Delete the lease (best effort: an undeleted one expires, and vacuum removes it)."""
        self.lost = self.lost or "released"
        try:
            await self.store.delete(self.key)
        except StoreError as exc:
            log.warning("rollup_reader_lease_not_deleted", key=self.key, error=str(exc))

    async def keep_renewed(self, *, max_hold_s: float, rng: random.Random | None = None) -> None:
        """Renew every third of the TTL until cancelled, ``max_hold_s`` has passed, the
        lease is lost, or it lapsed because renewals kept failing. Never raises."""
        rng = rng or random.Random()
        started = self.clock.monotonic()
        delay = self.ttl_s / 3
        while True:
            await self.clock.sleep(delay)
            if self.clock.monotonic() - started >= max_hold_s:
                log.warning("rollup_reader_lease_max_hold", key=self.key, max_hold_s=max_hold_s)
                return
            if not self.is_valid(margin_s=self.ttl_s / 6):
                # Too close to the expiry: a renewal landing after it could be one that
                # vacuum, having judged the lease expired, never sees. Let it lapse.
                log.warning("rollup_reader_lease_lapsed", key=self.key)
                return
            try:
                await self.renew()
                delay = self.ttl_s / 3
            except ReaderLeaseLost as exc:
                log.warning("rollup_reader_lease_lost", key=self.key, error=str(exc))
                return
            except (Unavailable, ConditionConflict) as exc:
                if not self.is_valid():
                    log.warning("rollup_reader_lease_lapsed", key=self.key, error=str(exc))
                    return
                # Safe to repeat: the renewal is If-Match on our last ETag, so it lands
                # at most once; retried soon (jittered) while the lease is still valid.
                delay = rng.uniform(0, self.ttl_s / 10)
                log.warning("rollup_reader_lease_renew_failed", key=self.key, error=str(exc))


@asynccontextmanager
async def pinned(
    store: ObjectStore,
    loaded: LoadedSnapshot,
    *,
    purpose: str,
    ttl_s: float,
    max_hold_s: float,
    clock: Clock,
) -> AsyncIterator[ReaderLease]:
    """Hold a lease on ``loaded`` (renewed in the background) for the ``with`` body,
    once no vacuum that missed it is running."""
    lease = await ReaderLease.take(store, loaded, purpose=purpose, ttl_s=ttl_s, clock=clock)
    renewing = asyncio.create_task(lease.keep_renewed(max_hold_s=max_hold_s))
    try:
        await wait_out_running_vacuum(
            store, clock, max_wait_s=max_hold_s, pinned_manifest_key=loaded.manifest_key
        )
        yield lease
    finally:
        renewing.cancel()
        with suppress(asyncio.CancelledError):
            await renewing
        await lease.release()


async def wait_out_running_vacuum(
    store: ObjectStore,
    clock: Clock,
    *,
    max_wait_s: float,
    pinned_manifest_key: str | None = None,
    rng: random.Random | None = None,
) -> float:
    """Wait while a vacuum holds the owner lease unexpired (see the module doc); the
    seconds waited. Gives up after ``max_wait_s`` (the read then relies on the retry).

    No wait when the pinned snapshot is the current one. Either it was current when
    that vacuum planned, and vacuum keeps that snapshot; or it was committed since
    (deletes and compaction commit without the owner lease): then vacuum either finds
    the pointer moved at its check before deleting and deletes nothing, or is past that
    check: the new snapshot's files are then the planned snapshot's (kept) or files of
    a commit in flight, which vacuum's minimum age protects as it always does."""
    clock = store_clock(store, clock)
    rng = rng or random.Random()
    started = clock.monotonic()
    while True:
        try:
            body, _ = await store.get(keys.ROLLUP_OWNER_KEY)
            holder = LeaseRecord.from_json(body)
        except (NotFound, RecordError):
            break  # no owner, or a record vacuum could not hold either
        if not holder.owner.startswith(VACUUM_OWNER_PREFIX):
            break
        if holder.expires_at_unix_ns <= clock.now_ns():
            break
        if pinned_manifest_key is not None:
            latest = await load_latest(store)
            if latest is not None and latest.manifest_key == pinned_manifest_key:
                break
            pinned_manifest_key = None  # not current now: no commit can make it so
        waited = clock.monotonic() - started
        if waited >= max_wait_s:
            log.warning("rollup_reader_vacuum_wait_gave_up", vacuum=holder.owner, waited_s=waited)
            break
        if waited == 0:
            log.info("rollup_reader_waits_for_vacuum", vacuum=holder.owner)
        # Safe to repeat: a read. Bounded by the vacuum's expiry and ``max_wait_s``.
        await clock.sleep(rng.uniform(0.5, 2.0))
    return clock.monotonic() - started


@dataclass(frozen=True, slots=True)
class LeaseListing:
    """Every reader lease found, judged against store time ``now_ns``."""

    live: list[RollupReaderLease]
    expired: list[RollupReaderLease]
    unreadable: list[str]


async def list_reader_leases(store: ObjectStore, *, now_ns: int) -> LeaseListing:
    """Read every lease under ``rollup/v1/readers/``. ``now_ns`` must be store time
    taken *before* this call: a renewal that lands meanwhile is then seen, never judged
    expired. A record that does not parse is listed as unreadable (an operator looks)."""
    live: list[RollupReaderLease] = []
    expired: list[RollupReaderLease] = []
    unreadable: list[str] = []
    infos: list[ObjectInfo] = [i async for i in store.list(keys.ROLLUP_READERS_PREFIX)]
    for info in infos:
        try:
            body, _ = await store.get(info.key)
        except NotFound:
            continue  # released meanwhile
        try:
            record = RollupReaderLease.from_json(body)
        except RecordError as exc:
            log.warning("rollup_reader_lease_unreadable", key=info.key, error=str(exc))
            unreadable.append(info.key)
            continue
        if keys.rollup_reader_key(record.reader) != info.key:
            log.warning("rollup_reader_lease_misplaced", key=info.key, reader=record.reader)
            unreadable.append(info.key)
            continue
        (live if record.expires_at_unix_ns > now_ns else expired).append(record)
    return LeaseListing(live, expired, unreadable)
