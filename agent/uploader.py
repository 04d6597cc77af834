"""Delivering spooled frames to collectors, per the agent contract of PROTOCOL §2.

| answer                                          | what the uploader does                |
|-------------------------------------------------|---------------------------------------|
| 200                                             | delete from the spool; note duplicate |
| 409                                             | park as conflict, log, stop retrying  |
| 400 / 413 / 415                                 | park as poison with the response JSON |
| no connection; 503 ``clock_skewed``              | the next collector at once (below)    |
| 401 / 403 / 429 / 5xx / other / network / timeout | retry with jittered backoff          |

Retrying is safe because a frame is immutable and the collector's answer depends only on
its bytes and what is already accepted: a resend is answered 200 duplicate if an earlier
attempt landed. Retries are bounded per round (`UploadPolicy.backoff.attempts`); a batch
that exhausts them stays pending (`Outcome.DEFERRED`) for the caller's next round.
``Retry-After`` is honoured, capped at `UploadPolicy.max_retry_after_s`. Attempts rotate
round-robin over the configured collector URLs, so a retry goes to the next collector.

Failing over: when an attempt's fault is that collector's alone (no connection could be
made, or 503 ``clock_skewed``: its clock is off the store's, PROTOCOL §3.8), the next URL
not tried since the last wait is tried at once; the backoff delay is waited only once
every URL has failed since then. A collector that is down or restarting costs its agents
no waiting while another one answers, and a fault every collector may share (429, 503
``store_unavailable``, a timeout) is still met with backoff, so a store outage is not
multiplied by the number of URLs. Every attempt counts against `backoff.attempts`, waited
for or not, so the bound per round is unchanged. (PROTOCOL §2 says only "retry with
backoff"; waiting before trying a collector that has not failed protects nothing.)
Requests in flight are limited by one semaphore per `Uploader`.

Every re-send of a frame this `Uploader` sent before (a retry within a round, or the
same frame in a later round) carries ``X-Lightmetrics-Resend: 1``: the collector then
reads the accepted manifest first and answers a duplicate with one GET instead of
uploading the frame again (PROTOCOL §3.2; the header changes the order of the
collector's checks, never its answer). The frames sent and not yet settled are
remembered in memory, at most `UploadPolicy.remembered_frames` (the oldest are
forgotten: their next re-send merely goes without the header); frames recovered from the
spool after a restart are sent once without it.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import itertools
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Self

import aiohttp
import structlog

from agent.answers import Answer, parse_json, reason_of, retry_after_s
from agent.spool import ParkKind, Spool, SpoolEntry, identity_of
from protocol.batch_api import BATCHES_PATH, FRAME_CONTENT_TYPE, RESEND_HEADER
from protocol.clock import Clock, SystemClock
from protocol.keys import BatchIdentity
from store.retry import Backoff

_POISON_STATUSES = frozenset({400, 413, 415})

log = structlog.get_logger("agent.uploader")


class Outcome(enum.StrEnum):
    ACCEPTED = "accepted"  # 200, new batch
    DUPLICATE = "duplicate"  # 200, the collector already had these exact bytes
    CONFLICT = "conflict"  # 409: parked
    POISON = "poison"  # 400/413/415: parked
    DEFERRED = "deferred"  # retries exhausted this round: still pending

    @property
    def delivered(self) -> bool:
        return self in (Outcome.ACCEPTED, Outcome.DUPLICATE)


@dataclass(frozen=True, slots=True)
class UploadPolicy:
    """Limits of one `Uploader`. ``backoff.attempts`` is the number of tries per round."""

    concurrency: int = 8
    request_timeout_s: float = 30.0
    backoff: Backoff = field(default_factory=lambda: Backoff(attempts=6, base_s=0.1, cap_s=5.0))
    max_retry_after_s: float = 10.0
    remembered_frames: int = 65_536
    """Frames sent and not yet settled whose re-sends carry the resend header."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.remembered_frames < 0:
            raise ValueError(f"remembered_frames must be >= 0, got {self.remembered_frames}")
        if self.request_timeout_s <= 0 or self.max_retry_after_s < 0:
            raise ValueError("request_timeout_s must be > 0 and max_retry_after_s >= 0")


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What happened to one frame in one round of delivery.

    ``ack_latency_s``: request-to-answer time of the attempt that got the 200 (``None``
    unless delivered). ``elapsed_s``: from the first attempt to the final answer,
    including backoff. ``status``/``response``: the last HTTP answer (``None`` after a
    network error, which ``error`` then describes)."""

    identity: BatchIdentity
    frame_sha256: str
    outcome: Outcome
    attempts: int
    status: int | None
    response: Any
    error: str | None
    url: str | None
    ack_latency_s: float | None
    elapsed_s: float

    @property
    def retries(self) -> int:
        return self.attempts - 1


class Uploader:
    """POSTs frames to collectors (``Authorization: Bearer <token>`` unless ``token`` is
    ``None``). Use as ``async with Uploader(...) as uploader`` (or
    pass a ``session`` you own and close)."""

    def __init__(
        self,
        *,
        urls: list[str],
        token: str | None,
        policy: UploadPolicy | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        if not urls:
            raise ValueError("need at least one collector URL")
        self.urls = [url.rstrip("/") for url in urls]
        self.policy = policy if policy is not None else UploadPolicy()
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._rng = rng if rng is not None else random.Random()
        self._headers = {"Content-Type": FRAME_CONTENT_TYPE}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"
        self._next_url = itertools.cycle(self.urls)
        self._sent: OrderedDict[str, None] = OrderedDict()  # sha256 of frames sent, unsettled
        self._semaphore = asyncio.Semaphore(self.policy.concurrency)
        self._session = session
        self._owns_session = session is None

    async def __aenter__(self) -> Self:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.policy.concurrency),
                # No automatic decompression surprises, no cookies: frames only.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def deliver(self, spool: Spool, entry: SpoolEntry) -> BatchResult:
        """Send one pending entry and apply the contract to the spool: delete on 200,
        park on 409 / 400 / 413 / 415, leave pending when retries run out."""
        result = await self.send(entry.read(), entry.identity, entry.frame_sha256)
        if result.outcome.delivered:
            spool.delete(entry)
        elif result.outcome is Outcome.CONFLICT:
            spool.park(
                entry,
                ParkKind.CONFLICT,
                status=result.status,
                reason="identity_conflict",
                response=result.response,
                extra={"url": result.url},
            )
            log.warning(
                "batch_parked_conflict",
                identity=str(entry.identity),
                frame_sha256=entry.frame_sha256,
                url=result.url,
                response=result.response,
            )
        elif result.outcome is Outcome.POISON:
            spool.park(
                entry,
                ParkKind.POISON,
                status=result.status,
                reason=reason_of(result.response, "rejected"),
                response=result.response,
                extra={"url": result.url},
            )
            log.error(
                "batch_parked_poison",
                identity=str(entry.identity),
                status=result.status,
                url=result.url,
                response=result.response,
            )
        return result

    async def send(
        self,
        frame: bytes,
        identity: BatchIdentity | None = None,
        frame_sha256: str | None = None,
    ) -> BatchResult:
        """POST ``frame`` with bounded retries and classify the final answer. Touches no
        spool (benchmarks may call this directly). ``identity`` and ``frame_sha256`` are
        read from / computed over ``frame`` when not given (`FrameError` if it is not a
        frame)."""
        if identity is None:
            identity = identity_of(frame)
        if frame_sha256 is None:
            frame_sha256 = hashlib.sha256(frame).hexdigest()
        started = self._clock.monotonic()
        delays = self.policy.backoff.delays(self._rng)
        attempts = 0
        fail_over_to: str | None = None
        tried: set[str] = set()  # the URLs tried since the last wait
        while True:
            attempts += 1
            url = fail_over_to or next(self._next_url)
            tried.add(url)
            resend = self._note_sent(frame_sha256)
            answer = await self._attempt(url, frame, resend=resend)
            outcome = _classify(answer.status, answer.response)
            if outcome is not None:
                self._sent.pop(frame_sha256, None)  # settled: never sent again
                return BatchResult(
                    identity,
                    frame_sha256,
                    outcome,
                    attempts,
                    answer.status,
                    answer.response,
                    answer.error,
                    url,
                    answer.latency_s if outcome.delivered else None,
                    self._clock.monotonic() - started,
                )
            delay = next(delays, None)  # every attempt counts, waited for or not
            if delay is None:
                break
            fail_over_to = self._untried_after(url, tried) if answer.collector_local else None
            if fail_over_to is not None:
                log.debug(
                    "batch_fail_over",
                    identity=str(identity),
                    status=answer.status,
                    error=answer.error or reason_of(answer.response, ""),
                    url=url,
                    to=fail_over_to,
                )
                continue
            tried.clear()
            if answer.retry_after_s is not None:
                delay = max(delay, min(answer.retry_after_s, self.policy.max_retry_after_s))
            log.debug(
                "batch_retry",
                identity=str(identity),
                status=answer.status,
                error=answer.error,
                delay_s=delay,
            )
            await self._clock.sleep(delay)
        log.info(
            "batch_deferred",
            identity=str(identity),
            attempts=attempts,
            status=answer.status,
            error=answer.error,
        )
        return BatchResult(
            identity,
            frame_sha256,
            Outcome.DEFERRED,
            attempts,
            answer.status,
            answer.response,
            answer.error,
            url,
            None,
            self._clock.monotonic() - started,
        )

    def _untried_after(self, url: str, tried: set[str]) -> str | None:
        """The first configured URL after ``url`` (in rotation order) not in ``tried``."""
        start = self.urls.index(url)
        later = self.urls[start + 1 :] + self.urls[:start]
        return next((candidate for candidate in later if candidate not in tried), None)

    def _note_sent(self, frame_sha256: str) -> bool:
        """Remember that the frame is being sent; True if it was sent before."""
        resend = frame_sha256 in self._sent
        if resend:
            self._sent.move_to_end(frame_sha256)
        elif self.policy.remembered_frames:
            self._sent[frame_sha256] = None
            while len(self._sent) > self.policy.remembered_frames:
                self._sent.popitem(last=False)
        return resend

    async def _attempt(self, url: str, frame: bytes, *, resend: bool) -> Answer:
        """One POST and its answer (``reached`` False when no connection was made)."""
        if self._session is None:
            raise RuntimeError("Uploader used outside 'async with' and without a session")
        timeout = aiohttp.ClientTimeout(total=self.policy.request_timeout_s)
        headers = {**self._headers, RESEND_HEADER: "1"} if resend else self._headers
        async with self._semaphore:
            sent_at = self._clock.monotonic()
            try:
                async with self._session.post(
                    url + BATCHES_PATH, data=frame, headers=headers, timeout=timeout
                ) as response:
                    body = await response.read()
                    latency = self._clock.monotonic() - sent_at
                    retry_after = retry_after_s(
                        response.headers.get("Retry-After"), self._clock.now_ns()
                    )
                    return Answer(response.status, parse_json(body), None, retry_after, latency)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                latency = self._clock.monotonic() - sent_at
                # Refused, unreachable, a name that does not resolve, a TLS handshake that
                # failed: the frame never reached that collector. A timeout or a dropped
                # connection may have reached it (and its store writes may still land).
                reached = not isinstance(exc, aiohttp.ClientConnectorError)
                error = f"{type(exc).__name__}: {exc}"
                return Answer(None, None, error, None, latency, reached=reached)


def _classify(status: int | None, response: Any) -> Outcome | None:
    """The final outcome of an answer, or ``None`` when it is worth retrying."""
    if status == 200:
        # Any 200 means the batch is accepted (delete it); the body only says whether
        # this request was the first to land it.
        duplicate = isinstance(response, dict) and response.get("duplicate") is True
        return Outcome.DUPLICATE if duplicate else Outcome.ACCEPTED
    if status == 409:
        return Outcome.CONFLICT
    if status in _POISON_STATUSES:
        return Outcome.POISON
    return None
