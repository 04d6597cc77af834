"""Remote read answers (PROTOCOL §5), encoded column-wise from `SeriesColumns`.

What the endpoint (`POST /api/v1/read`) calls, per response type:

- ``SAMPLES``: `samples_result` per query, then `read_response` over the queries
  in request order (snappy block format, ``Content-Type: application/x-protobuf``,
  ``Content-Encoding: snappy``). Reserve `samples_answer_bytes` first.
- ``STREAMED_XOR_CHUNKS``: `ChunkStream.of` per query; refuse the read with 400 when
  `ChunkStream.largest_frame_bytes` exceeds ``query.max_read_frame_bytes`` (before the
  first frame is sent); then send `ChunkStream.frames` (``Content-Type:
  application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse``, no content
  encoding). `chunked_frames`, `frame_sizes` and `largest_frame_bytes` take either a
  `SeriesColumns` or a `ChunkStream` (pass the stream to encode once).

The protobuf bytes are written by hand, column-wise (numpy): no Python object per
sample. Every field is written, zero-valued ones included (proto3's canonical form
leaves those out; a reader, Prometheus' or `collector.promql.proto.read_pb2`, gets the
same values either way). Values are the stored float64 bit for bit (staleness markers
and NaN payloads survive); timestamps are int64 (a negative one is a 10-byte varint).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import cramjam
import crc32c
import numpy as np
import numpy.typing as npt

from .pbwire import (
    delimited_size,
    flatten_rows,
    labels_bytes,
    varint,
    varint_lengths,
    varint_matrix,
    varint_size,
)
from .series_columns import SeriesColumns
from .xor_chunks import XorChunks, encode_xor_chunks

SAMPLES_CONTENT_TYPE = "application/x-protobuf"
STREAM_CONTENT_TYPE = "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse"
SAMPLES_BYTES_PER_SAMPLE = 18
"""A ``Sample`` on the wire: tag, length, the double's 9 bytes, the timestamp's tag and
its varint (6 bytes for a millisecond time of this century): 18 bytes."""
_SAMPLE_FIXED = 12  # 0x12, length, 0x09 + 8 bytes, 0x10
_BLOCK_SAMPLES = 1 << 20


def samples_answer_bytes(sample_count: int, series_count: int = 0) -> int:
    """The reservation for a ``SAMPLES`` answer of this many samples (uncompressed: the
    answer is built whole before snappy): 18 bytes a sample, plus 256 a series for its
    header and labels."""
    return SAMPLES_BYTES_PER_SAMPLE * sample_count + 256 * series_count


@dataclass(frozen=True, slots=True)
class SamplesResult:
    """One query's serialized ``prometheus.QueryResult``, not built yet: each series'
    header (tag, length, labels) made, its samples written block by block as `pieces`
    are read (a block of `_BLOCK_SAMPLES` rows at a time: the whole answer is never held
    uncompressed; `read_response` compresses each piece as it comes)."""

    columns: SeriesColumns
    heads: list[tuple[int, bytes]]
    """(series index, header) of each series with samples, in order."""
    nbytes: int

    def pieces(self) -> Iterator[bytes | memoryview]:
        offsets = self.columns.offsets
        block: memoryview = memoryview(b"")
        at: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]] = _no_offsets
        b0 = b1 = 0
        for i, head in self.heads:
            yield head
            s, e = int(offsets[i]), int(offsets[i + 1])
            while s < e:
                if s >= b1:  # the next block of rows, across series
                    b0, b1 = s, min(len(self.columns.values), s + _BLOCK_SAMPLES)
                    block, at = _samples_bytes(
                        self.columns.timestamps_ms[b0:b1], self.columns.values[b0:b1]
                    )
                take = min(e, b1)
                low, high = at(np.array([s - b0, take - b0], np.int64)).tolist()
                yield block[low:high]
                s = take


def _no_offsets(index: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return np.zeros(len(index), np.int64)


def samples_result(columns: SeriesColumns) -> SamplesResult:
    """The ``prometheus.QueryResult`` of one query: one ``TimeSeries`` per series of
    ``columns`` in their order (a series without samples is left out, as Prometheus
    leaves it out), its labels in their order, its samples in time order."""
    sizes = _series_sample_bytes(columns)
    heads: list[tuple[int, bytes]] = []
    total = 0
    for i, label_set in enumerate(columns.label_sets):
        size = int(sizes[i])
        if size == 0:
            continue  # a series without samples is not sent
        labels = labels_bytes(label_set)
        head = b"\x0a" + varint(len(labels) + size) + labels
        heads.append((i, head))
        total += len(head) + size
    return SamplesResult(columns, heads, total)


def _series_sample_bytes(columns: SeriesColumns) -> npt.NDArray[np.int64]:
    """Each series' ``Sample`` fields' bytes: 12 + the timestamp's varint a sample."""
    ts, offsets = columns.timestamps_ms, columns.offsets
    counts = np.diff(offsets)
    if len(ts) == 0:
        return counts
    low, high = int(ts.min()), int(ts.max())
    if low >= 0 and varint_size(low) == varint_size(high):  # one width: the common case
        return counts * (_SAMPLE_FIXED + varint_size(low))
    lengths = varint_lengths(np.ascontiguousarray(ts).view(np.uint64)) + _SAMPLE_FIXED
    at = np.zeros(len(ts) + 1, np.int64)
    np.cumsum(lengths, out=at[1:])
    return at[offsets[1:]] - at[offsets[:-1]]


