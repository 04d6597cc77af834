"""Batch frame codec (`.lmbatch`, frame_version 1): PROTOCOL.md §1. Pure code, no I/O.

`decode_header` is the cheap gate the collector runs on every request; `decode_frame`
adds the payload (zstd, Arrow IPC, column rules) and returns points in one canonical
shape (`POINTS_SCHEMA`); `protocol.frame_encode.encode_frame` builds frames that
`decode_frame` accepts.
Every violation raises `FrameError` (a ValueError) naming the field and the problem;
decoding raises nothing else on bad input.

Header checks run in this order so that a corrupted byte is reported as a CRC mismatch
rather than as garbage field values: structure (minimum length, magic, frame_version,
exact total length) → CRC-32 → header fields (flags, agent_id_len, boot_id, sequence
numbers, record_count, payload_raw_len, agent_id text).

Decisions where §1 is silent or loose (change them only together with PROTOCOL.md):
- "Control characters" are exactly the parenthesised set: bytes < 0x20 and 0x7F.
  C1 code points (U+0080..U+009F) are allowed. Lengths are UTF-8 byte lengths.
- `max_raw_bytes` (a reader's limit, not a wire rule) bounds `payload_raw_len` for
  compressed *and* uncompressed frames; an empty payload (raw length 0) is refused. It
  also bounds the decoded points (`OpenedFrame.decoded_bytes`: fixed-width columns,
  offsets, metric text with a dictionary expanded per row, label text): a frame of many
  rows pointing at one long dictionary value is refused before anything expands it.
- zstd: one frame, nothing after it; a content-size field, when present, must equal
  `payload_raw_len` (checked before any allocation); output is capped at and must be
  exactly `payload_raw_len`; the declared window may be at most
  max(8 MiB, payload_raw_len), so a frame without a content size cannot make the
  decoder allocate more than that. Dictionaries are not supported.
- Arrow: exactly one IPC stream; the end-of-stream marker is optional but nothing may
  follow the stream. IPC *body* compression is refused: it would expand past the
  `payload_raw_len` bound. Zero-row record batches are allowed (rows are summed).
- Columns may come in any order; each required name must appear exactly once. All four
  (ts, metric, value, labels) are required: "null means no labels" is about a row, so
  a frame without labels sends an all-null labels column. Schema nullability flags
  and metadata are ignored; the data is checked.
- `ts` must be exactly timestamp[ns, tz="UTC"] ("+00:00" or "Etc/UTC" are refused).
  `metric` dictionaries may use any integer index type; `utf8_view` is refused.
  `labels` keys and values must be utf8 (not large_utf8/dictionary); map field names
  and the keys_sorted flag are ignored; a null row's child entries are ignored.
- Extra columns are not validated beyond what the IPC reader needs, and are dropped.
  `encode_frame` writes only the canonical columns (one record batch per chunk).
"""

from __future__ import annotations

import re
import struct
import uuid
import zlib
from dataclasses import dataclass

import pyarrow as pa
import zstandard

from protocol._frame_error import FrameError, decoder_errors_as_frame_errors
from protocol._identity_keys import BatchIdentity
from protocol._ipc_stream import MAX_PAYLOAD_MESSAGES, read_ipc_stream
from protocol._points_check import (
    MAX_LABEL_KEY_BYTES,
    MAX_LABEL_VALUE_BYTES,
    MAX_LABELS_PER_ROW,
    MAX_METRIC_BYTES,
    POINTS_SCHEMA,
    CheckedPoints,
    checked_points,
    time_range,
)

__all__ = [
    "CRC_LEN",
    "FLAG_ZSTD",
    "FRAME_MAGIC",
    "FRAME_VERSION",
    "HEADER_LEN",
    "MAX_AGENT_ID_BYTES",
    "MAX_PAYLOAD_MESSAGES",
    "MAX_LABELS_PER_ROW",
    "MAX_LABEL_KEY_BYTES",
    "MAX_LABEL_VALUE_BYTES",
    "MAX_METRIC_BYTES",
    "POINTS_SCHEMA",
    "Frame",
    "FrameError",
    "FrameHeader",
    "OpenedFrame",
    "check_payload",
    "frame_time_range",
    "decode_frame",
    "decode_header",
    "open_payload",
    "payload_check_memory_bound",
]

