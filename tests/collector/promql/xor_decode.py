"""A reference decoder of Prometheus XOR chunks and of remote read's chunk stream,
written in the tests from Prometheus' algorithm (``tsdb/chunkenc/xor.go``: the
iterator's ``Next`` and ``readValue``; ``storage/remote/chunked.go``: the frame reader),
one bit at a time, independent of `collector.promql.xor_chunks`."""

from __future__ import annotations

import struct

import crc32c
import numpy as np

from collector.promql.proto import read_pb2

_DOD_SIZES = {0b0: 0, 0b10: 14, 0b110: 17, 0b1110: 20, 0b1111: 64}
_M64 = (1 << 64) - 1


def _signed(u: int) -> int:
    u &= _M64
    return u - (1 << 64) if u >> 63 else u


def decode_xor(data: bytes) -> list[tuple[int, int]]:
    """(timestamp ms, value bits) of every sample of one XOR chunk, read as Prometheus'
    xorIterator reads it (one loop; each read takes a 9-byte window at its bit offset)."""
    count = int.from_bytes(data[:2], "big")
    body = data[2:] + bytes(9)  # a read near the end takes a 9-byte window
    size = (len(data) - 2) * 8
    pos = 0

    def read(n: int) -> int:
        nonlocal pos
        at = pos
        pos += n
        if pos > size:
            raise ValueError("chunk ends inside a field")
        window = int.from_bytes(body[at >> 3 : (at >> 3) + 9], "big")
        return (window >> (72 - (at & 7) - n)) & ((1 << n) - 1)

    def uvarint() -> int:
        out = shift = 0
        while True:
            byte = read(8)
            out |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return out

    def read_tail(n: int, at: int) -> int:
        window = int.from_bytes(body[at >> 3 : (at >> 3) + 9], "big")
        return (window >> (72 - (at & 7) - n)) & ((1 << n) - 1)

    out: list[tuple[int, int]] = []
    t = tdelta = vbits = leading = trailing = 0
    for n in range(count):
        if n == 0:
            zz = uvarint()
            t = (zz >> 1) ^ -(zz & 1)
            vbits = read(64)
            out.append((t, vbits))
            continue
        if n == 1:
            tdelta = uvarint()
        else:
            d = 0
            for _ in range(4):
                d <<= 1
                if read(1) == 0:
                    break
                d |= 1
            width = _DOD_SIZES[d]
            dod = 0
            if width == 64:
                dod = _signed(read(64))
            elif width:
                raw = read(width)
                if raw > (1 << (width - 1)):
                    raw -= 1 << width
                dod = raw
            tdelta = (tdelta + dod) & _M64
        t = _signed(t + tdelta)
        if read(1) == 1:
            if read(1) == 1:
                leading = read(5)
                mbits = read(6) or 64
                trailing = 64 - leading - mbits
            vbits ^= read(64 - leading - trailing) << trailing
        out.append((t, vbits))
    # Prometheus' bstream ends a chunk with the partial byte, or, when its last write was
    # a whole byte (writeByte), with one more empty byte: never more, never a set bit
    if size - pos > 8 or (size > pos and read_tail(size - pos, pos)):
        raise ValueError(f"{size - pos} bits after the last of {count} samples")
    return out


def read_frames(body: bytes) -> list[read_pb2.ChunkedReadResponse]:
    """Every frame of a STREAMED_XOR_CHUNKS body, CRCs checked."""
    out = []
    at = 0
    while at < len(body):
        size = shift = 0
        while True:
            byte = body[at]
            at += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        (crc,) = struct.unpack(">I", body[at : at + 4])
        message = body[at + 4 : at + 4 + size]
        if len(message) != size:
            raise ValueError("frame cut short")
        if crc32c.crc32c(message) != crc:
            raise ValueError("frame CRC mismatch")
        out.append(read_pb2.ChunkedReadResponse.FromString(message))
        at += 4 + size
    return out


def series_samples(
    frames: list[read_pb2.ChunkedReadResponse], *, first_only: bool = False
) -> dict[tuple[tuple[str, str], ...], list[tuple[int, int]]]:
    """Decoded samples per label set (`decode_xor_many`). ``first_only`` reads only the
    first series of each frame, as newer clients do; frames of one series are joined as
    Prometheus' own client does (a series continues while the labels repeat)."""
    keys: list[tuple[tuple[str, str], ...]] = []
    chunks: list[read_pb2.Chunk] = []
    for frame in frames:
        series_list = list(frame.chunked_series)[:1] if first_only else frame.chunked_series
        for series in series_list:
            key = tuple((label.name, label.value) for label in series.labels)
            for chunk in series.chunks:
                assert chunk.type == read_pb2.Chunk.XOR
                keys.append(key)
                chunks.append(chunk)
    out: dict[tuple[tuple[str, str], ...], list[tuple[int, int]]] = {}
    decoded = decode_xor_many([chunk.data for chunk in chunks])
    for key, chunk, (ts, bits) in zip(keys, chunks, decoded, strict=True):
        assert ts[0] == chunk.min_time_ms and ts[-1] == chunk.max_time_ms
        out.setdefault(key, []).extend(zip(ts.tolist(), bits.tolist(), strict=True))
    return out


