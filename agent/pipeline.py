"""One delivery run: frames → spool → uploader workers, in rounds, with backpressure.

Order of work:
1. frames already pending in the spool (a crashed or interrupted earlier run) are sent
   first, as stored (`BatchKind.RECOVERED`);
2. each planned frame is appended to the spool (durable) and only then queued for a
   worker; when a frame is delivered, its follow-ups (an injected duplicate or conflict)
   are spooled and queued in turn;
3. frames whose retries ran out (`Outcome.DEFERRED`) wait, still pending, for the next
   round; up to ``max_rounds`` rounds, ``round_delay_s`` apart.

Bounds: the work queue holds ``2 x concurrency`` entries; the spool's limits bound what
is stored. When the spool is full the producer waits for a worker to free space; if
nothing is in flight, only deferred frames fill it, so it starts their next round early;
when they have used all their rounds, the run stops producing (`DeliveryRun.not_sent`
counts what was left) instead of growing without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from agent.spool import Spool, SpoolEntry, SpoolFull
from agent.summary import DeliveryRecord
from agent.truth import BatchKind, GroundTruth, PlannedFrame, TruthRecord, finite_sum, truth_record
from agent.uploader import BatchResult, Outcome, Uploader
from protocol.clock import Clock
from protocol.frame import FrameError, decode_frame

log = structlog.get_logger("agent.pipeline")

Followups = Callable[[PlannedFrame], Iterable[PlannedFrame]]


@dataclass(slots=True)
class _Work:
    entry: SpoolEntry
    truth: TruthRecord
    planned: PlannedFrame | None
    attempts: int = 0
    rounds: int = 0
    last: BatchResult | None = None


class DeliveryRun:
    """Delivers planned frames through ``spool`` with ``uploader``; call `run` once."""

    def __init__(
        self,
        *,
        spool: Spool,
        uploader: Uploader,
        truth: GroundTruth,
        clock: Clock,
        max_rounds: int = 3,
        round_delay_s: float = 1.0,
        on_record: Callable[[DeliveryRecord], None] | None = None,
    ) -> None:
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
        self.spool = spool
        self.uploader = uploader
        self.truth = truth
        self.records: list[DeliveryRecord] = []
        self.not_sent = 0
        self._clock = clock
        self._max_rounds = max_rounds
        self._round_delay_s = round_delay_s
        self._on_record = on_record
        self._concurrency = uploader.policy.concurrency
        self._queue: asyncio.Queue[_Work] = asyncio.Queue(maxsize=2 * self._concurrency)
        self._outstanding = 0  # queued or being delivered
        self._deferred: list[_Work] = []
        self._followups: deque[PlannedFrame] = deque()
        self._followup_source: Followups | None = None
        self._space = asyncio.Event()
        self._error: Exception | None = None

    async def run(
        self,
        frames: Iterable[PlannedFrame],
        followups: Followups | None = None,
        *,
        planned_total: int | None = None,
    ) -> list[DeliveryRecord]:
        """Deliver the spool's recovered frames, then ``frames`` (and their follow-ups),
        then retry rounds. Returns one `DeliveryRecord` per spooled frame.

        ``frames`` is consumed lazily, in a worker thread (building frames is CPU work
        that should not stall the event loop). ``planned_total`` (how many ``frames``
        yields) lets a stalled run count what it did not send without building it."""
        self._followup_source = followups
        workers = [asyncio.create_task(self._worker()) for _ in range(self._concurrency)]
        try:
            for entry in self.spool.pending():
                await self._put(await self._recovered(entry))
            stalled = False
            frames_iter = iter(frames)
            produced = 0
            while (planned := await asyncio.to_thread(next, frames_iter, None)) is not None:
                produced += 1
                if not await self._spool_followups() or not await self._spool_and_put(planned):
                    stalled = True
                    left = (
                        planned_total - produced
                        if planned_total is not None
                        else sum(1 for _ in frames_iter)
                    )
                    self.not_sent += 1 + left
                    break
            if not stalled:
                await self._settle()
            else:
                await self._queue.join()
            for _round in range(1, self._max_rounds):
                if not any(w.rounds < self._max_rounds for w in self._deferred):
                    break
                await self._clock.sleep(self._round_delay_s)
                await self._requeue_deferred()
                await self._settle()
        finally:
            for worker in workers:
                worker.cancel()
            for worker in workers:
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
        if self._error is not None:
            raise self._error
        for work in self._deferred:
            self._finish(work)
        self.not_sent += len(self._followups)
        return self.records

    # --- producing ----------------------------------------------------------------------

    async def _settle(self) -> None:
        """Wait until the queue is empty and no follow-ups remain."""
        while True:
            await self._queue.join()
            if not self._followups:
                return
            if not await self._spool_followups():
                return

    async def _spool_followups(self) -> bool:
        while self._followups:
            if not await self._spool_and_put(self._followups[0]):
                return False
            self._followups.popleft()
        return True

    async def _spool_and_put(self, planned: PlannedFrame) -> bool:
        """Append ``planned`` to the spool (waiting for space) and queue it. False when
        the spool stays full of frames that have used all their rounds."""
        while True:
            self._space.clear()
            try:
                entry = await asyncio.to_thread(self.spool.append, planned.frame, planned.identity)
                break
            except SpoolFull:
                if self._outstanding == 0:
                    if not any(w.rounds < self._max_rounds for w in self._deferred):
                        log.error("spool_full_of_undeliverable", pending=self.spool.pending_count)
                        return False
                    await self._clock.sleep(self._round_delay_s)
                    await self._requeue_deferred()
                    continue
                await self._space.wait()
        record = truth_record(planned)
        self.truth.record_sent(record)
        await self._put(_Work(entry, record, planned))
        return True

    async def _requeue_deferred(self) -> None:
        again = [w for w in self._deferred if w.rounds < self._max_rounds]
        self._deferred = [w for w in self._deferred if w.rounds >= self._max_rounds]
        for work in again:
            await self._put(work)

    async def _put(self, work: _Work) -> None:
        self._outstanding += 1
        await self._queue.put(work)

    async def _recovered(self, entry: SpoolEntry) -> _Work:
        identity = entry.identity
        try:
            decoded = await asyncio.to_thread(decode_frame, entry.read())
            count = decoded.points.num_rows
            value_sum = finite_sum(decoded.points.column("value").to_pylist())
        except FrameError:
            # Header and CRC are fine (the spool checked) but the payload is not: send it
            # anyway; the collector's 400 parks it as poison, with its reason.
            count, value_sum = identity.seq_end - identity.seq_start + 1, math.nan
        record = TruthRecord(BatchKind.RECOVERED, identity, entry.frame_sha256, count, value_sum)
        self.truth.record_sent(record)
        return _Work(entry, record, None)

    # --- delivering ---------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            work = await self._queue.get()
            try:
                await self._deliver(work)
            except Exception as exc:  # a bug (e.g. in follow-ups): surface it from run()
                log.exception("delivery_worker_error")
                self._error = self._error or exc
            finally:
                self._outstanding -= 1
                self._space.set()
                self._queue.task_done()

    async def _deliver(self, work: _Work) -> None:
        try:
            result = await self.uploader.deliver(self.spool, work.entry)
        except Exception as exc:
            # A local failure (disk, bug): keep the frame pending for a later round.
            log.exception("delivery_failed", identity=str(work.entry.identity))
            work.rounds += 1
            work.last = BatchResult(
                work.entry.identity,
                work.entry.frame_sha256,
                Outcome.DEFERRED,
                0,
                None,
                None,
                f"local failure: {type(exc).__name__}: {exc}",
                None,
                None,
                0.0,
            )
            self._deferred.append(work)
            return
        work.attempts += result.attempts
        work.rounds += 1
        work.last = result
        if result.outcome is Outcome.DEFERRED:
            self._deferred.append(work)
            return
        self._finish(work)
        if result.outcome.delivered and work.planned and self._followup_source:
            self._followups.extend(self._followup_source(work.planned))

    def _finish(self, work: _Work) -> None:
        if work.last is None:
            return  # cannot happen: only delivered-to work is finished
        record = DeliveryRecord(work.entry.name, work.truth, work.last, work.attempts, work.rounds)
        self.truth.record_outcome(work.truth, work.last.outcome.value)
        self.records.append(record)
        if self._on_record is not None:
            self._on_record(record)
