"""OTLP/HTTP metrics receiver: ``POST /v1/metrics``.

Request: an ``ExportMetricsServiceRequest`` (``opentelemetry-proto``) as binary protobuf
(``Content-Type: application/x-protobuf``) or as OTLP JSON (``application/json``),
optionally ``Content-Encoding: gzip`` (the OpenTelemetry Collector's default). A gzip
body must be one gzip member: its trailer's ISIZE is the declared decompressed size,
checked against ``ingest.max_raw_bytes`` before inflating, and the body must inflate to
exactly that many bytes (inflation stops one byte past it). Decoding runs on the
collector's frame-check threads (``http.decode_threads``), as a batch's check does.

OTLP JSON is bounded before it is parsed: ``json_format.Parse`` (``json.loads``, then the
message) took up to ~180 bytes per element and ~2 per byte of text, measured by peak RSS
on adversarial shapes (empty objects and arrays, 4-byte escaped strings, integers) and
a realistic export (an empty object is 3 bytes of text and ~60 of memory), so the
text's elements are counted first (every ``{``, ``[`` and ``,``, strings included: an
upper bound, with one ``bytes.count`` each) and a body whose parse could take more than
`JSON_PARSE_BYTES_PER_ELEMENT` x elements + `JSON_PARSE_BYTES_PER_BYTE` x its size > 8
x ``ingest.max_raw_bytes`` (the charge of the largest frame's check,
`protocol.frame.CHECK_MEMORY_PER_RAW_BYTE`) is refused with 413 ``json_too_complex``;
messages nest at most `JSON_MAX_DEPTH` deep (deeper is 400), and the parser's own
nesting is bounded by the interpreter's recursion limit (400).

Mapping: `collector.receivers.otlp_points`. The request's points are one frame (identity
rule: `collector.receivers.frames`), accepted like any frame. Answers follow the OTLP/HTTP
spec: success is 200 with an ``ExportMetricsServiceResponse`` in the request's encoding,
whose ``partial_success`` counts the data points refused and says why (the rest are
stored); failures carry a ``google.rpc.Status`` in the request's encoding.

| outcome | status |
|---|---|
| stored, a duplicate, or nothing storable (all refused: ``partial_success``) | 200 |
| malformed protobuf/JSON/gzip, bad agent_id | 400 (not retried) |
| no or unknown token / principal may not write the agent_id | 401 / 403 |
| body, declared decompressed size, data point count, JSON elements or built frame over a limit | 413 |
| a resource or scope whose attributes no point could carry (more than 64, a key or value over §1's sizes) | 400 |
| other Content-Type / Content-Encoding | 415 |
| too many requests in flight | 429 + Retry-After (retried) |
| body not received in time, store unavailable | 503 + Retry-After (retried) |

Every answer also says what happened in ``X-Lightmetrics-Outcome`` (``accepted``,
``duplicate``, ``empty`` or the error) and, when stored, ``X-Lightmetrics-Manifest-Key``.
"""

from __future__ import annotations

import struct
import zlib

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from .intake import Decoded, Received, Refused, TooLarge, WireError
from .otlp_points import request_points
from .proto.wire_pb2 import Status

PATH = "/v1/metrics"
NAME = "otlp"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_ISIZE = struct.Struct("<I")
_GZIP_MIN_BYTES = 18  # 10-byte header + empty deflate stream (2) + CRC32 + ISIZE
_GRPC_CODES = {400: 3, 401: 16, 403: 7, 413: 8, 415: 3, 429: 8, 503: 14}
_MAX_REASONS = 10
JSON_PARSE_BYTES_PER_ELEMENT = 200
JSON_PARSE_BYTES_PER_BYTE = 4
JSON_MAX_DEPTH = 32


