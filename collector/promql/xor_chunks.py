"""XOR (Gorilla) chunks of Prometheus' TSDB (``tsdb/chunkenc/xor.go``), encoded
column-wise for remote read's ``STREAMED_XOR_CHUNKS`` answer (PROTOCOL §5).

A chunk's bytes: the sample count as 2 bytes big-endian, then a bit stream (most
significant bit first): the first timestamp as a zig-zag varint and the first value as
64 raw bits; the second timestamp as a uvarint delta; every later timestamp as the
delta of deltas ``dod``: ``0`` for 0, else ``10``, ``110``, ``1110`` + ``dod`` in 14, 17,
20 bits when it is in ``[-(2^(n-1) - 1), 2^(n-1)]``, else ``1111`` + 64 bits. Every value
after the first is XORed with the one before: ``0`` if equal; else ``1`` then either
``0`` + the XOR's meaningful bits inside the previous window (when its leading and
trailing zero counts are at least the window's), or ``1`` + 5 bits of leading zeros
(at most 31) + 6 bits of meaningful bit count (64 written as 0) + the meaningful bits,
which becomes the window. The last byte is zero-padded, followed by one empty byte where
Prometheus' bit stream writes one (after a whole-byte write ending on a byte boundary), so
a chunk holding the same samples as one of Prometheus' is the same bytes.

Series are cut into chunks of at most `SAMPLES_PER_CHUNK` consecutive samples (what
Prometheus' head aims for), so chunks are in time order, never overlap and their
min/max times are exact.

How it is vectorised: every sample contributes four bit fields (value, length) computed
for all samples at once; the only sequential state, the XOR window, is a scan over the
position inside a chunk (at most 120 steps, each over all chunks at once). The fields are
packed by their cumulative bit offsets with shift-and-add into big-endian 64-bit words
(the fields' bits are disjoint, so adding is or-ing). Work is done in batches of whole
chunks of at most `BATCH_SAMPLES` samples, which bounds the scratch memory.

Each chunk comes out as the whole ``Chunk`` field of a ``ChunkedSeries`` (tag, length,
``min_time_ms``, ``max_time_ms``, ``type = XOR``, ``data``), so a series' chunks are one
contiguous slice of `XorChunks.records`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .pbwire import MAX_VARINT_BYTES, bit_length, concat_rows, fixed_row, varint_matrix

SAMPLES_PER_CHUNK = 120
BATCH_SAMPLES = 1 << 18
CHUNK_ENCODING_XOR = 1

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
_U = np.uint64


@dataclass(frozen=True, slots=True)
class XorChunks:
    """The chunks of every series of one query, column-wise.

    Series ``i`` owns chunks ``series_chunks[i]:series_chunks[i + 1]``; chunk ``c`` is the
    serialized ``Chunk`` field ``records[record_offsets[c]:record_offsets[c + 1]]``,
    whose XOR data (count header included) is ``records[data_offsets[c]:record_offsets[c + 1]]``.
    """

    series_chunks: I64
    min_time_ms: I64
    max_time_ms: I64
    sample_counts: I64
    record_offsets: I64
    data_offsets: I64
    records: npt.NDArray[np.uint8]

    @property
    def chunk_count(self) -> int:
        return len(self.min_time_ms)

    def chunk_data(self, chunk: int) -> bytes:
        """One chunk's XOR bytes (for tests and diagnostics)."""
        return self.records[self.data_offsets[chunk] : self.record_offsets[chunk + 1]].tobytes()

    def series_records(self, series: int) -> memoryview:
        """The ``Chunk`` fields of one series, back to back (a view, not a copy)."""
        start = self.record_offsets[self.series_chunks[series]]
        end = self.record_offsets[self.series_chunks[series + 1]]
        return self.records[start:end].data

    def series_records_bytes(self) -> I64:
        """Bytes of each series' ``Chunk`` fields."""
        return np.diff(self.record_offsets[self.series_chunks])