def samples_query_result(columns: SeriesColumns) -> bytes:
    """`samples_result` joined: the serialized ``QueryResult``."""
    return b"".join(samples_result(columns).pieces())


def read_response(query_results: Sequence[bytes | SamplesResult]) -> bytes:
    """The snappy-compressed (block format) ``prometheus.ReadResponse`` holding the
    given query results in request order (`snappy_pieces`: never joined uncompressed)."""
    total = sum(
        delimited_size(r.nbytes if isinstance(r, SamplesResult) else len(r)) for r in query_results
    )

    def pieces() -> Iterator[bytes | memoryview]:
        for result in query_results:
            if isinstance(result, SamplesResult):
                yield b"\x0a" + varint(result.nbytes)
                yield from result.pieces()
            else:
                yield b"\x0a" + varint(len(result))
                yield result

    return snappy_pieces(pieces(), total)


SNAPPY_STAGE_BYTES = 4 << 20


def snappy_pieces(pieces: Iterable[bytes | memoryview], total: int) -> bytes:
    """Snappy's block format of the pieces joined, without joining them: the pieces are
    compressed a few MiB at a time and the compressed element streams concatenated
    under one length preamble. Valid snappy: an element stream decodes the same after
    any earlier output (a copy reaches back only into its own stream's output).
    ``total``: the pieces' length, known before they are made."""
    out: list[bytes | memoryview] = [varint(total)]
    stage = bytearray()

    def compress(data: bytes | bytearray | memoryview) -> None:
        block = memoryview(cramjam.snappy.compress_raw(data))
        skip = 1
        while block[skip - 1] & 0x80:  # the block's own length preamble, a varint
            skip += 1
        out.append(block[skip:])

    seen = 0
    for piece in pieces:
        seen += len(piece)
        if len(piece) >= SNAPPY_STAGE_BYTES:
            if stage:
                compress(stage)
                stage = bytearray()
            compress(piece)
            continue
        stage += piece
        if len(stage) >= SNAPPY_STAGE_BYTES:
            compress(stage)
            stage = bytearray()
    if stage:
        compress(stage)
    if seen != total:
        raise AssertionError(f"snappy preamble says {total} bytes, the pieces are {seen}")
    return b"".join(out)


