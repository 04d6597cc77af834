"""Protobuf wire pieces for the remote-read encoders (`collector.promql.encode`).

Varints column-wise over numpy arrays (one row per value, never a Python object per
value), and the few scalar pieces the encoders write once per series or per chunk.
The wire format: a varint is the value's 7-bit groups, least significant first, every
byte but the last with its high bit set; an ``int64`` field is its two's complement as
``uint64`` (a negative number takes 10 bytes); a length-delimited field is its tag, a
varint length and the bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
MAX_VARINT_BYTES = 10

_SHIFTS = np.arange(MAX_VARINT_BYTES, dtype=np.uint64) * np.uint64(7)
# varint length by the value's bit length 0..64 (0 -> 1 byte)
_LEN_BY_BITS = np.maximum(1, (np.arange(65) + 6) // 7).astype(np.int64)


def bit_length(values: U64) -> npt.NDArray[np.int64]:
    """Bit length of each uint64 (0 for 0), exact over the whole range."""
    smeared = values.copy()
    for shift in (1, 2, 4, 8, 16, 32):
        smeared |= smeared >> np.uint64(shift)
    return np.bitwise_count(smeared).astype(np.int64)


def varint_lengths(values: U64) -> npt.NDArray[np.int64]:
    """Bytes each uint64 takes as a varint (1..10)."""
    return _LEN_BY_BITS[bit_length(values)]


def varint_matrix(values: U64) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Each value's varint bytes as a row of a (n, width) matrix, width the longest
    varint's length (bytes past a row's length are zero: the value has no more bits),
    with the lengths."""
    lengths = varint_lengths(values)
    width = int(lengths.max(initial=1))
    rows = np.empty((len(values), width), np.uint8)
    for k in range(width):  # one column per 7-bit group
        rows[:, k] = (values >> _SHIFTS[k]) & np.uint64(0x7F)
    more = np.arange(width)[None, :] < (lengths - 1)[:, None]
    rows |= more.view(np.uint8) << 7
    return rows, lengths


def varints(values: U64) -> bytes:
    """The varints of ``values``, concatenated."""
    rows, lengths = varint_matrix(values)
    return flatten_rows(rows, lengths)


def varint(value: int) -> bytes:
    """One varint; a negative int64 as its two's complement (10 bytes)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint_size(value: int) -> int:
    value &= (1 << 64) - 1
    return max(1, (value.bit_length() + 6) // 7)


def delimited(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (``tag`` is the whole tag byte, e.g. 0x0A)."""
    return bytes((tag,)) + varint(len(payload)) + payload


def delimited_size(payload_len: int) -> int:
    return 1 + varint_size(payload_len) + payload_len


def labels_bytes(label_set: Sequence[tuple[str, str]]) -> bytes:
    """The repeated ``Label labels = 1`` field of a TimeSeries or ChunkedSeries: every
    label, both strings always written (a reader gets the same values as from proto3's
    canonical form, which leaves empty strings out)."""
    parts = []
    for name, value in label_set:
        label = delimited(0x0A, name.encode()) + delimited(0x12, value.encode())
        parts.append(delimited(0x0A, label))
    return b"".join(parts)


def concat_rows(
    pieces: Sequence[tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Row-wise concatenation of variable-length byte rows: each piece is a (n, width)
    matrix and the used length of each row; the result holds each row's pieces back to
    back (zero past its length) and the total lengths."""
    rows = len(pieces[0][1])
    width = sum(matrix.shape[1] for matrix, _ in pieces)
    out = np.zeros((rows, width), np.uint8)
    start = np.zeros(rows, np.int64)
    for matrix, lengths in pieces:
        cols = np.arange(matrix.shape[1])[None, :]
        used = cols < lengths[:, None]
        r, c = np.nonzero(used)
        out[r, start[r] + c] = matrix[r, c]
        start = start + lengths
    return out, start


def fixed_row(rows: int, *byte_values: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """The same bytes in every row, as a `concat_rows` piece."""
    matrix = np.tile(np.array(byte_values, np.uint8), (rows, 1))
    return matrix, np.full(rows, len(byte_values), np.int64)


def flatten_rows(matrix: npt.NDArray[np.uint8], lengths: npt.NDArray[np.int64]) -> bytes:
    """The rows' used bytes, back to back."""
    if len(lengths) and int(lengths.min()) == matrix.shape[1]:
        return matrix.tobytes()  # every row full: no mask (the common case)
    return matrix[np.arange(matrix.shape[1])[None, :] < lengths[:, None]].tobytes()
