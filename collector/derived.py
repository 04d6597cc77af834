"""Derived index entries, written off the acknowledgement path (PROTOCOL §3.2).

`DerivedWriter` owns one bounded queue and a few worker tasks. ``offer()`` never waits:
when the queue is full the entry is dropped and counted, because the reconciler rebuilds
every derived entry from ``accepted/v1/`` and ``quarantine/v1/``; delaying an
acknowledgement for an index would trade the user's latency for nothing.

Each entry is created with If-None-Match: a 412 means it is already there, which is
success. Repeating a create is safe for the same reason, so transient errors are retried
a bounded number of times with jitter, then the entry is dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from protocol.clock import Clock
from store.base import ObjectStore
from store.errors import PreconditionFailed, StoreError
from store.retry import Backoff

log = structlog.get_logger(__name__)
DEFAULT_BACKOFF = Backoff(attempts=4, base_s=0.05, cap_s=1.0)


@dataclass(frozen=True, slots=True)
class DerivedEntry:
    key: str
    body: bytes


class DerivedWriter:
    def __init__(
        self,
        *,
        store: ObjectStore,
        clock: Clock,
        rng: random.Random,
        max_queued: int = 10_000,
        workers: int = 4,
        backoff: Backoff = DEFAULT_BACKOFF,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        if max_queued < 1 or workers < 1:
            raise ValueError("max_queued and workers must be >= 1")
        self._store = store
        self._clock = clock
        self._rng = rng
        self._backoff = backoff
        self._queue: asyncio.Queue[DerivedEntry] = asyncio.Queue(maxsize=max_queued)
        self._worker_count = workers
        self._workers: list[asyncio.Task[None]] = []
        self._on_event = on_event or (lambda _event: None)
        self.written = 0
        self.dropped_full = 0
        self.dropped_failed = 0

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        if not self._workers:
            self._workers = [
                asyncio.create_task(self._work(), name=f"derived-writer-{i}")
                for i in range(self._worker_count)
            ]

    def offer(self, key: str, body: bytes) -> bool:
        """Queue one entry; False (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(DerivedEntry(key, body))
        except asyncio.QueueFull:
            self.dropped_full += 1
            self._on_event("dropped_full")
            return False
        return True

    async def flush(self, timeout_s: float) -> bool:
        """Wait until every queued entry is written (or given up); True if it drained in time."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._queue.join()
            return True
        except TimeoutError:
            log.warning("derived_flush_timeout", remaining=self._queue.qsize())
            return False

    async def stop(self, grace_s: float) -> None:
        """Flush within ``grace_s``, then cancel the workers."""
        await self.flush(grace_s)
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers = []

    async def _work(self) -> None:
        while True:
            entry = await self._queue.get()
            try:
                await self._write(entry)
            finally:
                self._queue.task_done()

    async def _write(self, entry: DerivedEntry) -> None:
        delays = self._backoff.delays(self._rng)
        while True:
            try:
                await self._store.put(entry.key, entry.body, if_none_match=True)
            except PreconditionFailed:
                pass  # already there: a retry of ours, another collector, or the reconciler
            except StoreError as exc:
                # Safe to repeat: an If-None-Match create either creates or finds the entry.
                delay = next(delays, None)
                if delay is not None:
                    await self._clock.sleep(delay)
                    continue
                self.dropped_failed += 1
                self._on_event("dropped_failed")
                log.warning("derived_entry_dropped", key=entry.key, error=str(exc))
                return
            except Exception:
                self.dropped_failed += 1
                self._on_event("dropped_failed")
                log.exception("derived_entry_failed", key=entry.key)
                return
            self.written += 1
            self._on_event("written")
            return