def _samples_bytes(
    timestamps_ms: npt.NDArray[np.int64], values: npt.NDArray[np.float64]
) -> tuple[memoryview, Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]]]:
    """Every ``Sample`` field (``samples = 2`` of a TimeSeries) back to back, and a
    function from sample indexes to their byte offsets (the total for ``n``). When every
    timestamp's varint has one length (non-negative times within a factor of 128 of
    each other: any millisecond time of this century is 6 bytes) each sample takes the
    same bytes and the samples are one (n, 12 + length) matrix, written a column at a
    time; else per-sample lengths, in blocks of a bounded size."""
    n = len(values)
    if n == 0:
        return memoryview(b""), lambda index: np.zeros(len(index), np.int64)
    low, high = int(timestamps_ms.min()), int(timestamps_ms.max())
    width = varint_size(low)
    if low < 0 or varint_size(high) != width:
        return _samples_bytes_varied(timestamps_ms, values)
    row = _SAMPLE_FIXED + width
    matrix = np.empty((n, row), np.uint8)
    matrix[:, 0] = 0x12
    matrix[:, 1] = 10 + width  # the Sample message: 9 + 1 + varint
    matrix[:, 2] = 0x09
    matrix[:, 11] = 0x10
    for b0 in range(0, n, _BLOCK_SAMPLES):  # bounded temporaries
        b1 = min(n, b0 + _BLOCK_SAMPLES)
        block = matrix[b0:b1]
        block[:, 3:11] = (
            np.ascontiguousarray(values[b0:b1], "<f8").view(np.uint8).reshape(b1 - b0, 8)
        )
        ts = timestamps_ms[b0:b1]
        for k in range(width):  # one column per 7-bit group, all but the last continued
            group = (ts >> (7 * k)).astype(np.uint8) & np.uint8(0x7F)
            block[:, _SAMPLE_FIXED + k] = group | np.uint8(0x80) if k < width - 1 else group
    return matrix.reshape(-1).data, lambda index: np.asarray(index, np.int64) * row


def _samples_bytes_varied(
    timestamps_ms: npt.NDArray[np.int64], values: npt.NDArray[np.float64]
) -> tuple[memoryview, Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]]]:
    """`_samples_bytes` for timestamps whose varints differ in length."""
    n = len(values)
    blocks: list[bytes] = []
    at = np.zeros(n + 1, np.int64)
    for b0 in range(0, n, _BLOCK_SAMPLES):
        b1 = min(n, b0 + _BLOCK_SAMPLES)
        ts_rows, ts_len = varint_matrix(np.ascontiguousarray(timestamps_ms[b0:b1]).view(np.uint64))
        rows = b1 - b0
        matrix = np.zeros((rows, _SAMPLE_FIXED + ts_rows.shape[1]), np.uint8)
        matrix[:, 0] = 0x12
        matrix[:, 1] = 10 + ts_len  # the Sample message: 9 + 1 + varint
        matrix[:, 2] = 0x09
        matrix[:, 3:11] = (
            np.ascontiguousarray(values[b0:b1]).astype("<f8").view(np.uint8).reshape(rows, 8)
        )
        matrix[:, 11] = 0x10
        matrix[:, 12:] = ts_rows
        lengths = _SAMPLE_FIXED + ts_len
        blocks.append(flatten_rows(matrix, lengths))
        np.cumsum(lengths, out=at[b0 + 1 : b1 + 1])
        at[b0 + 1 : b1 + 1] += at[b0]
    return memoryview(b"".join(blocks)), lambda index: at[np.asarray(index, np.int64)]


