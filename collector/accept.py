"""The acceptance protocol (PROTOCOL §3.2, strict mode ``s3_manifest``).

`BatchAcceptor.accept()` decides, once for the whole cluster, what happens to one frame:

1. Create the raw blob at its content-addressed key with If-None-Match. Created: append a
   ``blob`` row to the index log buffer (`index.log_writer`, PROTOCOL §3.7). Already there
   (412): make sure it survives GC by the collector side of PROTOCOL §3.5
   (`collector.blob_survival`: read the mark, veto a marked blob, wait out a deletion,
   then prove the blob exists with a HEAD, or create it again when the HEAD finds
   nothing), so a duplicate never uploads the frame twice. With group commit on
   (PROTOCOL §3.10, `collector.bundles`) a frame may instead be one of a bundle's, whose
   one PutObject is step 1 for all of them; the manifest then names the bundle and the
   frame's range, and a frame whose manifest is another's leaves dead bytes there.
2. Create the accepted manifest with If-None-Match. Created: accepted. 412: read the
   manifest; the same hash is a duplicate, another hash an identity conflict
   (`collector.quarantine`: the accepted blob's deletion held off by the whole §3.5
   collector side, then the quarantine record), answered only once its record exists
   (else `AcceptanceUnavailable`: 503), then a ``quarantine`` row. Every ``Accepted``,
   new or duplicate, appends an ``accepted`` row: a batch whose first answer was lost
   must not wait for a full audit to be indexed. Where the manifest key spells the agent
   as ``h-<sha256>`` (agent_ids over 124 bytes, PROTOCOL §3), the long form a store
   written before that rule may hold is read first, and finding it there counts as that
   412 (one more GET for such agents).

A re-send (``resend=True``: the agent sent ``X-Lightmetrics-Resend: 1``) reads the
accepted manifest first: the same hash is answered as a duplicate with that one read and
nothing written (its ``accepted`` row still appended); another hash takes the conflict
path (the submitted blob is stored and kept first, by step 1 with the §3.5 collector
side, since the quarantine record names it); no manifest (or no answer) runs steps 1-2.
The order of checks changes, never an outcome.

A blob create that finds the blob already there (a definite 412, no header) is most often
a re-send from an agent that restarted and lost track of what it sent. The manifest is
then read before the survival checks: the same hash is a duplicate answered with that
read (2 requests, not 5: the blob is referenced by an accepted manifest, so no GC may
delete it, PROTOCOL §3.5, exactly as on the header path); another hash keeps the blob
and quarantines; no manifest runs the survival checks and step 2 as usual (one GET more,
for the rare new batch whose content is already stored). This reorders checks as the
header does, never changes an outcome; PROTOCOL §3.2 should say so.

Outcomes are `Accepted` (new or duplicate), `IdentityConflictFound`, or the exception
`AcceptanceUnavailable` when the store did not settle the outcome within the request's
time budget, or when this host's clock is off the store's by more than
``max_clock_skew_s`` (PROTOCOL §3.8: checked before the first write and again before
``accepted_at`` is stamped): the caller answers 503 and the agent retries (`BundlesFull`:
429). The invariant: **no `Accepted` without a manifest this call created or read.**
Nothing that must happen once per accepted batch happens before the manifest create
succeeds; index log rows are best effort (the audit is their backstop).

Every store call runs under the remaining budget, checked immediately before it is sent:
no create is sent after the request's start + budget, which is before ``accepted_at`` +
budget, so the GC's mark grace bounds when any create can land (PROTOCOL §3.2, §3.5 rule
3). A call cut short is treated as "outcome unknown" (it may have been applied).
"""

from __future__ import annotations

import asyncio
import random

import structlog

from index.log_writer import IndexLogWriter
from index.rows import accepted_row, blob_row
from protocol import keys, records
from protocol.clock import Clock
from store.base import ObjectStore
from store.errors import ConditionConflict, OutcomeUnknown, PreconditionFailed, Unavailable
from store.retry import Backoff
from store.time import StoreClock

