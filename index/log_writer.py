"""The collector's side of the index: `IndexLogWriter` buffers rows and writes log segments.

PROTOCOL §3.7: a collector appends an ``accepted``, ``blob`` or ``quarantine`` row for
what it did (never waiting: the acknowledgement path only appends to memory) and writes
the buffer as one segment when it reaches ``flush_rows`` or its oldest row reaches
``flush_max_age_s``, and on graceful shutdown.

A segment is named and partitioned by its **cut time**: this writer's clock when it cut
the segment, never a row's record time. A duplicate's or a re-send's row carries the
stored record's old ``accepted_at``; a segment named by it would sort before the readers'
positions (checkpoint minus lookback) and never be listed, hiding the new rows cut with
it. A segment may hold rows of any hour. Readers list from their position minus a
lookback of at least ``store.max_clock_skew_s`` + ``put_budget_s``
(`config.settings.Settings.log_lookback_floor_s`), so the create must land within
``put_budget_s`` of the cut: an attempt is sent only while the cut plus the budget leaves
room for the store's connect and read timeouts (``landing_s``); after that the rows go
back into the buffer and are cut again, under a new name, at the next flush. While
``skewed()`` says this host's clock is off the store's by more than
``store.max_clock_skew_s`` (PROTOCOL §3.8), no segment is cut: the rows stay buffered
(bounded, as below), since a name from a wrong clock could sort before the readers'
positions.

Bounds and losses:
- the buffer holds at most ``max_buffered_rows``; an append beyond that is dropped and
  counted (``dropped_full``). Rows are claims the reconciler verifies; the full audit is
  the backstop for anything lost, so the buffer never delays an acknowledgement.
- a segment whose create fails after bounded retries goes back into the buffer (as far
  as it fits; the rest counted as ``dropped_failed``) and is tried at the next flush, so
  a short store outage loses nothing;
- a crash loses at most the unflushed rows.

Each segment is created with If-None-Match under a name that ends in 64 random bits:
repeating the create is safe (a repeat of our own create is answered 412, and nobody
else writes that name), and a 412 after an answer was lost means our create landed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from protocol import keys
from protocol.clock import Clock
from store.base import ObjectStore
from store.errors import (
    ConditionConflict,
    OutcomeUnknown,
    PreconditionFailed,
    StoreError,
    Unavailable,
)
from store.retry import Backoff

from .rows import IndexRow, encode

log = structlog.get_logger(__name__)
DEFAULT_BACKOFF = Backoff(attempts=5, base_s=0.05, cap_s=1.0)
DEFAULT_PUT_BUDGET_S = 60.0  # config.settings.IngestSettings.index_put_budget_s
DEFAULT_LANDING_S = 35.0  # the store's default connect (5 s) plus read (30 s) timeouts


@dataclass
class LogWriterStats:
    rows_appended: int = 0
    rows_written: int = 0
    segments_written: int = 0
    dropped_full: int = 0
    dropped_failed: int = 0
    flush_failures: int = 0
    held_skewed: int = 0
    """Flushes that cut nothing because this host's clock was skewed."""