@dataclass(frozen=True, slots=True)
class ChunkStream:
    """The ``STREAMED_XOR_CHUNKS`` answer of one query, encoded once: XOR chunks of at
    most 120 samples per series (`collector.promql.xor_chunks`) and each series' frame
    size, known before any frame is sent."""

    columns: SeriesColumns
    chunks: XorChunks
    label_bytes: tuple[bytes, ...]
    frame_sizes: npt.NDArray[np.int64]
    """Bytes of each series' whole frame (length prefix, CRC and message) for
    ``query_index`` 0 (0 for a series without samples: it has no frame); a larger index
    adds at most 9 bytes (`QUERY_INDEX_SLACK`)."""

    @classmethod
    def of(cls, columns: SeriesColumns) -> ChunkStream:
        chunks = encode_xor_chunks(columns.offsets, columns.timestamps_ms, columns.values)
        label_bytes = tuple(labels_bytes(label_set) for label_set in columns.label_sets)
        records = chunks.series_records_bytes()
        sizes = np.zeros(len(label_bytes), np.int64)
        for i, labels in enumerate(label_bytes):
            if chunks.series_chunks[i] == chunks.series_chunks[i + 1]:
                continue  # no samples: no frame (size 0)
            message = delimited_size(len(labels) + int(records[i])) + 2  # + query_index 0
            sizes[i] = varint_size(message) + 4 + message
        return cls(columns=columns, chunks=chunks, label_bytes=label_bytes, frame_sizes=sizes)

    @property
    def largest_frame_bytes(self) -> int:
        """The largest frame this stream sends for any query index (0 if it sends none)."""
        largest = int(self.frame_sizes.max(initial=0))
        return largest + QUERY_INDEX_SLACK if largest else 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the encoded chunks (what a reservation covers beside a frame)."""
        return int(self.chunks.records.nbytes)

    def frames(self, query_index: int, max_frame_bytes: int) -> Iterator[bytes]:
        """One frame per series with samples, in the columns' order: ``uvarint(len(message))``, the
        big-endian CRC32-Castagnoli of the message, then the message, a
        ``ChunkedReadResponse`` holding exactly one ``ChunkedSeries`` with all of the
        series' chunks and ``query_index``. Raises `FrameTooLarge` before yielding
        anything if a frame would exceed ``max_frame_bytes``."""
        if self.largest_frame_bytes > max_frame_bytes:
            check_frames(self, max_frame_bytes)
        return self._frames(query_index)

    def _frames(self, query_index: int) -> Iterator[bytes]:
        tail = b"\x10" + varint(query_index)
        for i, labels in enumerate(self.label_bytes):
            if not self.frame_sizes[i]:
                continue  # a series without samples is not sent
            records = self.chunks.series_records(i)
            parts = (b"\x0a", varint(len(labels) + len(records)), labels, records, tail)
            checksum = 0
            for part in parts:  # the CRC over the parts: the frame is joined once
                checksum = crc32c.crc32c(part, checksum)
            size = sum(len(part) for part in parts)
            yield b"".join((varint(size), checksum.to_bytes(4, "big"), *parts))


QUERY_INDEX_SLACK = 9
"""A query index's varint beyond the 1 byte `ChunkStream.frame_sizes` counts."""


class FrameTooLarge(ValueError):
    """A series' frame exceeds the frame limit: the read is refused (400) before the
    first frame. Names the series and both sizes."""

    def __init__(self, label_set: object, frame_bytes: int, max_frame_bytes: int) -> None:
        super().__init__(
            f"series {label_set} needs a {frame_bytes}-byte remote read frame, over "
            f"query.max_read_frame_bytes ({max_frame_bytes}); narrow the query's time range"
        )
        self.frame_bytes = frame_bytes
        self.max_frame_bytes = max_frame_bytes


def check_frames(stream: ChunkStream, max_frame_bytes: int) -> None:
    """Raise `FrameTooLarge` for the first series whose frame could exceed the limit."""
    sizes = stream.frame_sizes
    over = np.flatnonzero((sizes > 0) & (sizes + QUERY_INDEX_SLACK > max_frame_bytes))
    if len(over):
        i = int(over[0])
        raise FrameTooLarge(
            dict(stream.columns.label_sets[i]),
            int(stream.frame_sizes[i]) + QUERY_INDEX_SLACK,
            max_frame_bytes,
        )


def _stream(source: SeriesColumns | ChunkStream) -> ChunkStream:
    return source if isinstance(source, ChunkStream) else ChunkStream.of(source)


def chunked_frames(
    source: SeriesColumns | ChunkStream, query_index: int, max_frame_bytes: int
) -> Iterator[bytes]:
    """The frames of one query's ``STREAMED_XOR_CHUNKS`` answer (`ChunkStream.frames`);
    raises `FrameTooLarge` at the call, before any frame, when one would be too big."""
    return _stream(source).frames(query_index, max_frame_bytes)


def frame_sizes(source: SeriesColumns | ChunkStream) -> npt.NDArray[np.int64]:
    """Each series' frame size in bytes (`ChunkStream.frame_sizes`)."""
    return _stream(source).frame_sizes


def largest_frame_bytes(source: SeriesColumns | ChunkStream) -> int:
    """The largest frame of the answer, for any query index: compare it with
    ``query.max_read_frame_bytes`` before sending anything (PROTOCOL §5)."""
    return _stream(source).largest_frame_bytes
