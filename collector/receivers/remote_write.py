"""Prometheus remote_write v1 receiver: ``POST /api/v1/write``.

Request: ``Content-Type: application/x-protobuf``, ``Content-Encoding: snappy`` (raw
block format), body = a ``prometheus.WriteRequest`` (`proto/wire.proto`). Remote write
2.0 bodies (``proto=io.prometheus.write.v2.Request``) are refused with 415, as its spec
asks of a v1-only receiver.

Mapping: each sample of each series is one point, in request order: metric = the
``__name__`` label, labels = the other labels, ts = the sample's milliseconds as ns,
value as sent, bit for bit: a staleness marker (the StaleNaN bit pattern Prometheus
writes when a series disappears) is stored like any sample, so a PromQL engine reading
it back (PROTOCOL §5: "staleness markers survive") ends the series where the sender's
Prometheus does, not a lookback delta later. Left out and counted (``dropped`` in the
answer and ``lm_collector_receiver_dropped_points``): native histogram samples (not
stored by this receiver), exemplars. Metadata is ignored.

One request is one frame (identity rule: `collector.receivers.frames`), accepted like
any frame. Answers, per the remote_write spec (senders retry 5xx, and 429 only when
configured to, so every "try again" here is 503):

| outcome | status |
|---|---|
| stored, or a duplicate of stored points | 200, JSON with the identity and manifest |
| no token / unknown token | 401 |
| principal may not write the agent_id | 403 |
| bad snappy, protobuf or series (no ``__name__``, a label over the §1 limits, ...) | 400: nothing is stored |
| body, declared decompressed size, point count or built frame over a limit | 413 |
| other Content-Type / Content-Encoding | 415 |
| overloaded, body not received in time, store unavailable | 503 + Retry-After |

A 400 refuses the whole request (the collector's rule: bad input changes nothing); the
detail names the series and the problem.
"""

from __future__ import annotations

from typing import Any

import cramjam
from aiohttp import web
from google.protobuf.message import DecodeError

from .frames import TS_NS_MAX, TS_NS_MIN, point_problem
from .intake import Decoded, Received, Refused, WireError, too_many_points
from .proto.wire_pb2 import WriteRequest

PATH = "/api/v1/write"
NAME = "remote_write"
_V2_PROTO = "io.prometheus.write.v2.Request"


class RemoteWriteWire:
    """The remote_write format steps for `collector.receivers.intake.Intake`."""

    name = NAME

    def media_problem(self, request: web.Request) -> str | None:
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if request.content_type != "application/x-protobuf":
            return f"Content-Type must be application/x-protobuf, got {request.content_type!r}"
        proto = _media_parameter(request.headers.get("Content-Type", ""), "proto")
        proto = proto or "prometheus.WriteRequest"
        if proto != "prometheus.WriteRequest":
            which = "remote write 2.0" if proto == _V2_PROTO else repr(proto)
            return f"{which} is not supported: send remote write 1.0 (prometheus.WriteRequest)"
        if encoding != "snappy":
            return f"Content-Encoding must be snappy, got {encoding or 'none'!r}"
        return None

    def raw_size(self, request: web.Request, body: bytes) -> int:
        try:
            return int(cramjam.snappy.decompress_raw_len(body))
        except cramjam.DecompressionError as exc:
            raise WireError(f"body is not raw-block snappy: {exc}") from None

    def decode(self, request: web.Request, body: bytes, raw_size: int, max_points: int) -> Decoded:
        raw = _decompress(body, raw_size)
        write = WriteRequest()
        try:
            write.ParseFromString(raw)
        except DecodeError as exc:
            raise WireError(f"body is not a prometheus.WriteRequest: {exc}") from None
        total = sum(len(series.samples) for series in write.timeseries)
        if total > max_points:
            raise too_many_points(total, max_points)
        return write_request_points(write)


def _media_parameter(content_type: str, name: str) -> str | None:
    """The value of parameter ``name`` in a Content-Type header, or None."""
    for parameter in content_type.split(";")[1:]:
        key, _, value = parameter.partition("=")
        if key.strip().lower() == name:
            return value.strip().strip('"')
    return None


def _decompress(body: bytes, raw_size: int) -> bytes:
    """Snappy raw block → exactly ``raw_size`` bytes, never writing more."""
    out = bytearray(raw_size)
    try:
        written = int(cramjam.snappy.decompress_raw_into(body, out))
    except cramjam.DecompressionError as exc:
        raise WireError(f"body is not valid raw-block snappy: {exc}") from None
    if written != raw_size:
        raise WireError(f"snappy body decompressed to {written} bytes, it declares {raw_size}")
    return bytes(out)


def write_request_points(write: WriteRequest) -> Decoded:
    """Map a parsed WriteRequest to points (see the module docstring). Raises `WireError`
    naming the first bad series."""
    decoded = Decoded()
    rows = decoded.rows
    for index, series in enumerate(write.timeseries):
        labels: dict[str, str] = {}
        for label in series.labels:
            if label.name in labels:
                raise WireError(f"series {index}: label {label.name!r} appears twice")
            labels[label.name] = label.value
        metric = labels.pop("__name__", "")
        problem = point_problem(0, metric, labels) if metric else "has no __name__ label"
        if problem is not None:
            raise WireError(f"series {index} ({_describe(metric, labels)}): {problem}")
        for sample in series.samples:
            value = sample.value  # a Python float: a staleness marker keeps its NaN bits
            ts_ns = sample.timestamp * 1_000_000
            if not TS_NS_MIN <= ts_ns <= TS_NS_MAX:
                raise WireError(
                    f"series {index} ({_describe(metric, labels)}): timestamp "
                    f"{sample.timestamp} ms is out of range"
                )
            rows.append(ts_ns, metric, value, labels)
        if series.histograms:
            decoded.dropped["native_histogram"] += len(series.histograms)
        if series.exemplars:
            decoded.dropped["exemplar"] += len(series.exemplars)
    return decoded


def _describe(metric: str, labels: dict[str, str]) -> str:
    text = metric or "?"
    if labels:
        text += "{" + ",".join(f"{k}={v[:40]!r}" for k, v in list(labels.items())[:8]) + "}"
    return text[:300]


def render(result: Refused | Received, *, collector_id: str, retry_after_s: int) -> web.Response:
    """The remote_write answer to ``result``: JSON, every "try again" a 503."""
    if isinstance(result, Refused):
        status = result.status if result.status is not None else 503
        fields: dict[str, Any] = {"error": result.error}
        if result.detail is not None:
            fields["detail"] = result.detail
        if result.limit_bytes is not None:
            fields["limit_bytes"] = result.limit_bytes
        headers = {"Retry-After": str(retry_after_s)} if result.retryable else None
        return web.json_response(fields, status=status, headers=headers)
    body: dict[str, Any] = {
        "accepted": True,
        "agent_id": result.agent_id,
        "points": len(result.decoded.rows),
        "dropped": dict(result.decoded.dropped),
    }
    stored = result.stored
    if stored is not None:
        header = stored.header
        body.update(
            duplicate=stored.duplicate,
            boot_id=str(header.boot_id),
            seq_start=header.seq_start,
            seq_end=header.seq_end,
            frame_sha256=stored.frame_sha256,
            manifest_key=stored.manifest_key,
            collector_id=collector_id,
        )
        if stored.spooled:
            body["spooled"] = True
        if stored.encoding_differs:
            body["encoding_differs"] = True
    return web.json_response(body)