class IndexLogWriter:
    def __init__(
        self,
        *,
        store: ObjectStore,
        clock: Clock,
        rng: random.Random,
        writer_id: str,
        flush_rows: int = 5_000,
        flush_max_age_s: float = 1.0,
        max_buffered_rows: int = 100_000,
        backoff: Backoff = DEFAULT_BACKOFF,
        on_event: Callable[[str, int], None] | None = None,
        put_budget_s: float = DEFAULT_PUT_BUDGET_S,
        landing_s: float = DEFAULT_LANDING_S,
        skewed: Callable[[], bool] | None = None,
    ) -> None:
        """``put_budget_s``: the longest from a segment's cut to the landing of its create
        (``ingest.index_put_budget_s``); ``landing_s``: how long an attempt may take to
        land once sent (the store's connect plus read timeout); ``skewed``: whether this
        host's clock is off the store's beyond the limit (then no segment is cut)."""
        if flush_rows < 1 or max_buffered_rows < flush_rows or flush_max_age_s <= 0:
            raise ValueError("need 1 <= flush_rows <= max_buffered_rows and flush_max_age_s > 0")
        if put_budget_s <= landing_s:
            raise ValueError("put_budget_s must exceed landing_s: no attempt could be sent")
        self._store = store
        self._clock = clock
        self._rng = rng
        self._writer_id = keys.index_writer_id(writer_id)
        self._flush_rows = flush_rows
        self._max_age_s = flush_max_age_s
        self._max_rows = max_buffered_rows
        self._backoff = backoff
        self._on_event = on_event or (lambda _event, _n: None)
        self._send_window_s = put_budget_s - landing_s
        self._skewed = skewed or (lambda: False)
        self._buffer: list[IndexRow] = []
        self._oldest_mono: float | None = None
        self._wake = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.stats = LogWriterStats()

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def append(self, row: IndexRow) -> bool:
        """Buffer one row; False (and counted) when the buffer is full. Never waits."""
        if len(self._buffer) >= self._max_rows:
            self.stats.dropped_full += 1
            self._on_event("dropped_full", 1)
            return False
        if not self._buffer:
            self._oldest_mono = self._clock.monotonic()
        self._buffer.append(row)
        self.stats.rows_appended += 1
        if len(self._buffer) == 1 or len(self._buffer) >= self._flush_rows:
            self._wake.set()
        return True

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="index-log-writer")

    async def stop(self, grace_s: float) -> None:
        """Stop the background loop and flush what is buffered, within ``grace_s``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            async with asyncio.timeout(max(0.1, grace_s)):
                await self.flush()
        except TimeoutError:
            log.warning("index_log_flush_cut_short", unflushed_rows=len(self._buffer))
        if self._buffer:
            self.stats.dropped_failed += len(self._buffer)
            self._on_event("dropped_failed", len(self._buffer))
            log.warning("index_log_rows_lost_at_shutdown", rows=len(self._buffer))
            self._buffer = []

    async def _run(self) -> None:
        while True:
            if not self._buffer:
                self._wake.clear()
                await self._wake.wait()
                continue
            age = self._clock.monotonic() - (self._oldest_mono or 0.0)
            wait_s = self._max_age_s - age
            if len(self._buffer) < self._flush_rows and wait_s > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait_s)
                if len(self._buffer) < self._flush_rows and (
                    self._clock.monotonic() - (self._oldest_mono or 0.0) < self._max_age_s
                ):
                    continue
            failed_before = self.stats.flush_failures
            await self.flush()
            if self.stats.flush_failures > failed_before:
                # The store refused every attempt: wait a flush interval before trying again
                # rather than spinning on a buffer that is still full.
                await asyncio.sleep(self._max_age_s)

    async def flush(self) -> None:
        """Write every buffered row now, as one segment named by its cut time; while this
        host's clock is skewed, cut nothing (the rows stay buffered)."""
        async with self._flush_lock:
            if not self._buffer:
                return
            if self._skewed():
                self.stats.held_skewed += 1
                self.stats.flush_failures += 1  # the loop waits a flush interval, not spins
                self._on_event("held_skewed", len(self._buffer))
                log.warning("index_log_held_clock_skewed", buffered_rows=len(self._buffer))
                return
            rows, self._buffer, self._oldest_mono = self._buffer, [], None
            try:
                written = await self._write_segment(rows)
            except asyncio.CancelledError:
                # `stop` cancels the loop mid-flush: the rows go back into the buffer (its
                # final flush writes them), never silently lost. A segment whose create may
                # have landed is written again under a new name: the reconciler counts a
                # key once.
                self._requeue(rows)
                raise
            if not written:
                self.stats.flush_failures += 1
                self._requeue(rows)

    def _requeue(self, rows: list[IndexRow]) -> None:
        room = max(0, self._max_rows - len(self._buffer))
        kept, lost = rows[:room], rows[room:]
        if kept:
            self._buffer[:0] = kept
            self._oldest_mono = (
                self._clock.monotonic() if self._oldest_mono is None else self._oldest_mono
            )
        if lost:
            self.stats.dropped_failed += len(lost)
            self._on_event("dropped_failed", len(lost))
            log.warning("index_log_rows_dropped", rows=len(lost))

    async def _write_segment(self, rows: list[IndexRow]) -> bool:
        """Create one segment of ``rows`` under a name of its cut time (now); False when
        the create did not land within the budget (the caller requeues the rows)."""
        rows.sort(key=lambda row: row.time_unix_ns)
        cut_ns, cut_mono = self._clock.now_ns(), self._clock.monotonic()
        key = keys.index_log_segment_key(cut_ns, self._writer_id, self._rng.getrandbits(64))
        body = await asyncio.to_thread(encode, rows)
        delays = self._backoff.delays(self._rng)
        maybe_ours = False
        while True:
            if self._clock.monotonic() - cut_mono > self._send_window_s:
                # Sent now, it could land after cut + budget: past the readers' lookback.
                log.warning("index_log_segment_budget_spent", key=key, rows=len(rows))
                return False
            try:
                await self._store.put(key, body, if_none_match=True)
                break
            except PreconditionFailed:
                if maybe_ours:
                    break  # an earlier attempt whose answer was lost created it
                # 64 random bits collided with another segment of this instant: a new name.
                key = keys.index_log_segment_key(cut_ns, self._writer_id, self._rng.getrandbits(64))
            except (OutcomeUnknown, Unavailable, ConditionConflict) as exc:
                # Safe to repeat: If-None-Match on a name only this writer uses.
                maybe_ours = maybe_ours or isinstance(exc, OutcomeUnknown)
            except StoreError as exc:
                log.warning("index_log_segment_refused", key=key, error=repr(exc))
                return False
            delay = next(delays, None)
            if delay is None:
                log.warning("index_log_segment_failed", key=key, rows=len(rows))
                return False
            await self._clock.sleep(delay)
        self.stats.rows_written += len(rows)
        self.stats.segments_written += 1
        self._on_event("written", len(rows))
        return True
