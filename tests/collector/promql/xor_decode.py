"""A reference decoder of Prometheus XOR chunks and of remote read's chunk stream,
written in the tests from Prometheus' algorithm (``tsdb/chunkenc/xor.go``: the
iterator's ``Next`` and ``readValue``; ``storage/remote/chunked.go``: the frame reader),
one bit at a time, independent of `collector.promql.xor_chunks`."""

from __future__ import annotations

import struct

import crc32c

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
    """Decoded samples per label set. ``first_only`` reads only the first series of each
    frame, as newer clients do; frames of one series are joined as Prometheus'
    own client does (a series continues while the labels repeat)."""
    out: dict[tuple[tuple[str, str], ...], list[tuple[int, int]]] = {}
    for frame in frames:
        series_list = list(frame.chunked_series)[:1] if first_only else frame.chunked_series
        for series in series_list:
            key = tuple((label.name, label.value) for label in series.labels)
            samples = out.setdefault(key, [])
            for chunk in series.chunks:
                assert chunk.type == read_pb2.Chunk.XOR
                decoded = decode_xor(chunk.data)
                assert decoded[0][0] == chunk.min_time_ms and decoded[-1][0] == chunk.max_time_ms
                samples.extend(decoded)
    return out