class OtlpWire:
    """The OTLP/HTTP format steps for `collector.receivers.intake.Intake`."""

    name = NAME

    def __init__(self, *, max_json_parse_bytes: int) -> None:
        self.max_json_parse_bytes = max_json_parse_bytes

    def media_problem(self, request: web.Request) -> str | None:
        if request.content_type not in (PROTOBUF, JSON):
            return f"Content-Type must be {PROTOBUF} or {JSON}, got {request.content_type!r}"
        if _encoding(request) not in ("", "identity", "gzip"):
            return f"Content-Encoding must be gzip or none, got {_encoding(request)!r}"
        return None

    def raw_size(self, request: web.Request, body: bytes) -> int:
        if _encoding(request) != "gzip":
            return len(body)
        if len(body) < _GZIP_MIN_BYTES or body[:2] != b"\x1f\x8b":
            raise WireError("body is not gzip (Content-Encoding: gzip)")
        (isize,) = _ISIZE.unpack_from(body, len(body) - 4)
        return int(isize)

    def decode(self, request: web.Request, body: bytes, raw_size: int, max_points: int) -> Decoded:
        raw = _gunzip(body, raw_size) if _encoding(request) == "gzip" else body
        export = ExportMetricsServiceRequest()
        try:
            if request.content_type == JSON:
                self._check_json_size(raw)
                json_format.Parse(
                    raw.decode("utf-8"),
                    export,
                    ignore_unknown_fields=True,
                    max_recursion_depth=JSON_MAX_DEPTH,
                )
            else:
                export.ParseFromString(raw)
        except (DecodeError, json_format.ParseError, UnicodeDecodeError, RecursionError) as exc:
            kind = "OTLP JSON" if request.content_type == JSON else "protobuf"
            raise WireError(f"body is not an ExportMetricsServiceRequest ({kind}): {exc}") from None
        return request_points(export, max_points)

    def _check_json_size(self, raw: bytes) -> None:
        """Raise `TooLarge` when parsing ``raw`` could take more than the limit (see the
        module docstring); reads the text with three ``bytes.count`` calls."""
        elements = raw.count(b"{") + raw.count(b"[") + raw.count(b",") + 1
        bound = JSON_PARSE_BYTES_PER_ELEMENT * elements + JSON_PARSE_BYTES_PER_BYTE * len(raw)
        if bound > self.max_json_parse_bytes:
            raise TooLarge(
                "json_too_complex",
                f"the OTLP JSON body of {len(raw)} bytes has up to {elements} elements and may "
                f"take {bound} bytes to parse > {self.max_json_parse_bytes} "
                "(8 x ingest.max_raw_bytes): send smaller requests, or protobuf",
                self.max_json_parse_bytes,
            )


def _encoding(request: web.Request) -> str:
    return request.headers.get("Content-Encoding", "").strip().lower()


def _gunzip(body: bytes, raw_size: int) -> bytes:
    """One gzip member → exactly ``raw_size`` bytes (never more than raw_size + 1 held)."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        raw = inflater.decompress(body, raw_size + 1)
    except zlib.error as exc:
        raise WireError(f"body is not valid gzip: {exc}") from None
    if len(raw) > raw_size:
        raise WireError(f"gzip body inflates past the {raw_size} bytes its trailer declares")
    if not inflater.eof or inflater.unused_data or len(raw) != raw_size:
        raise WireError("gzip body must be exactly one complete member matching its trailer")
    return raw


def render(request: web.Request, result: Refused | Received, retry_after_s: int) -> web.Response:
    """The OTLP answer to ``result``, in the request's encoding."""
    as_json = request.content_type == JSON
    if isinstance(result, Refused):
        status = result.status if result.status is not None else _retry_status(result)
        message = result.error + (f": {result.detail}" if result.detail else "")
        headers = {"X-Lightmetrics-Outcome": result.error}
        if result.retryable:
            headers["Retry-After"] = str(retry_after_s)
        body = Status(code=_GRPC_CODES.get(status, 2), message=message)
        return _message_response(body, status, as_json, headers)
    response = ExportMetricsServiceResponse()
    rejected = result.decoded.rejected
    if rejected:
        response.partial_success.rejected_data_points = sum(rejected.values())
        response.partial_success.error_message = _reasons(rejected)
    headers = {"X-Lightmetrics-Outcome": result.outcome}
    if result.stored is not None:
        headers["X-Lightmetrics-Manifest-Key"] = result.stored.manifest_key
    return _message_response(response, 200, as_json, headers)


def _retry_status(result: Refused) -> int:
    return 429 if result.error == "overloaded" else 503


def _reasons(rejected: dict[str, int]) -> str:
    ordered = sorted(rejected.items(), key=lambda item: (-item[1], item[0]))
    text = "; ".join(f"{reason} ({count} data points)" for reason, count in ordered[:_MAX_REASONS])
    if len(ordered) > _MAX_REASONS:
        text += f"; and {len(ordered) - _MAX_REASONS} more reasons"
    return "refused: " + text


def _message_response(
    message: Message, status: int, as_json: bool, headers: dict[str, str]
) -> web.Response:
    if as_json:
        text = json_format.MessageToJson(message, indent=None)
        return web.Response(status=status, text=text, content_type=JSON, headers=headers)
    return web.Response(
        status=status, body=message.SerializeToString(), content_type=PROTOBUF, headers=headers
    )
