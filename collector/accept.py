"""The acceptance protocol (PROTOCOL §3.2, strict mode ``s3_manifest``).

`BatchAcceptor.accept()` decides, once for the whole cluster, what happens to one frame:

1. Create the raw blob at its content-addressed key with If-None-Match. Created: append a
   ``blob`` row to the index log buffer (`index.log_writer`, PROTOCOL §3.7). Already there (412): if a GC mark exists for the hash,
   write the veto (and, if a deletion may be under way, wait and re-create the blob)
   before going on (PROTOCOL §3.5, with the mark ``state`` of `protocol.records.GcMark`).
2. Create the accepted manifest with If-None-Match. Created: accepted. 412: read the
   manifest; the same hash is a duplicate, another hash an identity conflict (quarantine
   record written best effort, then a ``quarantine`` row). Every ``Accepted`` — new or
   duplicate — appends an ``accepted`` row: a batch whose first answer was lost must not
   wait for a full audit to be indexed. Where the manifest key spells the agent as
   ``h-<sha256>`` (agent_ids over 124 bytes, PROTOCOL §3), the long form a store written
   before that rule may hold is read first, and finding it there counts as that 412 (one
   more GET for such agents).

Outcomes are `Accepted` (new or duplicate), `IdentityConflictFound`, or the exception
`AcceptanceUnavailable` when the store did not settle the outcome within the request's
time budget, or when this host's clock is off the store's by more than
``max_clock_skew_s`` (PROTOCOL §3.8: checked before the first write and again before
``accepted_at`` is stamped): the caller answers 503 and the agent retries. The invariant: **no `Accepted`
without a manifest this call created or read.** Nothing that must happen once per accepted
batch happens before the manifest create succeeds; index log rows are best effort (the
reconciler's audit is their backstop) and never delay the answer.

Every store call runs under the remaining budget; a call cut short is treated as
"outcome unknown" (the request may have been applied).
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

import structlog

from index.log_writer import IndexLogWriter
from index.rows import accepted_row, blob_row, quarantine_row
from protocol import keys, records
from protocol.clock import Clock
from store.base import ObjectStore
from store.errors import (
    ConditionConflict,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    StoreError,
    Unavailable,
)
from store.retry import Backoff
from store.time import StoreClock

log = structlog.get_logger(__name__)
T = TypeVar("T")

WIRE_VERSION = 1
DEFAULT_BACKOFF = Backoff(attempts=10, base_s=0.02, cap_s=1.0)


class FrameIdentity(Protocol):
    """What acceptance needs of a decoded frame header (`protocol.frame.FrameHeader`)."""

    @property
    def agent_id(self) -> str: ...
    @property
    def boot_id(self) -> object: ...
    @property
    def seq_start(self) -> int: ...
    @property
    def seq_end(self) -> int: ...
    @property
    def record_count(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Accepted:
    manifest: records.AcceptedManifest
    duplicate: bool
    store_ops: int


@dataclass(frozen=True, slots=True)
class IdentityConflictFound:
    accepted: records.AcceptedManifest
    submitted_frame_sha256: str
    quarantine_key: str
    store_ops: int


class AcceptanceUnavailable(Exception):
    """The store did not settle the outcome within the budget. Answer 503; nothing is known."""


class _BudgetExhausted(Exception):
    pass


StoreOpObserver = Callable[[str, str], None]


class _Created(enum.Enum):
    """What an idempotent create found: it created the key, an earlier attempt whose
    answer was lost may have (then 412), or the key was already there."""

    YES = "created"
    MAYBE = "maybe"
    EXISTED = "existed"


def _result_name(exc: BaseException | None) -> str:
    if exc is None:
        return "ok"
    names: dict[type[BaseException], str] = {
        PreconditionFailed: "precondition_failed",
        ConditionConflict: "conflict",
        NotFound: "not_found",
        OutcomeUnknown: "outcome_unknown",
        Unavailable: "unavailable",
    }
    return names.get(type(exc), "error")


class _Request:
    """Per-call state: the deadline and the store operations spent."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.ops = 0


