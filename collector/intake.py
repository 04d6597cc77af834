"""Admission of ``POST /v1/batches`` up to a checked frame (PROTOCOL §2, order of checks).

`BatchIntake.admit` runs, in this order, each step refusing with its answer:
authenticate (401) → media type (415) → overload caps (429) → declared body size (413)
→ read the body, at most ``max_frame_bytes`` (413, also for chunked bodies) and within
what is left of the read timeout since the request's first byte (408) → header and CRC
(400) → authorize the principal for the header's agent_id (403) → ``payload_raw_len``
within ``max_raw_bytes`` (400) → charge what checking the payload can allocate (429) →
check the payload (400) → hash. Nothing of the payload is decompressed or decoded before
the principal is known to be allowed to write the agent; header and payload checks run
on `FrameChecker`'s threads, never on the event loop.

Memory: body bytes are charged when admitted (the declared length, or
``max_frame_bytes`` for a chunked body) until the request ends; the payload check is
charged `protocol.frame.payload_check_memory_bound` (a small multiple of
``payload_raw_len``, whatever ``record_count`` a dictionary-encoded metric claims) while
it runs, from when one of the checker's threads is free for it
(`FrameChecker.payload_slot`). Beyond ``max_in_flight_bytes`` the answer is 429 — except
for a request alone in flight, so a frame within every per-frame limit is never refused
forever: a worker's peak is the larger of the cap and one frame's bound.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from config.tokens import Principal
from protocol.batch_api import FRAME_MEDIA_TYPES
from protocol.frame import FrameError, FrameHeader, payload_check_memory_bound

from .auth import Authenticator
from .frame_checks import FrameChecker
from .in_flight import InFlight


@dataclass(frozen=True, slots=True)
class IntakeLimits:
    max_frame_bytes: int
    max_raw_bytes: int
    max_in_flight_requests: int
    max_in_flight_bytes: int
    read_timeout_s: float
    retry_after_s: int


@dataclass(frozen=True, slots=True)
class Refusal:
    """The answer to a request refused before the store protocol."""

    response: web.Response
    outcome: str
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CheckedFrame:
    """A frame that passed every check, from a principal allowed to write its agent."""

    header: FrameHeader
    body: bytes
    sha256: str
    context: dict[str, Any]
    ts_range: tuple[int, int]
    """The points' (min, max) time in unix ns (the index rows' ``min_ts_ns``/``max_ts_ns``)."""


class _TooLarge(Exception):
    pass


def error_response(
    status: int, error: str, headers: dict[str, str] | None = None, **fields: Any
) -> web.Response:
    return web.json_response({"error": error, **fields}, status=status, headers=headers)


def unauthenticated() -> web.Response:
    return error_response(401, "unauthenticated", {"WWW-Authenticate": "Bearer"})


Permission = Literal["read", "admin"]


def authorize(
    authenticator: Authenticator, request: web.Request, permission: Permission
) -> Principal | web.Response:
    """The read and admin endpoints' first step (PROTOCOL §2): the request's principal if
    it holds ``permission`` (``read``: ``read = true`` in the tokens file; ``admin``:
    ``admin = true``), else the answer to send: 401 without a known token, 403 naming the
    principal and the permission it lacks. Nothing else is done for the caller first."""
    principal = authenticator.authenticate(request.headers.get("Authorization"))
    if principal is None:
        return unauthenticated()
    if permission == "read" and not principal.may_read:
        return error_response(
            403, "forbidden", detail=f"principal {principal.name!r} may not read (read = true)"
        )
    if permission == "admin" and not principal.admin:
        return error_response(
            403, "forbidden", detail=f"principal {principal.name!r} is not an admin"
        )
    return principal


class BatchIntake:
    def __init__(
        self,
        *,
        authenticator: Authenticator,
        checker: FrameChecker,
        in_flight: InFlight,
        limits: IntakeLimits,
    ) -> None:
        self._authenticator = authenticator
        self._checker = checker
        self._in_flight = in_flight
        self._limits = limits

    def overloaded(self) -> Refusal:
        headers = {"Retry-After": str(self._limits.retry_after_s)}
        return Refusal(error_response(429, "overloaded", headers), "overloaded")

    def too_large(self) -> Refusal:
        response = error_response(413, "frame_too_large", limit_bytes=self._limits.max_frame_bytes)
        return Refusal(response, "frame_too_large")

    def request_slot(self, request: web.Request) -> Refusal | tuple[Principal, int]:
        """Steps up to the overload caps; on success the caller holds one request and the
        returned body reservation, and must `InFlight.release` them."""
        principal = self._authenticator.authenticate(request.headers.get("Authorization"))
        if principal is None:
            return Refusal(unauthenticated(), "unauthenticated")
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity") or request.content_type not in FRAME_MEDIA_TYPES:
            return Refusal(error_response(415, "unsupported_media"), "unsupported_media")
        declared = request.content_length
        if declared is not None and declared > self._limits.max_frame_bytes:
            return self.too_large()
        reserve = declared if declared is not None else self._limits.max_frame_bytes
        if not self._in_flight.try_reserve(1, reserve, self._limits, always_if_alone=False):
            return self.overloaded()
        return principal, reserve

    async def check(
        self, request: web.Request, principal: Principal, started_at: float
    ) -> Refusal | CheckedFrame:
        """Steps from reading the body to the hash. ``started_at``: monotonic time of the
        request's first byte (the read timeout covers headers and body together)."""
        remaining = self._limits.read_timeout_s - (time.monotonic() - started_at)
        try:
            async with asyncio.timeout(max(0.0, remaining)):
                body = await self._read_body(request)
        except _TooLarge:
            return self.too_large()
        except TimeoutError:
            return Refusal(error_response(408, "request_timeout"), "request_timeout")
        try:
            header = await self._checker.header(body)
        except FrameError as exc:
            return _invalid(str(exc), {})
        context: dict[str, Any] = {
            "agent_id": header.agent_id,
            "boot_id": str(header.boot_id),
            "seq": f"{header.seq_start}-{header.seq_end}",
        }
        if not principal.may_write(header.agent_id):
            detail = f"principal {principal.name!r} may not write agent_id {header.agent_id!r}"
            return Refusal(error_response(403, "forbidden", detail=detail), "forbidden", context)
        if header.payload_raw_len > self._limits.max_raw_bytes:  # poison, not load: never 429
            return _invalid(
                f"payload_raw_len {header.payload_raw_len} > max_raw_bytes "
                f"{self._limits.max_raw_bytes}",
                context,
            )
        charge = payload_check_memory_bound(body, header)
        async with self._checker.payload_slot():  # charged only while a thread checks it
            if not self._in_flight.try_reserve(0, charge, self._limits, always_if_alone=True):
                return Refusal(self.overloaded().response, "overloaded", context)
            try:
                sha, ts_range = await self._checker.payload_sha256(
                    body, header, self._limits.max_raw_bytes
                )
            except FrameError as exc:
                return _invalid(str(exc), context)
            finally:
                self._in_flight.release(0, charge)
        context["frame_sha256"] = sha
        return CheckedFrame(header, body, sha, context, ts_range)

    async def _read_body(self, request: web.Request) -> bytes:
        """Read at most ``max_frame_bytes``; raise `_TooLarge` as soon as the body exceeds it."""
        limit = self._limits.max_frame_bytes
        chunks: list[bytes] = []
        size = 0
        while chunk := await request.content.readany():
            size += len(chunk)
            if size > limit:
                raise _TooLarge
            chunks.append(chunk)
        return b"".join(chunks)


def _invalid(detail: str, context: dict[str, Any]) -> Refusal:
    return Refusal(error_response(400, "invalid_frame", detail=detail), "invalid_frame", context)


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_frame_bytes: int = 8 * 1024 * 1024
    max_raw_bytes: int = 64 * 1024 * 1024
    max_in_flight_requests: int = 256
    max_in_flight_bytes: int = 64 * 1024 * 1024
    read_timeout_s: float = 30.0
    retry_after_s: int = 1
    max_connections: int = 512
    decode_threads: int = 2
    # Batch bodies read and held at once (None: up to max_in_flight_requests). The
    # server sets the store's pool + decode_threads: more could only wait in memory.
    max_bodies_held: int | None = None

    def intake(self) -> IntakeLimits:
        return IntakeLimits(
            max_frame_bytes=self.max_frame_bytes,
            max_raw_bytes=self.max_raw_bytes,
            max_in_flight_requests=self.max_in_flight_requests,
            max_in_flight_bytes=self.max_in_flight_bytes,
            read_timeout_s=self.read_timeout_s,
            retry_after_s=self.retry_after_s,
        )