def chunk_starts(offsets: I64) -> tuple[I64, I64]:
    """Where chunks start: (sample index of each chunk's first sample, with the sample
    count appended; chunk index of each series' first chunk, with the chunk count
    appended). A series of n samples has ceil(n / 120) chunks."""
    lengths = np.diff(offsets)
    per_series = -(-lengths // SAMPLES_PER_CHUNK)
    series_chunks = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(per_series, out=series_chunks[1:])
    total = int(series_chunks[-1])
    owner = np.repeat(np.arange(len(lengths)), per_series)
    k = np.arange(total) - series_chunks[owner]
    starts = np.empty(total + 1, np.int64)
    starts[:total] = offsets[:-1][owner] + k * SAMPLES_PER_CHUNK
    starts[total] = offsets[-1] if len(offsets) else 0
    return starts, series_chunks


def encode_xor_chunks(
    offsets: I64, timestamps_ms: I64, values: npt.NDArray[np.float64]
) -> XorChunks:
    """All chunks of the series ``offsets`` delimits (as in `SeriesColumns`); timestamps
    must strictly increase within each series."""
    offsets = np.asarray(offsets, np.int64)
    starts, series_chunks = chunk_starts(offsets)
    bits = np.ascontiguousarray(values, np.float64).view(np.uint64)
    ts = np.ascontiguousarray(timestamps_ms, np.int64)
    within = np.ones(len(ts), np.bool_)  # sample i follows sample i - 1 in its series
    within[offsets[:-1][offsets[:-1] < len(ts)]] = False
    if len(ts) and bool((ts[1:] <= ts[:-1])[within[1:]].any()):
        raise ValueError("timestamps must strictly increase within a series")
    n_chunks = len(starts) - 1
    records: list[npt.NDArray[np.uint8]] = []
    record_sizes = np.zeros(n_chunks, np.int64)
    data_at = np.zeros(n_chunks, np.int64)
    c0 = 0
    while c0 < n_chunks:
        # whole chunks up to BATCH_SAMPLES samples (at least one chunk)
        c1 = int(np.searchsorted(starts, starts[c0] + BATCH_SAMPLES, side="right")) - 1
        c1 = min(max(c1, c0 + 1), n_chunks)
        s0, s1 = int(starts[c0]), int(starts[c1])
        buf, sizes, data_in_record = _encode_batch(ts[s0:s1], bits[s0:s1], starts[c0 : c1 + 1] - s0)
        records.append(buf)
        record_sizes[c0:c1] = sizes
        data_at[c0:c1] = data_in_record
        c0 = c1
    record_offsets = np.zeros(n_chunks + 1, np.int64)
    np.cumsum(record_sizes, out=record_offsets[1:])
    sample_counts = np.diff(starts)
    return XorChunks(
        series_chunks=series_chunks,
        min_time_ms=ts[starts[:-1]] if n_chunks else np.zeros(0, np.int64),
        max_time_ms=ts[starts[1:] - 1] if n_chunks else np.zeros(0, np.int64),
        sample_counts=sample_counts,
        record_offsets=record_offsets,
        data_offsets=record_offsets[:-1] + data_at,
        records=np.concatenate(records) if records else np.zeros(0, np.uint8),
    )


def _encode_batch(ts: I64, bits: U64, starts: I64) -> tuple[npt.NDArray[np.uint8], I64, I64]:
    """Chunk records of one batch: (the records back to back, each record's size, where
    its XOR data starts inside it)."""
    m = len(ts)
    lengths = np.diff(starts)
    n_chunks = len(lengths)
    chunk = np.repeat(np.arange(n_chunks), lengths)
    pos = np.arange(m) - starts[chunk]
    val = np.empty((m, 4), np.uint64)
    nbits = np.empty((m, 4), np.int64)

    # timestamps: zig-zag varint of the first, uvarint delta of the second, dod after
    delta = np.zeros(m, np.int64)
    delta[1:] = ts[1:] - ts[:-1]
    dod = np.zeros(m, np.int64)
    dod[1:] = delta[1:] - delta[:-1]
    _dod_fields(dod, pos >= 2, val, nbits)
    head_rows = np.flatnonzero(pos < 2)
    head_ts = ts[head_rows]
    zigzag = (head_ts.view(np.uint64) << _U(1)) ^ (head_ts >> np.int64(63)).view(np.uint64)
    head = np.where(pos[head_rows] == 0, zigzag, delta[head_rows].view(np.uint64))
    _varint_fields(head, val, nbits, head_rows)

    # values: raw 64 bits first, then XOR with the previous value of the chunk
    xor = np.zeros(m, np.uint64)
    xor[1:] = bits[1:] ^ bits[:-1]
    _value_fields(xor, bits, chunk, pos, n_chunks, int(lengths.max(initial=0)), val, nbits)

    # chunk sizes, then each record's header (Chunk field tag and length, the times, type)
    field_bits = nbits.reshape(-1)
    chunk_bits = np.add.reduceat(field_bits, starts[:-1] * 4) if m else np.zeros(0, np.int64)
    # Prometheus' bstream leaves one empty byte after a whole-byte write (writeByte always
    # appends the byte its remainder goes to): a chunk whose last field is a multiple of 8
    # bits long ending on a byte boundary has it too, so a chunk cut alike is the same bytes
    last = starts[1:] - 1
    last_field = np.where(nbits[last, 3] > 0, nbits[last, 3], nbits[last, 2])
    empty_byte = (chunk_bits % 8 == 0) & (last_field % 8 == 0)
    data_len = 2 + (chunk_bits + 7) // 8 + empty_byte
    min_rows, min_len = varint_matrix(ts[starts[:-1]].view(np.uint64))
    max_rows, max_len = varint_matrix(ts[starts[1:] - 1].view(np.uint64))
    dlen_rows, dlen_len = varint_matrix(data_len.astype(np.uint64))
    msg_len = 1 + min_len + 1 + max_len + 2 + 1 + dlen_len + data_len
    mlen_rows, mlen_len = varint_matrix(msg_len.astype(np.uint64))
    header, header_len = concat_rows(
        [
            fixed_row(n_chunks, 0x12),
            (mlen_rows, mlen_len),
            fixed_row(n_chunks, 0x08),
            (min_rows, min_len),
            fixed_row(n_chunks, 0x10),
            (max_rows, max_len),
            fixed_row(n_chunks, 0x18, CHUNK_ENCODING_XOR, 0x22),
            (dlen_rows, dlen_len),
        ]
    )
    record_size = header_len + data_len
    record_at = np.zeros(n_chunks, np.int64)
    np.cumsum(record_size[:-1], out=record_at[1:])
    total = int(record_size.sum())
    data_at = record_at + header_len

    # bit offsets: the chunk's data start + 16 (count header) + bits before the field
    position = np.cumsum(field_bits) - field_bits
    chunk_base = data_at * 8 + 16 - position[starts[:-1] * 4]
    position += np.repeat(chunk_base, lengths * 4)
    out = _pack(val.reshape(-1), field_bits, position, total)

    cols = np.arange(header.shape[1])[None, :]
    r, c = np.nonzero(cols < header_len[:, None])
    out[record_at[r] + c] = header[r, c]
    out[data_at] = (lengths >> 8).astype(np.uint8)
    out[data_at + 1] = (lengths & 0xFF).astype(np.uint8)
    return out, record_size, header_len


def _varint_fields(values: U64, val: U64, nbits: I64, rows: I64) -> None:
    """Fields 0 and 1 of ``rows``: the varint's first (up to) 8 bytes, then the rest."""
    matrix, lengths = varint_matrix(values)
    m64 = np.zeros((len(values), MAX_VARINT_BYTES), np.uint64)
    m64[:, : matrix.shape[1]] = matrix
    first_n = np.minimum(lengths, 8)
    hi = np.zeros(len(values), np.uint64)
    for k in range(8):
        hi = (hi << _U(8)) | m64[:, k]
    val[rows, 0] = hi >> (_U(64) - (first_n * 8).astype(np.uint64))
    nbits[rows, 0] = first_n * 8
    rest_n = np.maximum(lengths - 8, 0)
    lo = (m64[:, 8] << _U(8)) | m64[:, 9]
    val[rows, 1] = lo >> (_U(16) - (rest_n * 8).astype(np.uint64))
    nbits[rows, 1] = rest_n * 8


# by bucket (0: dod == 0; 1, 2, 3: it fits 14, 17, 20 bits; 4: 64 bits)
_DOD_PREFIX = np.array([0, 0b10, 0b110, 0b1110, 0b1111], np.uint64)
_DOD_PREFIX_BITS = np.array([1, 2, 3, 4, 4], np.int64)
_DOD_BODY_BITS = np.array([0, 14, 17, 20, 64], np.int64)
_DOD_BODY_MASK = np.array(
    [0, (1 << 14) - 1, (1 << 17) - 1, (1 << 20) - 1, (1 << 64) - 1], np.uint64
)


def _dod_fields(dod: I64, later: npt.NDArray[np.bool_], val: U64, nbits: I64) -> None:
    """Fields 0 (bucket prefix) and 1 (the dod's bits) of the third sample on; zero
    elsewhere. A dod fits n bits when it is in [-(2^(n-1) - 1), 2^(n-1)]."""
    bucket = (dod != 0).astype(np.int64)
    for width in (14, 17, 20):
        shifted = (dod + ((1 << (width - 1)) - 1)).view(np.uint64)  # wraps: never fits
        bucket += shifted > _U((1 << width) - 1)
    bucket *= later
    val[:, 0] = _DOD_PREFIX[bucket]
    nbits[:, 0] = _DOD_PREFIX_BITS[bucket] * later
    val[:, 1] = dod.view(np.uint64) & _DOD_BODY_MASK[bucket]
    nbits[:, 1] = _DOD_BODY_BITS[bucket]


def _value_fields(
    xor: U64,
    bits: U64,
    chunk: I64,
    pos: I64,
    n_chunks: int,
    width: int,
    val: U64,
    nbits: I64,
) -> None:
    """Fields 2 and 3: a chunk's first value as 64 raw bits; after it, the XOR's control
    bits and its meaningful bits."""
    first = pos == 0
    changed = (xor != 0) & ~first
    lead = np.minimum(64 - bit_length(xor), 31)
    lowest = xor & (~xor + _U(1))
    trail = np.bitwise_count(lowest - _U(1)).astype(np.int64)  # 64 for xor == 0, unused
    # the window scan: by position inside the chunk (rows), over all chunks at once
    cell = pos * n_chunks + chunk
    grid_lead = np.zeros((width, n_chunks), np.int64)
    grid_trail = np.zeros((width, n_chunks), np.int64)
    grid_changed = np.zeros((width, n_chunks), np.bool_)
    grid_lead.reshape(-1)[cell] = lead  # views of the grids: rows are positions
    grid_trail.reshape(-1)[cell] = trail
    grid_changed.reshape(-1)[cell] = changed
    win_lead = np.zeros((width, n_chunks), np.int64)
    win_trail = np.zeros((width, n_chunks), np.int64)
    grid_new = np.zeros((width, n_chunks), np.bool_)
    cur_lead = np.zeros(n_chunks, np.int64)
    cur_trail = np.zeros(n_chunks, np.int64)
    has = np.zeros(n_chunks, np.bool_)
    for j in range(1, width):
        lj, tj, cj = grid_lead[j], grid_trail[j], grid_changed[j]
        new = cj & ~(has & (lj >= cur_lead) & (tj >= cur_trail))
        np.copyto(cur_lead, lj, where=new)
        np.copyto(cur_trail, tj, where=new)
        has |= new
        win_lead[j] = cur_lead
        win_trail[j] = cur_trail
        grid_new[j] = new
    w_lead = win_lead.reshape(-1)[cell]
    w_trail = win_trail.reshape(-1)[cell]
    new_window = grid_new.reshape(-1)[cell]
    sig = 64 - w_lead - w_trail
    control = np.where(
        new_window,
        (_U(0b11) << _U(11)) | (w_lead.astype(np.uint64) << _U(6)) | (sig & 63).astype(np.uint64),
        _U(0b10),
    )
    control_len = np.where(new_window, 13, 2)
    val[:, 2] = np.where(first, bits, np.where(changed, control, _U(0)))
    nbits[:, 2] = np.where(first, 64, np.where(changed, control_len, 1))
    val[:, 3] = np.where(changed, xor >> (w_trail & 63).astype(np.uint64), _U(0))
    nbits[:, 3] = np.where(changed, sig, 0)


def _pack(val: U64, nbits: I64, position: I64, total_bytes: int) -> npt.NDArray[np.uint8]:
    """Write each field's low ``nbits`` bits (0 to 64; a field of 0 bits must hold 0) at
    its bit ``position`` (MSB first, non-decreasing) into a zeroed buffer of
    ``total_bytes``."""
    words = np.zeros(total_bytes // 8 + 2, np.uint64)
    if len(val):
        # the field's bits at the top of a word (a 0-bit field is 0 whatever the shift)
        aligned = val << ((64 - nbits) & 63).astype(np.uint64)
        word = position >> 6
        offset = position & 63
        main = aligned >> offset.astype(np.uint64)
        group = np.concatenate(([0], np.flatnonzero(word[1:] != word[:-1]) + 1))
        words[word[group]] = np.add.reduceat(main, group)  # disjoint bits: sum is or
        spill = np.flatnonzero(offset + nbits > 64)
        words[word[spill] + 1] |= aligned[spill] << (64 - offset[spill]).astype(np.uint64)
    return words.astype(">u8").view(np.uint8)[:total_bytes].copy()