FRAME_MAGIC = b"LMB1"
FRAME_VERSION = 1
FLAG_ZSTD = 0x01
HEADER_LEN = 52
CRC_LEN = 4
MAX_AGENT_ID_BYTES = 128

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
_MIN_FRAME_LEN = HEADER_LEN + CRC_LEN
# magic, frame_version, flags, agent_id_len, boot_id, seq_start, seq_end,
# record_count, payload_len, payload_raw_len — big-endian, offsets as in §1.
HEADER_STRUCT = struct.Struct(">4sBBH16sQQIII")
CRC_STRUCT = struct.Struct(">I")
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")
# zstd at levels <= 19 declares at most an 8 MiB window when streaming.
_MIN_ZSTD_WINDOW = 8 * 1024 * 1024
assert HEADER_STRUCT.size == HEADER_LEN
# `payload_check_memory_bound`: bytes allocated per byte of decompressed payload (the
# stream included) and per IPC message, worst case over the shapes measured by
# tests/protocol/test_frame_memory.py (about 7 and 4 KiB), with headroom.
CHECK_MEMORY_PER_RAW_BYTE = 8
CHECK_MEMORY_PER_MESSAGE = 8 * 1024
CHECK_MEMORY_OVERHEAD = 256 * 1024
_MIN_MESSAGE_BYTES = 64  # no IPC message is smaller (8-byte prefix, padded flatbuffer)


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """The validated fixed header and agent_id of a frame (payload not yet inspected)."""

    agent_id: str
    boot_id: uuid.UUID
    seq_start: int
    seq_end: int
    record_count: int
    flags: int
    payload_len: int
    payload_raw_len: int

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_ZSTD)

    @property
    def identity(self) -> BatchIdentity:
        """The batch identity the header names (PROTOCOL §3)."""
        return BatchIdentity(self.agent_id, self.boot_id, self.seq_start, self.seq_end)


@dataclass(frozen=True, slots=True)
class Frame:
    """A fully validated frame. Row i of `points` has sequence number seq_start + i;
    `points` has exactly `POINTS_SCHEMA` (metric decoded to utf8, extra columns gone)."""

    agent_id: str
    boot_id: uuid.UUID
    seq_start: int
    seq_end: int
    record_count: int
    flags: int
    points: pa.Table


