"""Building frames (PROTOCOL §1): `encode_frame` writes one frame carrying a points table,
checked by the same rules `protocol.frame.decode_frame` applies and in canonical form,
so its output is deterministic and always accepted; `points_table` builds such a table
from Python sequences."""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Mapping, Sequence

import pyarrow as pa
import zstandard

from protocol._frame_error import FrameError, decoder_errors_as_frame_errors
from protocol._ipc_stream import write_ipc_stream
from protocol._points_check import LABELS_TYPE, POINTS_SCHEMA, TS_TYPE, canonical_points
from protocol.frame import (
    CRC_STRUCT,
    FLAG_ZSTD,
    FRAME_MAGIC,
    FRAME_VERSION,
    HEADER_STRUCT,
    MAX_AGENT_ID_BYTES,
    U32_MAX,
    U64_MAX,
    agent_id_text,
)


def points_table(
    ts_ns: Sequence[int],
    metrics: Sequence[str],
    values: Sequence[float],
    labels: Sequence[Mapping[str, str] | None],
) -> pa.Table:
    """Build a `POINTS_SCHEMA` table from Python sequences (ts as int ns since epoch).

    Raises FrameError if lengths differ, a value can't be converted, or a row breaks
    a §1 points rule.
    """
    lengths = {len(ts_ns), len(metrics), len(values), len(labels)}
    if len(lengths) != 1:
        raise FrameError(
            f"points_table: column lengths differ (ts {len(ts_ns)}, metric {len(metrics)}, "
            f"value {len(values)}, labels {len(labels)})"
        )
    with decoder_errors_as_frame_errors("points_table"):
        table = pa.Table.from_arrays(
            [
                pa.array(ts_ns, type=pa.int64()).cast(TS_TYPE),
                pa.array(metrics, type=pa.string()),
                pa.array(values, type=pa.float64()),
                pa.array(
                    [None if row is None else list(row.items()) for row in labels],
                    type=LABELS_TYPE,
                ),
            ],
            schema=POINTS_SCHEMA,
        )
        return canonical_points(table)


def _check_encode_identity(agent_id: str, boot_id: uuid.UUID, seq_start: int) -> bytes:
    """Validate the identity inputs of encode_frame; return the agent_id bytes."""
    if not isinstance(agent_id, str):
        raise FrameError(f"agent_id must be str, not {type(agent_id).__name__}")
    try:
        agent_raw = agent_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FrameError(f"agent_id is not encodable as UTF-8 ({exc.reason})") from None
    if not 1 <= len(agent_raw) <= MAX_AGENT_ID_BYTES:
        raise FrameError(f"agent_id is {len(agent_raw)} bytes (must be 1..{MAX_AGENT_ID_BYTES})")
    agent_id_text(agent_raw)
    if not isinstance(boot_id, uuid.UUID):
        raise FrameError(f"boot_id must be uuid.UUID, not {type(boot_id).__name__}")
    if boot_id.int == 0:
        raise FrameError("boot_id is all-zero")
    if isinstance(seq_start, bool) or not isinstance(seq_start, int):
        raise FrameError(f"seq_start must be int, not {type(seq_start).__name__}")
    if not 0 <= seq_start <= U64_MAX:
        raise FrameError(f"seq_start {seq_start} not in 0..2**64-1")
    return agent_raw


def encode_frame(
    *,
    agent_id: str,
    boot_id: uuid.UUID,
    seq_start: int,
    points: pa.Table,
    compress: bool = True,
    zstd_level: int = 3,
) -> bytes:
    """Build one frame carrying `points`; seq_end = seq_start + rows - 1.

    `points` is checked by the same rules as decoding and written in canonical form
    (`POINTS_SCHEMA`: extra columns dropped, dictionaries decoded), so the output is
    deterministic for given points and always accepted by `decode_frame`. With
    `compress` the payload is one zstd frame (with content size) at `zstd_level`.
    Raises FrameError for any input that would make an invalid frame.
    """
    agent_raw = _check_encode_identity(agent_id, boot_id, seq_start)
    if not isinstance(points, pa.Table):
        raise FrameError(f"points must be a pyarrow.Table, not {type(points).__name__}")
    with decoder_errors_as_frame_errors("points"):
        canonical = canonical_points(points)
        raw = write_ipc_stream(canonical)
    rows = canonical.num_rows
    if rows > U32_MAX:
        raise FrameError(f"points has {rows} rows (record_count max {U32_MAX})")
    seq_end = seq_start + rows - 1
    if seq_end > U64_MAX:
        raise FrameError(f"seq_end {seq_start} + {rows} - 1 overflows u64")
    with decoder_errors_as_frame_errors("zstd"):
        payload = zstandard.ZstdCompressor(level=zstd_level).compress(raw) if compress else raw
    if len(raw) > U32_MAX or len(payload) > U32_MAX:
        raise FrameError(f"payload of {len(raw)} bytes does not fit payload_raw_len (u32)")
    header = HEADER_STRUCT.pack(
        FRAME_MAGIC,
        FRAME_VERSION,
        FLAG_ZSTD if compress else 0,
        len(agent_raw),
        boot_id.bytes,
        seq_start,
        seq_end,
        rows,
        len(payload),
        len(raw),
    )
    body = b"".join((header, agent_raw, payload))
    return body + CRC_STRUCT.pack(zlib.crc32(body))