def decode_xor_many(chunks: list[bytes]) -> list[tuple[np.ndarray, np.ndarray]]:
    """`decode_xor` for many chunks at once, vectorised across chunks (sample j of every
    chunk is read in one step), for the large series: (timestamps, value bits) each.
    The same reading rules as `decode_xor`, which the tests hold it to."""
    counts = np.array([int.from_bytes(c[:2], "big") for c in chunks], np.int64)
    bodies = [c[2:] for c in chunks]
    starts = np.zeros(len(chunks), np.int64)
    np.cumsum([len(b) for b in bodies[:-1]], out=starts[1:])
    ends = (starts + np.array([len(b) for b in bodies], np.int64)) * 8
    buf = np.frombuffer(b"".join(bodies) + bytes(16), np.uint8)
    windows = np.lib.stride_tricks.sliding_window_view(buf, 9)
    pos = starts * 8
    width = int(counts.max(initial=0))
    ts = np.zeros((len(chunks), width), np.int64)
    vs = np.zeros((len(chunks), width), np.uint64)
    u = np.uint64

    def read(n: np.ndarray, active: np.ndarray) -> np.ndarray:
        nonlocal pos
        n = np.where(active, n, 0).astype(np.int64)
        w = windows[pos >> 3]
        hi = np.ascontiguousarray(w[:, :8]).view(">u8")[:, 0].astype(np.uint64)
        shift = (pos & 7).astype(np.uint64)
        top = (hi << shift) | (w[:, 8].astype(np.uint64) >> (u(8) - shift))
        value = np.where(n > 0, top >> ((64 - n) & 63).astype(np.uint64), u(0))
        pos = pos + n
        if (pos > ends).any():
            raise ValueError("chunk ends inside a field")
        return value

    def uvarint(active: np.ndarray) -> np.ndarray:
        out = np.zeros(len(chunks), np.uint64)
        going = active.copy()
        for k in range(10):
            byte = read(np.full(len(chunks), 8), going)
            out |= (byte & u(0x7F)) << u(7 * k)
            going &= byte >= 0x80
        return out

    t = np.zeros(len(chunks), np.int64)
    tdelta = np.zeros(len(chunks), np.uint64)
    v = np.zeros(len(chunks), np.uint64)
    leading = np.zeros(len(chunks), np.int64)
    trailing = np.zeros(len(chunks), np.int64)
    ones = np.ones(len(chunks), np.int64)
    for j in range(width):
        active = counts > j
        if j == 0:
            zz = uvarint(active)
            t = ((zz >> u(1)) ^ (u(0) - (zz & u(1)))).view(np.int64)
            v = read(np.full(len(chunks), 64), active)
        else:
            if j == 1:
                tdelta = uvarint(active)
            else:
                d = np.zeros(len(chunks), np.int64)
                going = active.copy()
                for _ in range(4):
                    bit = read(ones, going).astype(np.int64)
                    d = np.where(going, (d << 1) | bit, d)
                    going &= bit == 1
                size = np.select(
                    [d == 0b10, d == 0b110, d == 0b1110, d == 0b1111], [14, 17, 20, 64], 0
                )
                raw = read(size, active).view(np.int64)
                half = np.left_shift(1, size - 1, where=size > 0, out=np.zeros_like(size))
                wrapped = np.where((size > 0) & (size < 64) & (raw > half), raw - (half << 1), raw)
                tdelta = tdelta + np.where(active, wrapped, 0).view(np.uint64)
            t = np.where(active, (t.view(np.uint64) + tdelta).view(np.int64), t)
            changed = read(ones, active) == 1
            fresh = changed & (read(ones, changed) == 1)
            new_leading = read(np.full(len(chunks), 5), fresh).astype(np.int64)
            mbits = read(np.full(len(chunks), 6), fresh).astype(np.int64)
            mbits = np.where(mbits == 0, 64, mbits)
            leading = np.where(fresh, new_leading, leading)
            trailing = np.where(fresh, 64 - new_leading - mbits, trailing)
            sig = read(64 - leading - trailing, changed)
            v = np.where(changed, v ^ (sig << (trailing & 63).astype(np.uint64)), v)
        ts[:, j] = t
        vs[:, j] = v
    return [(ts[c, : counts[c]], vs[c, : counts[c]]) for c in range(len(chunks))]
