"""Reader leases (PROTOCOL §4.1 "Readers and vacuum"): a long read pins its snapshot.

A lease is ``rollup/v1/readers/<id>.json`` (`protocol.records.RollupReaderLease`): the
snapshot's version and manifest key, an expiry in store time (`store.time`, PROTOCOL
§3.8), and what the read is for. It is created with If-None-Match under a fresh id,
renewed with If-Match by a background task every third of its TTL while the read runs,
and deleted when the read ends. `rollup.vacuum` keeps every file of a snapshot an
unexpired lease pins, and deletes leases that have expired (a reader that crashed).

Which reads take one (decision): `ReadGuard.mode` ``"auto"`` (the default of
`rollup.reader.scan` and ``lm-rollup query``) when the read plans more than
``min_files`` data files (``[rollup] reader_lease_min_files``, 32): a lease costs a PUT
and a DELETE (plus a PUT per renewal), noise next to that many GETs, and a read of a few
files ends in seconds, well inside vacuum's minimum age of a superseded file's snapshot
retention. ``"always"`` (``lm-rollup sql``, which reads whatever the SQL touches, and
``query --lease``) and ``"never"`` (``--no-lease``) decide instead.

Bounds: renewals stop after ``max_hold_s`` (a hung reader cannot hold vacuum back for
ever) and when a renewal finds the lease changed or gone; a failed renewal is retried
after a short jittered delay while the lease has more than a sixth of its TTL left (a
renewal must land well before the expiry vacuum judges by), then the lease lapses.
Either way the read goes on, guarded as below.

A file gone mid-read (`read_consistently`): the reader never returns fewer rows. It
checks which listed files are gone (HEAD), and when reading the latest snapshot
re-reads the pointer and retries once against the newer snapshot, with a warning (log,
and ``ReadGuard.notify``, which the CLI prints on stderr); a second failure, a read of
an explicit ``--version``/``--as-of`` (retrying would answer a different question), or
a current snapshot that lists a missing file raise `SnapshotFilesGone`.

Known window: vacuum reads the leases after listing what it could delete, then deletes;
a lease written after that read (a reader that loaded its snapshot just before) does not
protect that run's deletions. The retry above covers it for latest reads.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, TypeVar

import structlog

from protocol import keys
from protocol.clock import Clock, SystemClock
from protocol.records import RecordError, RollupReaderLease
from rollup.commit import LoadedSnapshot, load_latest
from rollup.manifest import Snapshot
from rollup.travel import load_snapshot
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

T = TypeVar("T")
_TAKE_BACKOFF = Backoff(attempts=4, base_s=0.05, cap_s=1.0)
_HEAD_CONCURRENCY = 16


class ReaderLeaseLost(Exception):
    """Our lease record changed or is gone (vacuum deleted it as expired): it no longer
    pins anything. The read goes on; a vanished file is then retried or reported."""


class SnapshotFilesGone(Exception):
    """Data files a snapshot lists are gone and the read cannot be completed: the
    version was vacuumed under the reader, or the dataset is damaged. Nothing partial is
    returned. ``missing`` names (some of) the files, ``version`` the snapshot."""

    def __init__(self, message: str, *, version: int, missing: Sequence[str]) -> None:
        super().__init__(message)
        self.version = version
        self.missing = list(missing)


@dataclass(frozen=True, slots=True)
class ReadGuard:
    """When a read pins its snapshot, and how (see the module doc)."""

    mode: Literal["auto", "always", "never"] = "auto"
    min_files: int = 32
    ttl_s: float = 120.0
    max_hold_s: float = 6 * 3600.0
    purpose: str = "read"
    clock: Clock = field(default_factory=SystemClock)
    notify: Callable[[str], None] | None = None
    """Called with the retry message when a vanished file makes the read start over."""

    def wants_lease(self, files: int) -> bool:
        if self.mode == "auto":
            return files > self.min_files
        return self.mode == "always"


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
    store: ObjectStore, loaded: LoadedSnapshot, guard: ReadGuard
) -> AsyncIterator[ReaderLease]:
    """Hold a lease on ``loaded`` (renewed in the background) for the ``with`` body."""
    lease = await ReaderLease.take(
        store, loaded, purpose=guard.purpose, ttl_s=guard.ttl_s, clock=guard.clock
    )
    renewing = asyncio.create_task(lease.keep_renewed(max_hold_s=guard.max_hold_s))
    try:
        yield lease
    finally:
        renewing.cancel()
        with suppress(asyncio.CancelledError):
            await renewing
        await lease.release()


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


async def missing_files(store: ObjectStore, paths: Sequence[str]) -> list[str]:
    """Those of ``paths`` that are gone (HEAD answers NotFound), looked at in groups of
    16 and stopping after the first group with any gone: enough to tell why a read failed."""
    gone: list[str] = []

    async def check(path: str) -> None:
        try:
            await store.head(path)
        except NotFound:
            gone.append(path)

    for start in range(0, len(paths), _HEAD_CONCURRENCY):
        await asyncio.gather(*(check(p) for p in paths[start : start + _HEAD_CONCURRENCY]))
        if gone:
            break
    return sorted(gone)


async def read_consistently(
    store: ObjectStore,
    *,
    version: int | None,
    as_of: datetime | None,
    files_of: Callable[[Snapshot], Sequence[str]],
    read: Callable[[LoadedSnapshot | None], Awaitable[T]],
    guard: ReadGuard,
    missing_errors: tuple[type[BaseException], ...] = (OSError, NotFound),
) -> T:
    """``read`` the snapshot asked for (latest, ``version`` or ``as_of``), pinned by a
    lease when ``guard`` wants one for ``files_of(snapshot)``; a file gone mid-read is
    handled as the module doc says. ``read`` must start afresh on each call."""
    loaded = await load_snapshot(store, version=version, as_of=as_of)
    for attempt in (1, 2):
        if loaded is None:
            return await read(None)
        files = list(files_of(loaded.snapshot))
        try:
            if guard.wants_lease(len(files)):
                async with pinned(store, loaded, guard):
                    return await read(loaded)
            return await read(loaded)
        except missing_errors as exc:
            gone = await missing_files(store, files)
            if not gone:
                raise
            current = loaded.snapshot.version
            where = f"{len(gone)} data file(s) of version {current} are gone (first: {gone[0]})"
            if attempt == 2:
                raise SnapshotFilesGone(
                    f"{where}, again after a retry: vacuum keeps removing files under "
                    f"this reader; run the read again",
                    version=current,
                    missing=gone,
                ) from exc
            if version is not None or as_of is not None:
                raise SnapshotFilesGone(
                    f"{where}: vacuum removed them (the version is past the retention, "
                    f"or was not pinned yet); read a newer version",
                    version=current,
                    missing=gone,
                ) from exc
            newer = await load_latest(store)
            if newer is None or newer.manifest_key == loaded.manifest_key:
                raise SnapshotFilesGone(
                    f"{where}, and it is the current snapshot: the dataset is damaged "
                    f"(an operator must look)",
                    version=current,
                    missing=gone,
                ) from exc
            message = (
                f"{where}: vacuum removed them after version {newer.snapshot.version} "
                f"superseded it; re-read the pointer, retrying once against version "
                f"{newer.snapshot.version}"
            )
            log.warning("rollup_read_retry", version=current, retry_version=newer.snapshot.version)
            if guard.notify is not None:
                guard.notify(message)
            loaded = newer
    raise AssertionError("unreachable: the second attempt returns or raises")
