"""A reference decoder of Prometheus XOR chunks and of remote read's chunk stream,
written in the tests from Prometheus' algorithm (``tsdb/chunkenc/xor.go``: the
iterator's ``Next`` and ``readValue``; ``storage/remote/chunked.go``: the frame reader),
one bit at a time, independent of `collector.promql.xor_chunks`."""

from __future__ import annotations

import struct

import crc32c

from collector.promql.proto import read_pb2


class _Bits:
    def __init__(self, data: bytes) -> None:
        self.value = int.from_bytes(data, "big")
        self.size = len(data) * 8
        self.pos = 0

    def read(self, n: int) -> int:
        if self.pos + n > self.size:
            raise ValueError("chunk ends inside a field")
        self.pos += n
        return (self.value >> (self.size - self.pos)) & ((1 << n) - 1)

    def uvarint(self) -> int:
        out = shift = 0
        while True:
            byte = self.read(8)
            out |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return out


def _signed(u: int) -> int:
    u &= (1 << 64) - 1
    return u - (1 << 64) if u >> 63 else u


def decode_xor(data: bytes) -> list[tuple[int, int]]:
    """(timestamp ms, value bits) of every sample of one XOR chunk."""
    count = int.from_bytes(data[:2], "big")
    bits = _Bits(data[2:])
    out: list[tuple[int, int]] = []
    t = tdelta = vbits = leading = trailing = 0
    for n in range(count):
        if n == 0:
            zz = bits.uvarint()
            t = (zz >> 1) ^ -(zz & 1)
            vbits = bits.read(64)
            out.append((t, vbits))
            continue
        if n == 1:
            tdelta = bits.uvarint()
        else:
            d = 0
            for _ in range(4):
                d <<= 1
                if bits.read(1) == 0:
                    break
                d |= 1
            size = {0b0: 0, 0b10: 14, 0b110: 17, 0b1110: 20, 0b1111: 64}[d]
            dod = 0
            if size == 64:
                dod = _signed(bits.read(64))
            elif size:
                raw = bits.read(size)
                if raw > (1 << (size - 1)):
                    raw -= 1 << size
                dod = raw
            tdelta = (tdelta + dod) & ((1 << 64) - 1)
        t = _signed(t + tdelta)
        if bits.read(1) == 1:
            if bits.read(1) == 1:
                leading = bits.read(5)
                mbits = bits.read(6) or 64
                trailing = 64 - leading - mbits
            mbits = 64 - leading - trailing
            vbits ^= bits.read(mbits) << trailing
        out.append((t, vbits))
    if bits.size - bits.pos >= 8:
        raise ValueError("chunk has whole bytes after its last sample")
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
