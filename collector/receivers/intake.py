"""The request steps every receiver shares, in the order of PROTOCOL §2.

authenticate (401) → media type and encoding (415) → declared body size (413) →
in-flight caps, shared with ``/v1/batches`` (retryable) → read the body within
``http.read_timeout_s``, never past ``ingest.max_frame_bytes`` (413 / retryable) →
agent_id from the configured header or the principal's name, authorized for the
principal (400 / 403) → the decompressed size the body declares, checked against
``ingest.max_raw_bytes`` before anything is decompressed (413) and reserved in the
in-flight bytes → decompress, parse, map to points and build the frame on the
collector's frame-check threads (`collector.frame_checks.FrameChecker`, the batch path's
bounded pool, holding one of its slots; 400 / 413) → land it like any frame
(`collector.receivers.landing`; retryable).

No byte of the payload is decompressed or parsed for a principal that may not write
the agent_id. A receiver (`Wire`) supplies the format steps and renders the answer;
`Refused.retryable` answers get the receiver's own retryable status (remote_write
senders retry only 5xx, OTLP senders 429 and 503 as well).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from config.tokens import Principal
from protocol.frame import MAX_AGENT_ID_BYTES, FrameError, FrameHeader

from .frames import PointRows, build_frame
from .host import ReceiverHost
from .landing import Stored, StoreUnavailable, land_frame

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class WireError(Exception):
    """The request body is not valid for its format: answer 400 with this detail."""


class TooLarge(Exception):
    """The request (or what it decompresses or maps to) is over a limit: answer 413."""

    def __init__(self, error: str, detail: str, limit: int) -> None:
        super().__init__(detail)
        self.error = error
        self.detail = detail
        self.limit = limit


@dataclass(slots=True)
class Decoded:
    """Points a request maps to, plus what it carried that is not stored.

    ``rejected``: data points refused, by reason (OTLP reports them in
    ``partial_success``); ``dropped``: samples that are not measurements and are left
    out on purpose (native histograms, exemplars), by reason."""

    rows: PointRows = field(default_factory=PointRows)
    rejected: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)


class Wire(Protocol):
    """The format-specific steps of one receiver (see the module docstring)."""

    name: str

    def media_problem(self, request: web.Request) -> str | None:
        """Why the Content-Type / Content-Encoding is not accepted, or None."""
        ...

    def raw_size(self, request: web.Request, body: bytes) -> int:
        """Bytes the body decompresses to, as it declares (cheap; nothing decompressed).
        Raises `WireError`."""
        ...

    def decode(self, request: web.Request, body: bytes, raw_size: int, max_points: int) -> Decoded:
        """Decompress (to at most ``raw_size`` bytes), parse and map to points. Runs in a
        worker thread. Raises `WireError` or `TooLarge`."""
        ...


@dataclass(frozen=True, slots=True)
class Refused:
    status: int | None  # None: retryable, the receiver picks the status
    error: str
    detail: str | None = None
    limit_bytes: int | None = None

    @property
    def retryable(self) -> bool:
        return self.status is None


@dataclass(frozen=True, slots=True)
class Received:
    """The request's points are stored (``stored``), or it carried none (``stored`` None)."""

    agent_id: str
    decoded: Decoded
    stored: Stored | None

    @property
    def outcome(self) -> str:
        return self.stored.outcome if self.stored is not None else "empty"


