"""What fills the live window (`collector.query.window`).

- `OwnBatches` (``[query] own_batches = true``, any collector): `BatchAcceptor` calls it
  for every batch it answers 200 (``on_accepted``); the frame is decoded on a thread,
  never on the event loop, and kept. Decodes in progress are bounded in number, and in
  memory by the window's account (`collector.query.decode`): a batch beyond either is
  recorded as lost (answers that may need it are not ``complete``).
- `LogFollower` (``[query] designated = true``): follows the whole authority through the
  index log (PROTOCOL §3.7, `index.log_reader`): every ``poll_interval_s`` it lists new
  segments, and for each ``accepted`` row of a batch accepted within the window it reads
  its frame (`index.raw_reads.read_frame`: a frame blob whole, a bundled frame by its
  range, PROTOCOL §3.10; a range its bundle cannot serve is ``bad-range``, the batch lost
  to the window, so answers needing it are partial; a bundle's frames found in one poll
  share one coalesced ranged GET, `SharedSpans`), checks its SHA-256 against the row
  (log rows are unverified claims) and
  decodes it (charged to the window's account, as above), ``FETCH_CONCURRENCY`` at a
  time, each group added to the window before the next is fetched. At start it begins ``window_s`` back, so a restarted collector rebuilds the
  window from the segments and blobs of the last ``window_s``. At most
  ``max_pending_batches`` batches wait for their blob: a poll that finds more stops
  listing there (those segments are not consumed), fetches what it has, and the follower
  reports itself ``behind`` (answers are not ``complete``) until a poll reaches the end of
  the log again. ``followed_through_ns`` (an answer's ``live_through_ns``) is the store
  time of the last poll that reached the end, minus the log lookback: every segment *cut*
  before it has been listed (PROTOCOL §3.7). A batch accepted earlier may still appear
  later: a re-send's row carries its stored record's old ``accepted_at`` and is cut with
  whatever the collector flushes next.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import structlog

from config.ingest_settings import IngestSettings
from index.log_reader import LogPosition, new_segments, read_segment
from index.raw_reads import BadRange, RawRef, frame_in_span, plan_reads, read_frame
from index.rows import IndexFileError, IndexRow
from protocol.clock import Clock
from protocol.frame import FrameError
from protocol.records import AcceptedManifest
from store.base import ObjectStore
from store.errors import NotFound, StoreError

from .decode import Decoded, LiveDecoder, NoRoom
from .window import LiveWindow

log = structlog.get_logger("collector.live")
NS_PER_S = 1_000_000_000
FETCH_CONCURRENCY = 8
MAX_DECODING = 64
DEFAULT_MAX_FRAME_BYTES: int = IngestSettings.model_fields["max_frame_bytes"].default


class OwnBatches:
    def __init__(self, window: LiveWindow, *, clock: Clock, max_raw_bytes: int) -> None:
        self._window = window
        self._clock = clock
        self._decoder = LiveDecoder(window, max_raw_bytes=max_raw_bytes)
        self._decoding = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def on_accepted(self, manifest: AcceptedManifest, frame: bytes) -> None:
        manifest_id = manifest.identity.manifest_id
        if manifest_id in self._window:
            return
        if self._decoding >= MAX_DECODING:
            self._window.lost(manifest_id, manifest.accepted_at_unix_ns)
            return
        self._decoding += 1
        task = asyncio.get_running_loop().create_task(
            self._keep(manifest_id, manifest.accepted_at_unix_ns, frame, manifest.frame_sha256)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _keep(self, manifest_id: str, accepted_ns: int, body: bytes, sha256: str) -> None:
        try:
            decoded = await self._decoder.decode(body)
            self._window.add(
                manifest_id,
                accepted_ns,
                decoded.frame,
                now_ns=self._clock.now_ns(),
                reserved=decoded.reserved,
                frame_sha256=sha256,
            )
        except FrameError as exc:  # validated at intake: cannot happen for a sound frame
            log.error("own_batch_undecodable", manifest_id=manifest_id, error=str(exc))
            self._window.lost(manifest_id, accepted_ns)
        except NoRoom as exc:
            log.warning("own_batch_no_room", manifest_id=manifest_id, error=str(exc))
            self._window.lost(manifest_id, accepted_ns)
        finally:
            self._decoding -= 1


class LogFollower:
    def __init__(
        self,
        store: ObjectStore,
        window: LiveWindow,
        *,
        clock: Clock,
        poll_interval_s: float,
        lookback_s: float,
        max_pending: int,
        max_raw_bytes: int,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        rng: random.Random | None = None,
        on_poll: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self._window = window
        self._clock = clock
        self._poll_s = poll_interval_s
        self._lookback_ns = int(lookback_s * NS_PER_S)
        self._lookback_s = lookback_s
        self._max_pending = max_pending
        self._decoder = LiveDecoder(window, max_raw_bytes=max_raw_bytes)
        self._max_frame_bytes = max_frame_bytes
        self._rng = rng or random.Random()
        self._on_poll = on_poll or (lambda: None)
        start = max(0, clock.now_ns() - window.window_ns)
        self._position = LogPosition(through_ns=start)
        self._retry: dict[str, IndexRow] = {}  # blobs whose GET failed: asked again next poll
        self.ready = False
        """True once a poll has reached the end of the log (the window is rebuilt)."""
        self.behind = False
        self.followed_through_ns = 0
        self._spans = SharedSpans(store, [])

    async def run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except (StoreError, OSError) as exc:
                log.warning("live_follow_failed", error=str(exc))
            self._on_poll()
            # Jittered so designated collectors restarted together do not list in step.
            await asyncio.sleep(self._poll_s * (0.8 + 0.4 * self._rng.random()))

    async def poll_once(self) -> None:
        listed_at = self._clock.now_ns()
        pending: dict[str, IndexRow] = dict(self._retry)
        self._retry = {}
        reached_end = True
        async for info, name in new_segments(
            self._store, self._position, lookback_s=self._lookback_s
        ):
            try:
                rows = await read_segment(self._store, info.key)
            except NotFound:
                rows = []  # deleted after a completed audit: its batches are old
            except IndexFileError as exc:
                log.warning("live_segment_unreadable", key=info.key, error=str(exc))
                rows = []
            wanted = self._wanted(rows, pending, listed_at)
            if len(pending) + len(wanted) > self._max_pending and pending:
                reached_end = False
                break
            pending.update(wanted)
            self._position.consumed(info.key, name.time_ns, self._lookback_ns)
        await self._fetch_all(list(pending.values()))
        self._window.expire(self._clock.now_ns())
        self.behind = not reached_end or bool(self._retry)
        if reached_end and not self._retry:
            self.followed_through_ns = max(self.followed_through_ns, listed_at - self._lookback_ns)
            self.ready = True

    def _wanted(
        self, rows: list[IndexRow], pending: dict[str, IndexRow], now_ns: int
    ) -> dict[str, IndexRow]:
        horizon = now_ns - self._window.window_ns
        wanted: dict[str, IndexRow] = {}
        for row in rows:
            if row.kind != "accepted" or row.time_unix_ns < horizon:
                continue
            manifest_id = row.manifest_id
            if manifest_id not in self._window and manifest_id not in pending:
                wanted[manifest_id] = row
        return wanted

    async def _fetch_all(self, rows: list[IndexRow]) -> None:
        """Fetch ``FETCH_CONCURRENCY`` at a time, in accepted-time order, adding each
        group to the window before the next (eviction drops the oldest first, and at most
        one group's decoded frames wait, charged, for the window)."""

        async def fetch(row: IndexRow) -> Decoded | bool | None:
            try:
                return await self._fetch(row)
            except (StoreError, OSError) as exc:
                # Safe to repeat: a GET. Asked again at the next poll (bounded by
                # max_pending_batches with the new rows; polls are jittered).
                log.warning("live_blob_unavailable", key=row.raw_blob_key, error=str(exc))
                self._retry[row.manifest_id] = row
                return False

        ordered = sorted(rows, key=lambda row: (row.time_unix_ns, row.key))
        self._spans = SharedSpans(self._store, ordered)
        ordered = self._spans.together(ordered)
        for start in range(0, len(ordered), FETCH_CONCURRENCY):
            group = ordered[start : start + FETCH_CONCURRENCY]
            results = await asyncio.gather(*(fetch(row) for row in group), return_exceptions=True)
            failure: BaseException | None = None
            for row, result in zip(group, results, strict=True):
                if isinstance(result, BaseException):
                    failure = failure or result
                elif isinstance(result, Decoded):
                    if failure is None:
                        self._window.add(
                            row.manifest_id,
                            row.time_unix_ns,
                            result.frame,
                            now_ns=self._clock.now_ns(),
                            reserved=result.reserved,
                            frame_sha256=row.frame_sha256 or "",
                        )
                    else:
                        result.discard(self._window)
                elif result is None:
                    self._window.lost(row.manifest_id, row.time_unix_ns)
            if failure is not None:
                raise failure

    async def _fetch(self, row: IndexRow) -> Decoded | None:
        key = row.raw_blob_key or ""
        ref = RawRef(key, row.frame_sha256, row.identity, row.raw_offset, row.raw_length)
        try:
            body = await self._spans.frame(ref, row.manifest_id, self._max_frame_bytes)
        except NotFound:
            log.warning("live_blob_missing", key=key, manifest_id=row.manifest_id)
            return None
        if isinstance(body, BadRange):  # lost to the window: the answer is partial
            log.warning("live_bad_range", key=key, manifest_id=row.manifest_id, error=body.detail)
            return None
        if not ref.ranged and hashlib.sha256(body).hexdigest() != row.frame_sha256:
            log.warning("live_blob_mismatch", key=key, manifest_id=row.manifest_id)
            return None
        try:
            decoded = await self._decoder.decode(body)
        except FrameError as exc:
            log.warning("live_blob_undecodable", key=key, error=str(exc))
            return None
        except NoRoom as exc:
            log.warning("live_blob_no_room", key=key, error=str(exc))
            return None
        frame, identity = decoded.frame, row.identity
        if (frame.agent_id, frame.boot_id, frame.seq_start) != (
            identity.agent_id,
            identity.boot_id,
            identity.seq_start,
        ):
            decoded.discard(self._window)
            log.warning("live_blob_other_identity", key=key, manifest_id=row.manifest_id)
            return None
        return decoded


class SharedSpans:
    """The bundled frames of one poll read together: `index.raw_reads.plan_reads` over
    the poll's ranged rows, and a planned GET serving two or more of them is sent once,
    when the first of its rows needs it, and dropped after its last (rows are fetched in
    accepted order, and a bundle's frames were accepted together, so a span lives for a
    group or two). A frame blob, or a range no other row shares, is read alone
    (`index.raw_reads.read_frame`). A frame that fails its checks in the span goes
    through the bundle's index as `read_frame` does."""

    def __init__(self, store: ObjectStore, rows: list[IndexRow]) -> None:
        self._store = store
        ranged = [row for row in rows if row.raw_offset is not None or row.raw_length is not None]
        plan = plan_reads(
            pa.array([row.raw_blob_key or "" for row in ranged], pa.string()),
            pa.array([row.raw_offset for row in ranged], pa.int64()),
            pa.array([row.raw_length for row in ranged], pa.int64()),
        )
        served = np.bincount(plan.read_of, minlength=len(plan))
        self._plan = plan
        self._read_of = {
            row.manifest_id: int(r)
            for row, r in zip(ranged, plan.read_of.tolist(), strict=True)
            if served[r] >= 2
        }
        self._left = {r: int(n) for r, n in enumerate(served) if n >= 2}
        self._gets: dict[int, asyncio.Future[bytes]] = {}

    def together(self, ordered: list[IndexRow]) -> list[IndexRow]:
        """``ordered`` (by accepted time) with each shared span's rows moved up to its
        first row: bundles of several collectors interleave in time, and a span is held
        from its first row to its last, so this keeps about one group's spans in memory
        (each at most `index.raw_reads.MAX_SPAN_BYTES`)."""
        first: dict[int, int] = {}
        for i, row in enumerate(ordered):
            first.setdefault(self._read_of.get(row.manifest_id, -1 - i), i)
        return [
            row
            for _rank, row in sorted(
                ((first[self._read_of.get(row.manifest_id, -1 - i)], i), row)
                for i, row in enumerate(ordered)
            )
        ]

    async def frame(self, ref: RawRef, manifest_id: str, max_frame_bytes: int) -> bytes | BadRange:
        r = self._read_of.get(manifest_id)
        if r is None:
            return await read_frame(self._store, ref, max_frame_bytes=max_frame_bytes)
        key, offset = self._plan.keys[r], int(self._plan.offsets[r])
        get = self._gets.get(r)
        if get is None:
            get = asyncio.ensure_future(
                self._store.get_range(key, offset, int(self._plan.lengths[r]))
            )
            self._gets[r] = get
        try:
            span = await asyncio.shield(get)
        finally:
            self._left[r] -= 1
            if self._left[r] == 0:
                self._gets.pop(r, None)
        frame = frame_in_span(ref, offset, span)
        if frame is not None:
            return frame
        start = (ref.raw_offset or 0) - offset
        first = span[max(0, start) : max(0, start + (ref.raw_length or 0))]
        return await read_frame(self._store, ref, max_frame_bytes=max_frame_bytes, first=first)
