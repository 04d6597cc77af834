"""``lm-agent scrape``: a long-running agent that scrapes Prometheus text endpoints and
delivers the samples as frames, per the agent contract (PROTOCOL §2).

Three parts, one process:
- **scrape loop**: every ``scrape.interval_s`` (start to start; a slow round delays the
  next, never overlaps it) every target is scraped (`agent.scrape_target`), and the
  rows, ``up``, ``scrape_duration_seconds`` and ``scrape_samples_scraped`` included,
  are buffered in target order, then the agent's own health rows (`agent.health`);
- **framing**: the buffer becomes frames of at most ``max_batch_points`` rows when it
  holds that many or ``flush_interval_s`` has passed, and on stop. A frame is appended
  to the durable `agent.spool.Spool` by the `agent.producer.BatchProducer` of this
  process start — a new random boot_id per start, seq from 0 — before it is ever sent;
- **delivery loop**: pending frames go to the collectors through `agent.uploader.Uploader`
  (delete on 200, park on 409 / 400 / 413 / 415, keep on everything else). Frames whose
  retries ran out stay pending and are tried again after a jittered delay that doubles
  up to ``MAX_ROUND_DELAY_S``, for as long as the agent runs: re-sending a frame is
  always safe, since the collector answers a frame it has as a duplicate.

Why nothing is lost or counted twice: frames are spooled (fsync) before they are sent
and deleted only after a 200; a restart opens the same spool, sends what is pending
byte for byte under its old identity, and frames new points under a new boot_id. What
a crash (kill -9) can lose is only what was scraped and not yet spooled (at most one
flush interval); SIGTERM loses nothing: the scrape under way finishes, the buffer is
spooled, and delivery runs for up to ``shutdown_grace_s`` before the process exits
(what is left stays pending for the next start).

Bounded: the spool's limits (``max_pending_frames`` / ``max_pending_bytes``); while the
spool is full, rows wait in memory up to ``max_buffered_points``, and scrapes beyond
that are dropped (logged with their size). One delivery per pending frame at a time,
``upload_concurrency`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pyarrow as pa
import structlog

from agent.health import AgentHealth
from agent.producer import BatchProducer
from agent.scrape_target import ScrapeResult, Target, scrape_target
from agent.spool import Spool, SpoolEntry, SpoolFull
from agent.uploader import Outcome, Uploader, UploadPolicy
from config.settings import ScrapeSettings
from protocol.clock import Clock, SystemClock
from store.retry import Backoff

log = structlog.get_logger("agent.scrape")

FIRST_ROUND_DELAY_S = 0.5
MAX_ROUND_DELAY_S = 30.0


@dataclass(frozen=True, slots=True)
class ScrapeStats:
    scrapes: int
    failed_scrapes: int
    frames_spooled: int
    points_spooled: int
    points_dropped: int


class ScrapeAgent:
    """See the module docstring. `run` until `stop`."""

    def __init__(
        self,
        *,
        settings: ScrapeSettings,
        token: str | None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.targets = [Target.of(t.url, t.labels) for t in settings.targets]
        self._token = token
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._rng = rng if rng is not None else random.Random()
        self._stopping = asyncio.Event()
        self._spooled = asyncio.Event()
        self._delivered = asyncio.Event()
        self._buffer: list[pa.Table] = []
        self._buffered_rows = 0
        self._last_flush = self._clock.monotonic()
        self._stats = {k: 0 for k in ScrapeStats.__dataclass_fields__}
        self._health = AgentHealth(settings.agent_id) if settings.self_metrics else None
        self._spool: Spool | None = None  # while `run` has it open

    @property
    def stats(self) -> ScrapeStats:
        return ScrapeStats(**self._stats)

    def stop(self) -> None:
        """Ask `run` to finish: no new scrape starts; what was scraped is spooled."""
        self._stopping.set()

    async def run(self) -> ScrapeStats:
        """Scrape and deliver until `stop`; then spool the buffer and deliver for up to
        ``shutdown_grace_s``. Raises `agent.spool.SpoolLocked` if the spool is in use."""
        s = self.settings
        with Spool.open(
            s.spool_dir,
            max_pending_frames=s.max_pending_frames,
            max_pending_bytes=s.max_pending_bytes,
        ) as spool:
            self._spool = spool
            producer = BatchProducer(agent_id=s.agent_id, spool=spool)
            log.info(
                "scrape_agent_started",
                agent_id=s.agent_id,
                boot_id=str(producer.boot_id),
                targets=[t.url for t in self.targets],
                pending=spool.pending_count,
            )
            async with self._sessions() as (scrapes, uploader):
                delivery = asyncio.create_task(self._deliver_loop(spool, uploader))
                try:
                    await self._scrape_loop(scrapes, producer)
                    await self._flush(producer, final=True)
                    self._spooled.set()
                    await self._drain(spool, delivery)
                finally:
                    delivery.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await delivery
            log.info("scrape_agent_stopped", pending=spool.pending_count, **self._stats)
            self._spool = None
        return self.stats

    @contextlib.asynccontextmanager
    async def _sessions(self) -> AsyncIterator[tuple[aiohttp.ClientSession, Uploader]]:
        s = self.settings
        policy = UploadPolicy(
            concurrency=s.upload_concurrency,
            request_timeout_s=s.request_timeout_s,
            backoff=Backoff(attempts=3, base_s=0.2, cap_s=2.0),
        )
        async with (
            aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as scrapes,
            Uploader(
                urls=list(s.collector_urls),
                token=self._token,
                policy=policy,
                clock=self._clock,
                rng=self._rng,
            ) as uploader,
        ):
            yield scrapes, uploader

    # --- scraping and framing -------------------------------------------------------------

    async def _scrape_loop(self, session: aiohttp.ClientSession, producer: BatchProducer) -> None:
        while not self._stopping.is_set():
            started = self._clock.monotonic()
            await self.scrape_round(session)
            if self._buffered_rows >= self.settings.max_batch_points or (
                self._clock.monotonic() - self._last_flush >= self.settings.flush_interval_s
            ):
                await self._flush(producer)
            # The interval runs start to start: subtract the time this round took.
            delay = self.settings.interval_s - (self._clock.monotonic() - started)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, delay)):
                    await self._stopping.wait()

    async def scrape_round(self, session: aiohttp.ClientSession) -> list[ScrapeResult]:
        """Scrape every target once (concurrently) and buffer the rows in target order."""
        s = self.settings
        started_ns = self._clock.now_ns()
        results = await asyncio.gather(
            *(
                scrape_target(
                    session,
                    target,
                    started_ns=started_ns,
                    timeout_s=s.timeout_s,
                    max_bytes=s.max_target_bytes,
                    monotonic=self._clock.monotonic,
                )
                for target in self.targets
            )
        )
        for result in results:
            self._stats["scrapes"] += 1
            if not result.ok:
                self._stats["failed_scrapes"] += 1
                log.warning("scrape_failed", target=result.target.url, error=result.error)
            self._buffer_points(result.points, result.target.url)
        if self._health is not None:
            spool = self._spool
            health = self._health.points(
                self._clock.now_ns() // 1_000_000 * 1_000_000,  # milliseconds, as scrapes
                stats=self._stats,
                pending_frames=spool.pending_count if spool is not None else 0,
                pending_bytes=spool.pending_bytes if spool is not None else 0,
                buffered_points=self._buffered_rows,
            )
            self._buffer_points(health, "self_metrics")
        return list(results)

    def _buffer_points(self, points: pa.Table, source: str) -> None:
        """Hold ``points`` for the next flush, or drop them (counted, logged) when the
        memory buffer is full."""
        rows = points.num_rows
        if self._buffered_rows + rows > self.settings.max_buffered_points:
            self._stats["points_dropped"] += rows
            log.error(
                "scrape_dropped_buffer_full",
                target=source,
                points=rows,
                buffered=self._buffered_rows,
            )
            return
        self._buffer.append(points)
        self._buffered_rows += rows

    async def _flush(self, producer: BatchProducer, *, final: bool = False) -> None:
        """Spool the buffer as frames of at most ``max_batch_points`` rows. On a full
        spool the rest stays buffered (a final flush waits for space while the delivery
        loop runs, up to the shutdown grace)."""
        self._last_flush = self._clock.monotonic()
        if not self._buffer:
            return
        table = pa.concat_tables(self._buffer)
        limit = self.settings.max_batch_points
        offset = 0
        deadline = self._clock.monotonic() + self.settings.shutdown_grace_s
        while offset < table.num_rows:
            chunk = table.slice(offset, limit)
            try:
                entry = await asyncio.to_thread(producer.submit, chunk)
            except SpoolFull:
                if not final or self._clock.monotonic() > deadline:
                    log.warning("spool_full", buffered=table.num_rows - offset)
                    break
                await self._clock.sleep(FIRST_ROUND_DELAY_S)
                continue
            offset += chunk.num_rows
            self._stats["frames_spooled"] += 1
            self._stats["points_spooled"] += chunk.num_rows
            self._spooled.set()
            log.debug("frame_spooled", identity=str(entry.identity), points=chunk.num_rows)
        rest = table.slice(offset)
        self._buffer = [rest] if rest.num_rows else []
        self._buffered_rows = rest.num_rows
        if final and rest.num_rows:
            self._stats["points_dropped"] += rest.num_rows
            log.error("points_not_spooled_at_stop", points=rest.num_rows)

    # --- delivery -------------------------------------------------------------------------

    async def _deliver_loop(self, spool: Spool, uploader: Uploader) -> None:
        delay = FIRST_ROUND_DELAY_S
        width = self.settings.upload_concurrency
        while True:
            self._spooled.clear()
            pending = spool.pending()
            if not pending:
                await self._spooled.wait()
                continue
            deferred = False
            # A slice at a time: a frame is read from disk only when its turn comes.
            for start in range(0, len(pending), width):
                outcomes = await asyncio.gather(
                    *(self._deliver(spool, uploader, e) for e in pending[start : start + width])
                )
                deferred = deferred or Outcome.DEFERRED in outcomes
            if not deferred:
                delay = FIRST_ROUND_DELAY_S
                continue
            # Collectors unreachable: retry the round later (safe: a re-send of a frame is
            # answered as a duplicate), jittered, the delay doubling up to a cap.
            await self._clock.sleep(delay * (0.5 + self._rng.random()))
            delay = min(delay * 2, MAX_ROUND_DELAY_S)

    async def _deliver(self, spool: Spool, uploader: Uploader, entry: SpoolEntry) -> Outcome:
        try:
            result = await uploader.deliver(spool, entry)
        except OSError as exc:  # the spool's disk: keep the frame pending
            log.error("delivery_failed", identity=str(entry.identity), error=str(exc))
            if self._health is not None:
                self._health.deferred_locally()
            return Outcome.DEFERRED
        finally:
            self._delivered.set()
        if self._health is not None:
            self._health.delivered(result)
        return result.outcome

    async def _drain(self, spool: Spool, delivery: asyncio.Task[None]) -> None:
        """After the final flush: let delivery run until nothing is pending, or the grace."""
        deadline = self._clock.monotonic() + self.settings.shutdown_grace_s
        while not delivery.done():
            self._delivered.clear()  # before the check, so no delivery goes unnoticed
            remaining = deadline - self._clock.monotonic()
            if not spool.pending_count or remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._delivered.wait()
        if spool.pending_count:
            log.warning("stopping_with_pending_frames", pending=spool.pending_count)
