"""A remote read request, checked before any work (PROTOCOL §5 "Remote read").

In order, each refusing with `ReadRefused` (400 unless said):

1. media type: ``Content-Type: application/x-protobuf`` (parameters allowed; what
   Prometheus sends), ``Content-Encoding`` ``snappy`` or absent (the body is snappy
   block format either way, as Prometheus' own server reads it); anything else is 400;
2. the body's length, at most what snappy can take to encode
   ``query.max_read_request_bytes`` (`max_body_bytes`), read no further;
3. the snappy block's *declared* decoded length (its uvarint preamble, read here,
   `declared_length`) against ``max_read_request_bytes``, before anything is
   decompressed: a snappy bomb never allocates; then decompression into exactly that
   many bytes;
4. the protobuf (`collector.promql.proto.read_pb2.ReadRequest`): garbage is 400;
5. each query: at most `MAX_QUERIES`; its matchers compiled (`collector.promql.matchers`:
   ``MAX_MATCHERS``, RE2 refusals); its range ``[start_timestamp_ms,
   end_timestamp_ms]`` narrowed to ``[hints.start_ms, hints.end_ms]`` when hints are
   present (intersected; hints with both bounds 0 are no hints: proto3 cannot tell an
   empty message from none, and no engine hints the epoch);
6. the response type: the first of ``accepted_response_types`` this collector knows,
   ``SAMPLES`` when the list is empty; a list of only unknown types is 400, as in
   Prometheus' ``NegotiateResponseType``.

Steps 3 to 6 are CPU work on a caller's bytes (RE2 compiles patterns up to 64 KiB):
`parse_body` runs on a thread.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import cramjam
from aiohttp import web
from google.protobuf.message import DecodeError

from .matchers import MatcherError, compile_matchers
from .proto import read_pb2
from .select import ReadQuery

MAX_QUERIES = 64
"""Queries in one request at most (Prometheus' engine sends one a request)."""
SAMPLES = "SAMPLES"
STREAMED = "STREAMED_XOR_CHUNKS"
RESPONSE_TYPES = {0: SAMPLES, 1: STREAMED}
MEDIA_TYPE = "application/x-protobuf"
BODY_TIMEOUT_S = 30.0
FIRST_MS = -62_135_596_800_000 + 3_600_000  # 0001-01-01T01:00Z: an hour in, so hours convert
LAST_MS = 253_402_300_799_999 - 3_600_000  # 9999-12-31T22:59:59.999Z


class ReadRefused(Exception):
    """A read refused before or while it is served: ``status``, a message naming the
    problem, ``limit`` the setting or constant it exceeds (if that is why) and ``kind``,
    ``"limit"`` (a limit: the engine's answer becomes 422) or ``"load"`` (load or store
    trouble: 503)."""

    def __init__(
        self, status: int, message: str, *, limit: str | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.limit = limit
        self.kind = kind or ("limit" if status < 500 and status != 429 else "load")


@dataclass(frozen=True, slots=True)
class ParsedRead:
    queries: tuple[ReadQuery, ...]
    response_type: str  # SAMPLES | STREAMED


def media_problem(content_type: str, encoding: str) -> str | None:
    """Why a request's media headers are refused, or None."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media != MEDIA_TYPE:
        return f"Content-Type must be {MEDIA_TYPE} (a snappy prometheus.ReadRequest), got {media or 'none'!r}"
    coding = encoding.strip().lower()
    if coding not in ("", "snappy"):
        return f"Content-Encoding must be snappy, got {coding!r}"
    return None


def max_body_bytes(max_decoded: int) -> int:
    """The longest snappy block that can decode to ``max_decoded`` bytes (snappy's own
    bound, ``32 + n + n / 6``)."""
    return 32 + max_decoded + max_decoded // 6


async def read_body(request: web.Request, max_decoded: int) -> bytes:
    """Steps 1 and 2 of the module doc: the body, checked media type, read no further
    than `max_body_bytes` (and within `BODY_TIMEOUT_S`)."""
    problem = media_problem(
        request.headers.get("Content-Type", ""), request.headers.get("Content-Encoding", "")
    )
    if problem is not None:
        raise ReadRefused(400, problem)
    limit = max_body_bytes(max_decoded)
    too_long = ReadRefused(
        400,
        f"body over {limit} bytes: it cannot decode within query.max_read_request_bytes"
        f" ({max_decoded})",
        limit="max_read_request_bytes",
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_long
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in request.content.iter_chunked(64 * 1024):
                size += len(chunk)
                if size > limit:
                    raise too_long
                parts.append(chunk)
    except TimeoutError:
        raise ReadRefused(400, f"body not received within {BODY_TIMEOUT_S:g} s") from None
    return b"".join(parts)


def declared_length(body: bytes) -> int:
    """The decoded length a snappy block declares: its uvarint preamble (at most 5
    bytes, a 32-bit value). `ReadRefused` when there is none."""
    value = 0
    for i in range(min(5, len(body))):
        byte = body[i]
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            if value > 0xFFFFFFFF:
                break
            return value
    raise ReadRefused(400, "body is not snappy block format (no valid length preamble)")


def decompress(body: bytes, max_decoded: int) -> bytes:
    """The snappy block ``body`` decoded, its declared length checked first."""
    size = declared_length(body)
    if size > max_decoded:
        raise ReadRefused(
            400,
            f"the request declares {size} bytes decoded, over query.max_read_request_bytes"
            f" ({max_decoded})",
            limit="max_read_request_bytes",
        )
    out = bytearray(size)
    try:
        written = int(cramjam.snappy.decompress_raw_into(body, out))
    except (cramjam.DecompressionError, ValueError) as exc:
        raise ReadRefused(400, f"body is not valid snappy block format: {exc}") from None
    if written != size:
        raise ReadRefused(400, f"snappy body decoded to {written} bytes, it declares {size}")
    return bytes(out)


def _query(index: int, query: read_pb2.Query) -> ReadQuery:
    try:
        matchers = compile_matchers([_Spec(int(m.type), m.name, m.value) for m in query.matchers])
    except MatcherError as exc:
        raise ReadRefused(400, f"query {index}: {exc}", limit=exc.limit) from None
    start, end = int(query.start_timestamp_ms), int(query.end_timestamp_ms)
    if query.HasField("hints"):
        hints = query.hints
        if hints.start_ms or hints.end_ms:
            start, end = max(start, int(hints.start_ms)), min(end, int(hints.end_ms))
    # Clamped to the times a stored point can have (timestamp[us] as a datetime: years
    # 1 to 9999), so every bound converts: a range past them selects the same points.
    return ReadQuery(max(start, FIRST_MS), min(end, LAST_MS), matchers)


@dataclass(frozen=True, slots=True)
class _Spec:
    kind: int
    name: str
    value: str


def parse_body(body: bytes, *, max_decoded: int) -> ParsedRead:
    """Steps 3 to 6 of the module doc. Blocking (run on a thread); `ReadRefused`."""
    raw = decompress(body, max_decoded)
    request = read_pb2.ReadRequest()
    try:
        request.ParseFromString(raw)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise ReadRefused(400, f"body is not a prometheus.ReadRequest: {exc}") from None
    if len(request.queries) > MAX_QUERIES:
        raise ReadRefused(
            400,
            f"{len(request.queries)} queries in one request; at most {MAX_QUERIES} (MAX_QUERIES)",
            limit="MAX_QUERIES",
        )
    queries = tuple(_query(i, q) for i, q in enumerate(request.queries))
    accepted = [int(t) for t in request.accepted_response_types]
    known = [RESPONSE_TYPES[t] for t in accepted if t in RESPONSE_TYPES]
    if accepted and not known:
        raise ReadRefused(
            400,
            f"none of the accepted response types {accepted} is supported (0: SAMPLES, 1: STREAMED_XOR_CHUNKS)",
        )
    return ParsedRead(queries, known[0] if known else SAMPLES)
