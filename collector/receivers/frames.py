"""Points → one frame, under an identity derived from the points themselves.

Senders that speak Prometheus remote_write or OTLP have no ``(boot_id, seq)`` of their
own, and they retry: a request whose answer was lost is sent again, byte for byte or
re-encoded. The identity rule makes every re-send a duplicate:

- ``agent_id``: given by the receiver (a header or the principal's name, authorized);
- ``boot_id``: a UUID (version 8, "custom") made of the first 16 bytes of SHA-256 over a
  canonical serialization of the points (`content_digest`), version and variant bits
  set, so it is never all-zero;
- ``seq_start = 0``, ``seq_end = record_count - 1``: row ``i`` of the request (in the
  order the sender sent the samples) has seq ``i``.

Consequences, and why they are sound:
- The same points always map to the same identity, and `protocol.frame.encode_frame` is
  deterministic, so a re-sent request is the same frame: ``200 duplicate``, counted once.
- Two requests with different points cannot share an identity: that would need two
  point lists with one 122-bit digest prefix (a SHA-256 collision).
- The digest covers the points (timestamp, metric, value bits, sorted labels, in order),
  not the request bytes: a sender that re-encodes or re-compresses a retry (another
  protobuf field order, another snappy block split) still gets a duplicate. It is our
  own byte layout, not Arrow's or zstd's, so it does not change when those libraries do.
- The frame bytes may change across library versions (zstd, Arrow IPC) while the
  identity does not. A re-send spanning such an upgrade (e.g. two collector versions
  behind one load balancer) is then an identity conflict whose two frames carry the
  same points: the receivers answer it as a duplicate (the points *are* accepted), and
  the acceptor's quarantine record shows the pair to operators as usual.
- Identical points sent twice on purpose are stored once. For metric samples (same
  series, timestamp and value) that is what every time-series store does too.
"""

from __future__ import annotations

import hashlib
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol.frame import (
    MAX_LABEL_KEY_BYTES,
    MAX_LABEL_VALUE_BYTES,
    MAX_LABELS_PER_ROW,
    MAX_METRIC_BYTES,
    FrameHeader,
    decode_header,
)
from protocol.frame_encode import encode_frame, points_table

DIGEST_DOMAIN = b"lightmetrics.receiver-points.v1\n"
TS_NS_MIN = -(2**63)
TS_NS_MAX = 2**63 - 1
_ROW_HEAD = struct.Struct(">qQH")  # ts_ns, value bits, label count
_LEN = struct.Struct(">I")
_DOUBLE = struct.Struct(">d")
_U64 = struct.Struct(">Q")


@dataclass(slots=True)
class PointRows:
    """Points in request order, as columns (the shape `points_table` takes). Labels are
    kept sorted by name, so the frame does not depend on the order a sender used."""

    ts_ns: list[int] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    labels: list[dict[str, str] | None] = field(default_factory=list)
    _last_given: dict[str, str] | None = field(default=None, init=False, repr=False)
    _last_sorted: dict[str, str] | None = field(default=None, init=False, repr=False)

    def __len__(self) -> int:
        return len(self.ts_ns)

    def append(self, ts_ns: int, metric: str, value: float, labels: dict[str, str]) -> None:
        """Add one point; check it first with `point_problem` (this does not). Pass the
        same (unmodified) dict for the samples of one series: it is sorted once."""
        if labels is not self._last_given:
            self._last_given = labels
            self._last_sorted = dict(sorted(labels.items())) if labels else None
        self.ts_ns.append(ts_ns)
        self.metrics.append(metric)
        self.values.append(value)
        self.labels.append(self._last_sorted)


def point_problem(ts_ns: int, metric: str, labels: Mapping[str, str]) -> str | None:
    """Why a point breaks a PROTOCOL §1 row rule (so a frame could not carry it), or None.

    Lets a receiver refuse one point with a clear reason instead of failing a whole
    frame. The frame encoder checks the same rules again."""
    if not TS_NS_MIN <= ts_ns <= TS_NS_MAX:
        return f"timestamp {ts_ns} ns is outside the int64 range"
    return metric_problem(metric) or labels_problem(labels)


def metric_problem(metric: str) -> str | None:
    """Why ``metric`` cannot be a point's metric name (PROTOCOL §1), or None."""
    size = _utf8_size(metric)
    if size is None or not 1 <= size <= MAX_METRIC_BYTES:
        return f"metric name {metric[:64]!r} must be 1..{MAX_METRIC_BYTES} bytes of UTF-8"
    return None


def labels_problem(labels: Mapping[str, str]) -> str | None:
    """Why ``labels`` cannot be (part of) a point's labels (PROTOCOL §1), or None: more
    than 64, or a key or value outside its size. Looks at no label past the 64th."""
    if len(labels) > MAX_LABELS_PER_ROW:
        return f"{len(labels)} labels (max {MAX_LABELS_PER_ROW})"
    for key, value in labels.items():
        key_size = _utf8_size(key)
        if key_size is None or not 1 <= key_size <= MAX_LABEL_KEY_BYTES:
            return f"label name {key[:64]!r} must be 1..{MAX_LABEL_KEY_BYTES} bytes of UTF-8"
        value_size = _utf8_size(value)
        if value_size is None or value_size > MAX_LABEL_VALUE_BYTES:
            return (
                f"label {key[:64]!r} value must be at most {MAX_LABEL_VALUE_BYTES} bytes of UTF-8"
            )
    return None


def _utf8_size(text: str) -> int | None:
    """UTF-8 length of ``text``; None when it cannot be encoded (a lone surrogate)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def content_digest(rows: PointRows) -> bytes:
    """SHA-256 over the points in order: per row ts (i64), value bits (u64), the metric
    and the labels sorted by name, each string length-prefixed UTF-8."""
    digest = hashlib.sha256(DIGEST_DOMAIN)
    update = digest.update
    for ts_ns, metric, value, labels in zip(
        rows.ts_ns, rows.metrics, rows.values, rows.labels, strict=True
    ):
        pairs = sorted(labels.items()) if labels else []
        (bits,) = _U64.unpack(_DOUBLE.pack(value))
        update(_ROW_HEAD.pack(ts_ns, bits, len(pairs)))
        for text in (metric, *(item for pair in pairs for item in pair)):
            raw = text.encode("utf-8")
            update(_LEN.pack(len(raw)))
            update(raw)
    return digest.digest()


def content_boot_id(rows: PointRows) -> uuid.UUID:
    """The boot_id of a frame carrying ``rows``: UUIDv8 from `content_digest` (never zero)."""
    head = int.from_bytes(content_digest(rows)[:16], "big")
    head &= ~(0xF000 << 64)  # version nibble ...
    head |= 0x8000 << 64  # ... = 8
    head &= ~(0xC000 << 48)  # variant bits ...
    head |= 0x8000 << 48  # ... = RFC 9562
    return uuid.UUID(int=head)


def build_frame(agent_id: str, rows: PointRows) -> tuple[bytes, FrameHeader]:
    """Encode ``rows`` (at least one) as one frame under the content-derived identity.

    Raises `protocol.frame.FrameError` when a point breaks a §1 rule or ``agent_id`` is
    invalid (check points with `point_problem` first to refuse them one by one)."""
    if not rows.ts_ns:
        raise ValueError("a frame needs at least one point")
    table = points_table(rows.ts_ns, rows.metrics, rows.values, rows.labels)
    frame = encode_frame(
        agent_id=agent_id, boot_id=content_boot_id(rows), seq_start=0, points=table
    )
    return frame, decode_header(frame)