class BatchAcceptor:
    def __init__(
        self,
        *,
        store: ObjectStore,
        collector_id: str,
        clock: Clock,
        rng: random.Random,
        index_log: IndexLogWriter,
        budget_s: float = 10.0,
        backoff: Backoff = DEFAULT_BACKOFF,
        observe_store_op: StoreOpObserver | None = None,
        store_clock: StoreClock | None = None,
    ) -> None:
        self._store = store
        self._store_clock = store_clock
        self._collector_id = collector_id
        self._clock = clock
        self._rng = rng
        self._index_log = index_log
        self._budget_s = budget_s
        self._backoff = backoff
        self._observe = observe_store_op or (lambda _op, _result: None)

    @property
    def index_buffered(self) -> int:
        return self._index_log.buffered

    async def accept(
        self, header: FrameIdentity, frame: bytes, frame_sha256: str
    ) -> Accepted | IdentityConflictFound:
        """Run the protocol for one validated frame. Raises `AcceptanceUnavailable`."""
        self._refuse_if_clock_skewed()
        request = _Request(self._clock.monotonic() + self._budget_s)
        identity = keys.BatchIdentity(
            header.agent_id,
            header.boot_id,  # type: ignore[arg-type]  # a uuid.UUID from FrameHeader
            header.seq_start,
            header.seq_end,
        )
        try:
            await self._store_raw_blob(request, frame, frame_sha256)
            return await self._create_manifest(request, identity, header, frame, frame_sha256)
        except _BudgetExhausted:
            raise AcceptanceUnavailable(
                f"store did not settle {identity} within {self._budget_s}s"
            ) from None

    def _refuse_if_clock_skewed(self) -> None:
        """Never stamp ``accepted_at`` (an hour every index and rollup trusts) with a clock
        the store disagrees with; the agent retries, maybe on another collector."""
        if self._store_clock is not None and self._store_clock.skewed:
            raise AcceptanceUnavailable(
                f"this host's clock is {self._store_clock.skew_s or 0.0:+.1f}s off the "
                "store's, beyond store.max_clock_skew_s"
            )

    # --- store calls under the budget -----------------------------------------------------

    async def _call(
        self, request: _Request, op: str, key: str, call: Callable[[], Awaitable[T]]
    ) -> T:
        remaining = request.deadline - self._clock.monotonic()
        if remaining <= 0:
            raise _BudgetExhausted
        request.ops += 1
        error: BaseException | None = None
        try:
            async with asyncio.timeout(remaining):
                return await call()
        except TimeoutError:
            error = OutcomeUnknown(op, key, "request budget ran out during the call")
            raise error from None
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._observe(op, _result_name(error))

    async def _pause(self, request: _Request, delays: Iterator[float]) -> None:
        """Sleep the next jittered delay, or give up when retries or the budget run out."""
        delay = next(delays, None)
        remaining = request.deadline - self._clock.monotonic()
        if delay is None or remaining <= 0:
            raise _BudgetExhausted
        await self._clock.sleep(min(float(delay), remaining))

    # --- step 1: the raw blob ---------------------------------------------------------------

    async def _store_raw_blob(self, request: _Request, frame: bytes, sha: str) -> None:
        key = keys.raw_blob_key(sha)
        created = await self._create_idempotent(request, "put_raw_blob", key, frame)
        if created is not _Created.EXISTED:  # ours, or maybe ours: index it (idempotent)
            self._index_raw_blob(sha)
        if created is not _Created.YES:  # it was (or may have been) there already
            await self._veto_gc_if_marked(request, frame, sha)

    def _index_raw_blob(self, sha: str) -> None:
        self._index_log.append(blob_row(sha, self._clock.now_ns()))

    async def _veto_gc_if_marked(self, request: _Request, frame: bytes, sha: str) -> None:
        """The blob already existed. Make sure it survives GC (PROTOCOL §3.5).

        With a mark in ``marked`` state after our veto is written, the GC's last veto
        check (which follows its If-Match to ``deleting``) sees the veto: the blob stays.
        Otherwise the GC may have deleted the blob after our 412, so once no mark is left
        the blob is created again (If-None-Match; 412 proves it is there). From then on
        a deletion needs a new mark and a grace far longer than this request.
        """
        mark_key = keys.gc_mark_key(sha)
        if await self._read_mark(request, mark_key) is not None:
            veto = records.GcVeto(
                frame_sha256=sha,
                vetoed_at_unix_ns=self._clock.now_ns(),
                collector_id=self._collector_id,
            )
            await self._create_idempotent(
                request, "put_gc_veto", keys.gc_veto_key(sha), veto.to_json()
            )
            mark = await self._read_mark(request, mark_key)
            if mark is not None and mark.state == "marked":
                return  # the GC's last veto check comes after it sets "deleting"
            log.warning("gc_deletion_in_progress", frame_sha256=sha)
            delays = self._backoff.delays(self._rng)
            while await self._read_mark(request, mark_key) is not None:
                await self._pause(request, delays)
        key = keys.raw_blob_key(sha)
        if (
            await self._create_idempotent(request, "put_raw_blob", key, frame)
            is not _Created.EXISTED
        ):
            log.warning("raw_blob_recreated", frame_sha256=sha)
            self._index_raw_blob(sha)

    async def _read_mark(self, request: _Request, mark_key: str) -> records.GcMark | None:
        delays = self._backoff.delays(self._rng)
        while True:
            try:
                body, _etag = await self._call(
                    request, "get_gc_mark", mark_key, lambda: self._store.get(mark_key)
                )
                return records.GcMark.from_json(body)
            except NotFound:
                return None
            except (Unavailable, ConditionConflict):
                pass  # safe to repeat: a read
            except records.RecordError:
                # An unreadable mark is treated as "deletion may be under way": the safe side.
                return records.GcMark(
                    frame_sha256="0" * 64,
                    raw_blob_key="?",
                    marked_at_unix_ns=0,
                    gc_run_id="?",
                    state="deleting",
                )
            await self._pause(request, delays)

    async def _create_idempotent(
        self, request: _Request, op: str, key: str, body: bytes
    ) -> _Created:
        """Create ``key`` if absent; 412 is success. Retried: If-None-Match makes it
        idempotent (every writer of a key writes the same bytes, and a repeat of our own
        create is answered 412)."""
        delays = self._backoff.delays(self._rng)
        maybe_ours = False
        while True:
            try:
                await self._call(
                    request, op, key, lambda: self._store.put(key, body, if_none_match=True)
                )
                return _Created.YES
            except PreconditionFailed:
                return _Created.MAYBE if maybe_ours else _Created.EXISTED
            except OutcomeUnknown:
                maybe_ours = True
            except (ConditionConflict, Unavailable):
                pass
            await self._pause(request, delays)

    # --- step 2: the accepted manifest -----------------------------------------------------

    async def _create_manifest(
        self,
        request: _Request,
        identity: keys.BatchIdentity,
        header: FrameIdentity,
        frame: bytes,
        sha: str,
    ) -> Accepted | IdentityConflictFound:
        self._refuse_if_clock_skewed()
        manifest = records.AcceptedManifest(
            agent_id=identity.agent_id,
            boot_id=str(identity.boot_id),
            seq_start=identity.seq_start,
            seq_end=identity.seq_end,
            record_count=header.record_count,
            frame_sha256=sha,
            frame_bytes=len(frame),
            raw_blob_key=keys.raw_blob_key(sha),
            accepted_at_unix_ns=self._clock.now_ns(),
            collector_id=self._collector_id,
        )
        body = manifest.to_json()
        key = manifest.manifest_key
        delays = self._backoff.delays(self._rng)
        legacy_key = keys.legacy_accepted_manifest_key(identity)
        if legacy_key is not None:
            # PROTOCOL §3: a store written before the segment rule may hold this batch
            # under the long form; finding it there counts as a 412 on the h- key.
            legacy = await self._read_manifest(request, legacy_key, delays, absent_ok=True)
            if legacy is not None:
                stored = legacy[1]
                if stored.frame_sha256 == sha:
                    return Accepted(stored, duplicate=True, store_ops=request.ops)
                return await self._quarantine(request, stored, sha, accepted_key=legacy_key)
        maybe_ours = False  # an earlier attempt's outcome is unknown: it may have landed
        while True:
            try:
                await self._call(
                    request,
                    "put_manifest",
                    key,
                    lambda: self._store.put(key, body, if_none_match=True),
                )
            except PreconditionFailed:
                existing = await self._read_manifest(request, key, delays)
                if existing is None:
                    continue  # 412 then 404 cannot happen on a sound store; ask again
                stored_body, stored = existing
                if maybe_ours and stored_body == body:  # our earlier attempt landed
                    self._index_manifest(manifest)
                    return Accepted(manifest, duplicate=False, store_ops=request.ops)
                if stored.frame_sha256 == sha:
                    self._index_manifest(stored)  # its first answer may have been lost
                    return Accepted(stored, duplicate=True, store_ops=request.ops)
                return await self._quarantine(request, stored, sha)
            except (OutcomeUnknown, ConditionConflict, Unavailable) as exc:
                # Safe to repeat: If-None-Match means a repeat either creates the manifest or
                # gets 412, and then only the manifest we read decides.
                maybe_ours = maybe_ours or isinstance(exc, OutcomeUnknown)
                await self._pause(request, delays)
                continue
            self._index_manifest(manifest)
            return Accepted(manifest, duplicate=False, store_ops=request.ops)

    async def _read_manifest(
        self, request: _Request, key: str, delays: Iterator[float], *, absent_ok: bool = False
    ) -> tuple[bytes, records.AcceptedManifest] | None:
        """The manifest at ``key``; ``None`` when absent (after a pause unless
        ``absent_ok``: a 412 then 404 is worth a moment before asking again)."""
        while True:
            try:
                body, _etag = await self._call(
                    request, "get_manifest", key, lambda: self._store.get(key)
                )
            except NotFound:
                if not absent_ok:
                    await self._pause(request, delays)
                return None
            except (Unavailable, ConditionConflict):
                await self._pause(request, delays)  # safe to repeat: a read
                continue
            try:
                return body, records.AcceptedManifest.from_json(body)
            except records.RecordError as exc:
                # A corrupt acceptance record must not be answered as anything: alert and 503.
                log.error("accepted_manifest_unreadable", key=key, error=str(exc))
                raise _BudgetExhausted from None

    def _index_manifest(self, manifest: records.AcceptedManifest) -> None:
        self._index_log.append(accepted_row(manifest))

    async def _quarantine(
        self,
        request: _Request,
        accepted: records.AcceptedManifest,
        submitted_sha: str,
        *,
        accepted_key: str | None = None,
    ) -> IdentityConflictFound:
        conflict = records.IdentityConflict(
            agent_id=accepted.agent_id,
            boot_id=accepted.boot_id,
            seq_start=accepted.seq_start,
            seq_end=accepted.seq_end,
            accepted_manifest_key=accepted_key or accepted.manifest_key,
            accepted_raw_blob_key=accepted.raw_blob_key,
            accepted_frame_sha256=accepted.frame_sha256,
            submitted_raw_blob_key=keys.raw_blob_key(submitted_sha),
            submitted_frame_sha256=submitted_sha,
            observed_at_unix_ns=self._clock.now_ns(),
            collector_id=self._collector_id,
        )
        quarantine_key = conflict.quarantine_key
        # Best effort (PROTOCOL §3.2): the 409 is the answer whether or not it lands.
        try:
            await self._create_idempotent(
                request, "put_quarantine", quarantine_key, conflict.to_json()
            )
            self._index_log.append(quarantine_row(conflict))
        except (_BudgetExhausted, StoreError) as exc:
            log.warning("quarantine_write_failed", key=quarantine_key, error=repr(exc))
        return IdentityConflictFound(accepted, submitted_sha, quarantine_key, store_ops=request.ops)