from .blob_survival import keep_existing_blob
from .bundles.acceptance import BundledSteps
from .bundles.bundler import BundlesFull as BundlesFull
from .bundles.bundler import BundleSpot, Placement
from .bundles.options import BundleOptions
from .bundles.options import bundle_options as bundle_options
from .frame_checks import time_range_or_none
from .manifest_reads import StoredManifest, manifest_if_readable, read_manifest
from .quarantine import quarantine_conflict
from .store_calls import AcceptanceUnavailable as AcceptanceUnavailable
from .store_calls import Accepted as Accepted
from .store_calls import (
    AcceptedHook,
    BudgetedRequest,
    BudgetExhausted,
    ClockSkewed,
    Created,
    FrameIdentity,
    StoreOpObserver,
)
from .store_calls import IdentityConflictFound as IdentityConflictFound

log = structlog.get_logger(__name__)

DEFAULT_BACKOFF = Backoff(attempts=10, base_s=0.02, cap_s=1.0)


def _identity_of(header: FrameIdentity) -> keys.BatchIdentity:
    boot_id = header.boot_id  # a uuid.UUID from FrameHeader
    return keys.BatchIdentity(header.agent_id, boot_id, header.seq_start, header.seq_end)  # type: ignore[arg-type]


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
        on_accepted: AcceptedHook | None = None,
        max_concurrent: int | None = None,
        bundles: BundleOptions | None = None,
        max_frame_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        """``max_concurrent``: at most this many acceptances talk to the store at once
        (the store's connection pool); the others wait before their first call holding
        only their checked body, not the client's buffers of a request that cannot be
        sent yet. ``None``: no limit. ``bundles``: group commit (PROTOCOL §3.10), in
        effect while its gate says so; ``None``: frame blobs only.
        ``max_frame_bytes``: bounds a bundled accepted frame read for a conflict."""
        self._max_frame_bytes = max_frame_bytes
        self._slots = asyncio.Semaphore(max_concurrent) if max_concurrent else None
        self._store = store
        self._on_accepted = on_accepted
        self._store_clock = store_clock
        self._collector_id = collector_id
        self._clock = clock
        self._rng = rng
        self._index_log = index_log
        self.budget_s = budget_s
        self._backoff = backoff
        self._observe = observe_store_op or (lambda _op, _result: None)
        self.bundled: BundledSteps | None = None
        if bundles is not None:
            self.bundled = BundledSteps(bundles, clock, collector_id, index_log, self._request)

    @property
    def index_buffered(self) -> int:
        return self._index_log.buffered

    async def accept(
        self,
        header: FrameIdentity,
        frame: bytes,
        frame_sha256: str,
        *,
        resend: bool = False,
        ts_range: tuple[int, int] | None = None,
    ) -> Accepted | IdentityConflictFound:
        """Run the protocol for one validated frame. Raises `AcceptanceUnavailable`.

        ``resend``: the sender says it sent this frame before; the accepted manifest is
        read first (one GET answers a duplicate). ``ts_range``: the points' (min, max)
        time in ns as the frame check found it; read from the frame's ``ts`` column (off
        the event loop) when not given (a spooled frame, a receiver's)."""
        if ts_range is None:
            ts_range = await asyncio.to_thread(time_range_or_none, frame)
        if self._slots is None:
            result = await self._accept(header, frame, frame_sha256, resend, ts_range)
        else:
            async with self._slots:
                result = await self._accept(header, frame, frame_sha256, resend, ts_range)
        if isinstance(result, Accepted) and self._on_accepted is not None:
            self._on_accepted(result.manifest, frame)
        return result

    async def accept_placed(
        self, header: FrameIdentity, frame: bytes, sha: str, spot: BundleSpot, send_by: float
    ) -> Accepted | IdentityConflictFound:
        """Step 2 alone, for a frame of a bundle the caller wrote (spool mode, PROTOCOL
        §3.10): every create of this call is sent before ``send_by`` (monotonic) and
        within the request budget. Raises `AcceptanceUnavailable`."""
        self.refuse_if_clock_skewed()
        request = self._request(min(self.budget_s, send_by - self._clock.monotonic()))
        identity = _identity_of(header)
        ts_range = await asyncio.to_thread(time_range_or_none, frame)
        try:
            result = await self._create_manifest(
                request, identity, header, frame, sha, ts_range, spot=spot
            )
        except BudgetExhausted:
            raise AcceptanceUnavailable(f"store did not settle {identity} in time") from None
        if isinstance(result, Accepted) and self._on_accepted is not None:
            self._on_accepted(result.manifest, frame)
        return result

    async def _accept(
        self,
        header: FrameIdentity,
        frame: bytes,
        frame_sha256: str,
        resend: bool,
        ts_range: tuple[int, int] | None,
    ) -> Accepted | IdentityConflictFound:
        self.refuse_if_clock_skewed()
        request = self._request(self.budget_s)
        identity = _identity_of(header)
        placement: Placement | None = None
        try:
            if resend:
                stored = await manifest_if_readable(request, self._store, identity)
                if stored is not None:
                    return await self._settle_from_manifest(
                        request, stored, frame, frame_sha256, ts_range
                    )
            if self.bundled is not None:
                placement = await self.bundled.place(
                    request, frame, frame_sha256, resend=resend, ts_range=ts_range
                )
            if placement is not None and placement.spot is not None:  # step 1 done: a bundle
                return await self._create_manifest(
                    request, identity, header, frame, frame_sha256, ts_range, spot=placement.spot
                )
            created = await self._put_raw_blob(request, frame, frame_sha256)
            if placement is not None:
                placement.wrote()  # a frame blob of the bundler: its write slot is free
            if created is Created.EXISTED and not resend:
                stored = await manifest_if_readable(request, self._store, identity)
                if stored is not None:
                    return await self._settle_from_manifest(
                        request, stored, frame, frame_sha256, ts_range, created=created
                    )
            await self._keep_raw_blob(request, frame, frame_sha256, created)
            return await self._create_manifest(
                request, identity, header, frame, frame_sha256, ts_range
            )
        except BudgetExhausted:
            raise AcceptanceUnavailable(
                f"store did not settle {identity} within {self.budget_s}s"
            ) from None
        finally:
            if placement is not None:
                placement.answered()

    def _request(self, budget_s: float) -> BudgetedRequest:
        return BudgetedRequest(
            store=self._store,
            clock=self._clock,
            rng=self._rng,
            backoff=self._backoff,
            observe=self._observe,
            budget_s=budget_s,
        )

    def refuse_if_clock_skewed(self) -> None:
        """Never stamp ``accepted_at`` (an hour every index and rollup trusts) with a clock
        the store disagrees with; the agent retries, maybe on another collector."""
        if self._store_clock is not None and self._store_clock.skewed:
            raise ClockSkewed(
                f"this host's clock is {self._store_clock.skew_s or 0.0:+.1f}s off the "
                "store's, beyond store.max_clock_skew_s"
            )

    # --- the manifest first (a re-send, or a blob that was already stored) ------------------

    async def _settle_from_manifest(
        self,
        request: BudgetedRequest,
        stored: StoredManifest,
        frame: bytes,
        sha: str,
        ts_range: tuple[int, int] | None,
        *,
        created: Created | None = None,
        spot: BundleSpot | None = None,
    ) -> Accepted | IdentityConflictFound:
        """Another request's manifest for this identity: a duplicate (nothing written), or
        a conflict: the quarantine record names the submitted frame's blob, so that blob
        is stored and kept first (``created``: step 1's result when it already ran;
        ``Created.YES`` once kept too). A frame of the bundle ``spot`` has dead bytes there
        (no manifest names them), and its frame blob is not written yet: a quarantine
        record names frame blobs only (PROTOCOL §3.10)."""
        if spot is not None and self.bundled is not None:
            self.bundled.another_manifest(spot, stored.manifest, len(frame))
        if stored.manifest.frame_sha256 == sha:
            self._index_read(stored, ts_range)  # every 200 appends its row (PROTOCOL §3.2)
            return Accepted(stored.manifest, duplicate=True, store_ops=request.ops)
        if created is None:
            created = await self._put_raw_blob(request, frame, sha)
        await self._keep_raw_blob(request, frame, sha, created)
        quarantine_key = await quarantine_conflict(  # collector.quarantine
            request,
            accepted=stored.manifest,
            accepted_key=stored.key,
            submitted_sha=sha,
            collector_id=self._collector_id,
            index_log=self._index_log,
            max_frame_bytes=self._max_frame_bytes,
        )
        return IdentityConflictFound(stored.manifest, sha, quarantine_key, store_ops=request.ops)

    # --- step 1: the raw blob ---------------------------------------------------------------

    async def _put_raw_blob(self, request: BudgetedRequest, frame: bytes, sha: str) -> Created:
        created = await request.create_idempotent("put_raw_blob", keys.raw_blob_key(sha), frame)
        if created is not Created.EXISTED:  # ours, or maybe ours: index it (idempotent)
            self._index_raw_blob(sha)
        return created

    async def _keep_raw_blob(
        self, request: BudgetedRequest, frame: bytes, sha: str, created: Created
    ) -> None:
        """A blob that was (or may have been) there already survives GC (PROTOCOL §3.5)."""
        if created is not Created.YES:
            recreated = await keep_existing_blob(
                request, frame=frame, sha=sha, collector_id=self._collector_id
            )
            if recreated:
                self._index_raw_blob(sha)

    def _index_raw_blob(self, sha: str) -> None:
        self._index_log.append(blob_row(sha, self._clock.now_ns()))

    # --- step 2: the accepted manifest -----------------------------------------------------

    async def _create_manifest(
        self,
        request: BudgetedRequest,
        identity: keys.BatchIdentity,
        header: FrameIdentity,
        frame: bytes,
        sha: str,
        ts_range: tuple[int, int] | None,
        *,
        spot: BundleSpot | None = None,
    ) -> Accepted | IdentityConflictFound:
        """Step 2. ``spot``: the frame is bytes of that bundle (PROTOCOL §3.10)."""
        self.refuse_if_clock_skewed()
        manifest = records.AcceptedManifest.of_frame(
            frame,
            identity=identity,
            frame_sha256=sha,
            accepted_at_unix_ns=self._clock.now_ns(),  # stamped at each create (§3.10)
            collector_id=self._collector_id,
            bundle=None if spot is None else (spot.key, spot.offset),
        )
        body = manifest.to_json()
        key = manifest.manifest_key
        delays = request.delays()
        step_one = None if spot is not None else Created.YES  # a frame blob stored and kept
        legacy_key = keys.legacy_accepted_manifest_key(identity)
        if legacy_key is not None:
            # PROTOCOL §3: a store written before the segment rule may hold this batch
            # under the long form; finding it there counts as a 412 on the h- key.
            legacy = await read_manifest(request, self._store, legacy_key, delays, absent_ok=True)
            if legacy is not None:
                return await self._settle_from_manifest(
                    request, legacy[1], frame, sha, ts_range, created=step_one, spot=spot
                )
        maybe_ours = False  # an earlier attempt's outcome is unknown: it may have landed
        while True:
            try:
                etag = await request.call(
                    "put_manifest", key, lambda: self._store.put(key, body, if_none_match=True)
                )
            except PreconditionFailed:
                existing = await read_manifest(request, self._store, key, delays)
                if existing is None:
                    continue  # 412 then 404 cannot happen on a sound store; ask again
                stored_body, stored = existing
                if maybe_ours and stored_body == body:  # our earlier attempt landed
                    self._index_read(stored, ts_range)
                    return Accepted(manifest, duplicate=False, store_ops=request.ops)
                return await self._settle_from_manifest(  # its first answer may have been lost
                    request, stored, frame, sha, ts_range, created=step_one, spot=spot
                )
            except (OutcomeUnknown, ConditionConflict, Unavailable) as exc:
                # Safe to repeat: If-None-Match means a repeat either creates the manifest or
                # gets 412, and then only the manifest we read decides.
                maybe_ours = maybe_ours or isinstance(exc, OutcomeUnknown)
                await request.pause(delays)
                continue
            # Our own create, answered 200: the row carries the body we created and the
            # ETag the store gave it, and the reconciler catalogs it without a request.
            self._index_log.append(
                accepted_row(manifest, etag=etag, own_create=True, ts_range=ts_range)
            )
            return Accepted(manifest, duplicate=False, store_ops=request.ops)

    def _index_read(self, stored: StoredManifest, ts_range: tuple[int, int] | None) -> None:
        """The ``accepted`` row of a manifest this request read (not its own create): the
        reconciler reads it back once (PROTOCOL §3.7). ``ts_range`` is the submitted
        frame's, which has the manifest's hash (the same bytes)."""
        self._index_log.append(
            accepted_row(
                stored.manifest,
                key=stored.key,
                etag=stored.etag,
                own_create=False,
                ts_range=ts_range,
            )
        )