class Intake:
    """Runs the shared steps for one collector app (its limits, budget and acceptance)."""

    def __init__(
        self, collector: ReceiverHost, *, agent_id_header: str, max_points_per_request: int
    ) -> None:
        self.collector = collector
        self.agent_id_header = agent_id_header
        self.max_points = max_points_per_request

    async def receive(self, request: web.Request, wire: Wire) -> Refused | Received:
        collector = self.collector
        limits = collector.limits
        principal = collector.authenticator.authenticate(request.headers.get("Authorization"))
        if principal is None:
            return Refused(401, "unauthenticated")
        problem = wire.media_problem(request)
        if problem is not None:
            return Refused(415, "unsupported_media", problem)
        declared = request.content_length
        if declared is not None and declared > limits.max_frame_bytes:
            return _body_too_large(limits.max_frame_bytes)
        reserve = declared if declared is not None else limits.max_frame_bytes
        if not collector.admit(reserve):
            return Refused(None, "overloaded")
        try:
            return await self._receive_admitted(request, wire, principal)
        finally:
            collector.release(1, reserve)

    async def _receive_admitted(
        self, request: web.Request, wire: Wire, principal: Principal
    ) -> Refused | Received:
        limits = self.collector.limits
        try:
            async with asyncio.timeout(limits.read_timeout_s):
                body = await _read_body(request, limits.max_frame_bytes)
        except TooLarge:
            return _body_too_large(limits.max_frame_bytes)
        except TimeoutError:
            return Refused(None, "request_timeout", "the body did not arrive in time")
        agent_id, problem = self._agent_id(request, principal)
        if problem is not None:
            return Refused(400, "invalid_agent_id", problem)
        if not principal.may_write(agent_id):
            detail = f"principal {principal.name!r} may not write agent_id {agent_id!r}"
            return Refused(403, "forbidden", detail)
        try:
            raw_size = wire.raw_size(request, body)
        except WireError as exc:
            return Refused(400, "invalid_request", str(exc))
        if raw_size > limits.max_raw_bytes:
            detail = f"the body declares {raw_size} bytes decompressed > max_raw_bytes {limits.max_raw_bytes}"
            return Refused(413, "decompressed_too_large", detail, limits.max_raw_bytes)
        if not self.collector.admit_bytes(raw_size):
            return Refused(None, "overloaded")
        try:
            return await self._decode_and_land(request, wire, agent_id, body, raw_size)
        finally:
            self.collector.release(0, raw_size)

    async def _decode_and_land(
        self, request: web.Request, wire: Wire, agent_id: str, body: bytes, raw_size: int
    ) -> Refused | Received:
        checker = self.collector.frame_checker
        try:
            async with checker.payload_slot():
                decoded, built = await checker.run(
                    self._decode_and_build, request, wire, agent_id, body, raw_size
                )
        except WireError as exc:
            return Refused(400, "invalid_request", str(exc))
        except TooLarge as exc:
            return Refused(413, exc.error, exc.detail, exc.limit)
        if built is None:
            return Received(agent_id, decoded, None)
        frame, header = built
        try:
            stored = await land_frame(self.collector, header, frame)
        except StoreUnavailable as exc:
            return Refused(None, exc.error)
        return Received(agent_id, decoded, stored)

    def _decode_and_build(
        self, request: web.Request, wire: Wire, agent_id: str, body: bytes, raw_size: int
    ) -> tuple[Decoded, tuple[bytes, FrameHeader] | None]:
        decoded = wire.decode(request, body, raw_size, self.max_points)
        if len(decoded.rows) > self.max_points:
            raise too_many_points(len(decoded.rows), self.max_points)
        if not decoded.rows:
            return decoded, None
        try:
            frame, header = build_frame(agent_id, decoded.rows)
        except FrameError as exc:
            raise WireError(f"the points cannot be stored: {exc}") from None
        limits = self.collector.limits
        if len(frame) > limits.max_frame_bytes or header.payload_raw_len > limits.max_raw_bytes:
            raise TooLarge(
                "frame_too_large",
                f"{len(decoded.rows)} points make a frame of {len(frame)} bytes "
                f"({header.payload_raw_len} uncompressed); the limits are max_frame_bytes "
                f"{limits.max_frame_bytes} and max_raw_bytes {limits.max_raw_bytes}: "
                "send fewer samples per request",
                limits.max_frame_bytes,
            )
        return decoded, (frame, header)

    def _agent_id(self, request: web.Request, principal: Principal) -> tuple[str, str | None]:
        given = request.headers.get(self.agent_id_header)
        agent_id = principal.name if given is None else given.strip()
        try:
            size = len(agent_id.encode("utf-8"))
        except UnicodeEncodeError:
            return agent_id, f"{self.agent_id_header} is not valid UTF-8"
        if not 1 <= size <= MAX_AGENT_ID_BYTES:
            return agent_id, f"agent_id must be 1..{MAX_AGENT_ID_BYTES} bytes, got {size}"
        if _CONTROL.search(agent_id):
            return agent_id, "agent_id must not contain control characters"
        return agent_id, None


def too_many_points(count: int, limit: int) -> TooLarge:
    return TooLarge(
        "too_many_points",
        f"the request maps to {count} points > receivers.max_points_per_request {limit}",
        limit,
    )


def _body_too_large(limit: int) -> Refused:
    return Refused(413, "body_too_large", f"the body is larger than {limit} bytes", limit)


async def _read_body(request: web.Request, limit: int) -> bytes:
    """Read at most ``limit`` bytes; raise `TooLarge` as soon as the body exceeds it."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            raise TooLarge("body_too_large", f"the body is larger than {limit} bytes", limit)
        chunks.append(chunk)
    return b"".join(chunks)