def agent_id_text(raw: bytes) -> str:
    """agent_id bytes → str: valid UTF-8, no control characters (< 0x20, 0x7F)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrameError(
            f"agent_id is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    control = _CONTROL.search(raw)
    if control is not None:
        raise FrameError(
            f"agent_id has control character 0x{raw[control.start()]:02x} at byte {control.start()}"
        )
    return text


def decode_header(data: bytes | memoryview) -> FrameHeader:
    """Validate everything in `data` except the payload contents; return the header.

    O(1) apart from one CRC-32 pass over the frame (`data` may be a view into a bundle,
    PROTOCOL §3.10: nothing is copied but the agent_id). Raises FrameError (bad magic,
    unsupported frame_version, wrong total length, CRC mismatch, or a header field
    breaking its §1 rule).
    """
    size = len(data)
    if size < _MIN_FRAME_LEN:
        raise FrameError(
            f"frame length {size} < minimum {_MIN_FRAME_LEN} "
            f"(header {HEADER_LEN} + crc32 {CRC_LEN}): truncated"
        )
    (magic, version, flags, agent_id_len, boot_raw, seq_start, seq_end, record_count,
     payload_len, raw_len) = HEADER_STRUCT.unpack_from(data)  # fmt: skip
    if magic != FRAME_MAGIC:
        raise FrameError(f"magic {magic!r} != {FRAME_MAGIC!r}: not a batch frame")
    if version != FRAME_VERSION:
        raise FrameError(f"frame_version {version} is not supported (expected {FRAME_VERSION})")
    expected = _MIN_FRAME_LEN + agent_id_len + payload_len
    if size != expected:
        raise FrameError(
            f"frame length {size} != {_MIN_FRAME_LEN} + agent_id_len {agent_id_len} "
            f"+ payload_len {payload_len} = {expected}"
        )
    (stated_crc,) = CRC_STRUCT.unpack_from(data, size - CRC_LEN)
    computed_crc = zlib.crc32(memoryview(data)[: size - CRC_LEN])
    if stated_crc != computed_crc:
        raise FrameError(
            f"crc32 mismatch: frame says 0x{stated_crc:08x}, computed 0x{computed_crc:08x}"
        )
    if flags & ~FLAG_ZSTD:
        raise FrameError(f"flags 0x{flags:02x} has unknown bits set (only 0x01 is defined)")
    if not 1 <= agent_id_len <= MAX_AGENT_ID_BYTES:
        raise FrameError(f"agent_id_len {agent_id_len} not in 1..{MAX_AGENT_ID_BYTES}")
    if boot_raw == bytes(16):
        raise FrameError("boot_id is all-zero")
    if seq_end < seq_start:
        raise FrameError(f"seq_end {seq_end} < seq_start {seq_start}")
    if record_count < 1:
        raise FrameError(f"record_count {record_count} < 1")
    if record_count != seq_end - seq_start + 1:
        raise FrameError(
            f"record_count {record_count} != seq_end - seq_start + 1 = {seq_end - seq_start + 1}"
        )
    if not flags & FLAG_ZSTD and raw_len != payload_len:
        raise FrameError(
            f"payload_raw_len {raw_len} != payload_len {payload_len} "
            "(flag 0x01 is clear, so the payload is stored uncompressed)"
        )
    agent_id = agent_id_text(bytes(data[HEADER_LEN : HEADER_LEN + agent_id_len]))
    return FrameHeader(
        agent_id=agent_id,
        boot_id=uuid.UUID(bytes=bytes(boot_raw)),
        seq_start=seq_start,
        seq_end=seq_end,
        record_count=record_count,
        flags=flags,
        payload_len=payload_len,
        payload_raw_len=raw_len,
    )


def _decompress(payload: memoryview, raw_len: int) -> bytes:
    """Decompress one zstd frame to exactly `raw_len` bytes, never allocating more."""
    params = zstandard.get_frame_parameters(payload)
    if params.content_size not in (zstandard.CONTENTSIZE_UNKNOWN, raw_len):
        raise FrameError(
            f"zstd frame content size {params.content_size} != payload_raw_len {raw_len}"
        )
    decompressor = zstandard.ZstdDecompressor(max_window_size=max(_MIN_ZSTD_WINDOW, raw_len))
    raw = decompressor.decompress(payload, max_output_size=raw_len, allow_extra_data=False)
    if len(raw) != raw_len:
        raise FrameError(
            f"zstd payload decompressed to {len(raw)} bytes != payload_raw_len {raw_len}"
        )
    return raw


def _payload_table(data: bytes, header: FrameHeader, max_raw_bytes: int) -> pa.Table:
    """The payload of `data` (whose header is `header`) read as one Arrow table."""
    raw_len = header.payload_raw_len
    if raw_len > max_raw_bytes:
        raise FrameError(f"payload_raw_len {raw_len} > max_raw_bytes {max_raw_bytes}")
    if raw_len == 0:
        raise FrameError("payload_raw_len 0: an Arrow IPC stream cannot be empty")
    end = len(data) - CRC_LEN
    payload = memoryview(data)[end - header.payload_len : end]
    if header.compressed:
        with decoder_errors_as_frame_errors("payload: zstd"):
            raw = _decompress(payload, raw_len)
    else:
        # A copy, not a view: the stream starts at offset 52 + N, so a view would hand
        # Arrow misaligned buffers, and the points would pin the caller's frame bytes.
        raw = bytes(payload)
    with decoder_errors_as_frame_errors("payload: Arrow IPC stream"):
        return read_ipc_stream(raw)


@dataclass(frozen=True, slots=True)
class OpenedFrame:
    """A frame whose header and payload passed every check, points not yet decoded.

    ``decoded_bytes`` is at most what `decode` allocates for the points (a metric
    dictionary expanded per row; see `protocol._points_check.CheckedPoints`), so a
    reader can charge it to a memory account before decoding."""

    header: FrameHeader
    checked: CheckedPoints

    @property
    def decoded_bytes(self) -> int:
        return self.checked.decoded_bytes

    def decode(self) -> Frame:
        header = self.header
        with decoder_errors_as_frame_errors("payload: Arrow IPC stream"):
            points = self.checked.canonical()
        return Frame(
            agent_id=header.agent_id,
            boot_id=header.boot_id,
            seq_start=header.seq_start,
            seq_end=header.seq_end,
            record_count=header.record_count,
            flags=header.flags,
            points=points,
        )


def open_payload(data: bytes, header: FrameHeader, *, max_raw_bytes: int) -> OpenedFrame:
    """Check the payload of `data` (whose header `decode_header(data)` returned as
    `header`) by every rule of `decode_frame`, without decoding the points yet. Its memory
    is bounded as `check_payload`'s (it keeps the payload's Arrow buffers)."""
    table = _payload_table(data, header, max_raw_bytes)
    with decoder_errors_as_frame_errors("payload: Arrow IPC stream"):
        checked = checked_points(
            table, expected_rows=header.record_count, max_decoded_bytes=max_raw_bytes
        )
    return OpenedFrame(header, checked)


def decode_frame(data: bytes, *, max_raw_bytes: int = 64 * 1024 * 1024) -> Frame:
    """Fully validate `data` as one frame and return it with canonical points.

    `max_raw_bytes` caps `payload_raw_len` (the memory a payload may take once
    decompressed), checked before decompression, and the points' decoded size
    (`OpenedFrame.decoded_bytes`: dictionary decoding of `metric` may grow a table to
    `MAX_METRIC_BYTES` per row whatever the frame's size), checked before decoding. A
    reader that only needs to know the frame is valid calls `check_payload` instead.
    Raises FrameError, and nothing else, for any invalid input.
    """
    return open_payload(data, decode_header(data), max_raw_bytes=max_raw_bytes).decode()


def check_payload(data: bytes, header: FrameHeader, *, max_raw_bytes: int) -> tuple[int, int]:
    """Validate the payload of `data`, whose header `decode_header(data)` returned as
    `header`, by exactly the rules of `decode_frame` (its decoded size within
    `max_raw_bytes` included), without building the points.

    What it allocates is bounded by `payload_check_memory_bound(data, header)` (a metric
    dictionary is checked on its distinct values, never expanded per row) and its time
    grows with `payload_raw_len` and `record_count`. Raises FrameError, and nothing
    else, for any invalid payload. Returns the points' (min, max) ``ts`` in unix ns.
    """
    return open_payload(data, header, max_raw_bytes=max_raw_bytes).checked.ts_range


def frame_time_range(data: bytes, *, max_raw_bytes: int = 64 * 1024 * 1024) -> tuple[int, int]:
    """The (min, max) point time in unix ns of a frame that was checked before (a spooled
    frame, one a receiver built): reads the ``ts`` column only. Raises FrameError."""
    header = decode_header(data)
    table = _payload_table(data, header, max_raw_bytes)
    with decoder_errors_as_frame_errors("payload: Arrow IPC stream"):
        ts = table.column("ts")
        if ts.null_count or len(ts) == 0:
            raise FrameError("ts: null or empty column")
        return time_range(ts)


def payload_check_memory_bound(data: bytes, header: FrameHeader) -> int:
    """Upper bound of the bytes `check_payload(data, header)` allocates.

    Read from the header alone (and, for a compressed payload, the few bytes of the zstd
    frame header that say whether a window buffer is needed), before anything is
    decompressed. The terms: the stream itself and the per-entry work of the column
    checks, a small multiple of `payload_raw_len` since every row and label entry takes
    bytes of its own in the stream (a metric dictionary is never expanded); Arrow's
    per-message structures, at most `MAX_PAYLOAD_MESSAGES`; the zstd window of a frame
    without a content size; a fixed overhead. tests/protocol/test_frame_memory.py
    measures the adversarial shapes against it.
    """
    raw_len = header.payload_raw_len
    messages = min(MAX_PAYLOAD_MESSAGES, raw_len // _MIN_MESSAGE_BYTES + 1)
    return (
        CHECK_MEMORY_PER_RAW_BYTE * raw_len
        + CHECK_MEMORY_PER_MESSAGE * messages
        + _zstd_window_bytes(data, header)
        + CHECK_MEMORY_OVERHEAD
    )


def _zstd_window_bytes(data: bytes, header: FrameHeader) -> int:
    """The window buffer `_decompress` may allocate: none when the zstd frame states
    its content size (one-shot into the output), else at most its allowed window."""
    if not header.compressed:
        return 0
    allowed = max(_MIN_ZSTD_WINDOW, header.payload_raw_len)
    end = len(data) - CRC_LEN
    try:
        params = zstandard.get_frame_parameters(memoryview(data)[end - header.payload_len : end])
    except zstandard.ZstdError:
        return allowed  # `check_payload` refuses it; the bound still holds
    if params.content_size != zstandard.CONTENTSIZE_UNKNOWN:
        return 0
    return min(int(params.window_size), allowed)
