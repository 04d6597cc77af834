"""collector.promql.encode and xor_chunks: what Prometheus' decoder and ours read back.

SAMPLES answers are parsed with `collector.promql.proto.read_pb2`; XOR chunks are decoded
by the tests' own decoder written from Prometheus' xor.go (`xor_decode`). Values are
compared as bits (NaN payloads, the staleness marker and -0.0 must survive)."""

from __future__ import annotations

import cramjam
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.promql.encode import (
    QUERY_INDEX_SLACK,
    SAMPLES_BYTES_PER_SAMPLE,
    ChunkStream,
    FrameTooLarge,
    chunked_frames,
    frame_sizes,
    largest_frame_bytes,
    read_response,
    samples_answer_bytes,
    samples_query_result,
)
from collector.promql.proto import read_pb2
from collector.promql.series_columns import SeriesColumns
from collector.promql.xor_chunks import SAMPLES_PER_CHUNK, encode_xor_chunks

from .xor_decode import decode_xor, decode_xor_many, read_frames, series_samples

STALE_NAN = 0x7FF0000000000002
SPECIAL_BITS = [
    STALE_NAN,
    0x7FF8000000000001,  # Prometheus' normal NaN
    0xFFF0000000000123,  # a negative NaN with a payload
    0x8000000000000000,  # -0.0
    0x0000000000000000,
    0x7FF0000000000000,  # inf
    0xFFF0000000000000,  # -inf
    0x0000000000000001,  # smallest subnormal
    0x3FF0000000000000,  # 1.0
]

# delta-of-delta bucket edges: 14, 17 and 20 bits hold [-(2^(n-1) - 1), 2^(n-1)]
DOD_EDGES = sorted(
    {e + d for n in (14, 17, 20) for e in (1 << (n - 1), -((1 << (n - 1)) - 1)) for d in (-1, 0, 1)}
)


def _columns(series: list[tuple[list[int], list[int]]]) -> SeriesColumns:
    offsets = np.zeros(len(series) + 1, np.int64)
    np.cumsum([len(ts) for ts, _ in series], out=offsets[1:])
    ts = np.array([t for s, _ in series for t in s], np.int64)
    bits = np.array([b for _, v in series for b in v], np.uint64)
    return SeriesColumns(
        label_sets=[(("__name__", f"m{i}"), ("job", "x" * (i % 3))) for i in range(len(series))],
        offsets=offsets,
        timestamps_ms=ts,
        values=bits.view(np.float64),
    )


@st.composite
def _series(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """One series: hypothesis picks the shape (length, start, which kinds of steps and
    values are mixed in, a seed); numpy makes the samples (fast, so examples are many)."""
    n = draw(st.integers(0, 250))
    start = draw(st.integers(-(1 << 50), 1 << 50))
    step_kinds = draw(st.sets(st.sampled_from(["tiny", "regular", "huge"]), min_size=1))
    value_kinds = draw(
        st.sets(st.sampled_from(["special", "bits", "decimal", "repeat"]), min_size=1)
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    steps = {
        "tiny": rng.integers(1, 31, n),
        "regular": rng.choice([15_000, 15_001, 14_999], n),
        "huge": rng.integers(1, 1 << 40, n),
    }
    kind = rng.choice(sorted(step_kinds), n)
    deltas = np.select([kind == k for k in steps], list(steps.values()), 1)
    ts = start + np.cumsum(deltas)
    values = {
        "special": rng.choice(np.array(SPECIAL_BITS, np.uint64), n),
        "bits": rng.integers(0, 1 << 64, n, dtype=np.uint64),
        "decimal": np.round(rng.uniform(-1e6, 1e6, n), 1).view(np.uint64),
    }
    which = rng.choice(sorted(value_kinds), n)
    bits = np.zeros(n, np.uint64)
    for k, column in values.items():
        bits = np.where(which == k, column, bits)
    for i in np.flatnonzero(which == "repeat"):  # the value before (one in a few)
        bits[i] = bits[i - 1] if i else bits[i]
    return [int(t) for t in ts], [int(b) for b in bits]


def _bits(values: np.ndarray) -> list[int]:
    return [int(b) for b in np.asarray(values, np.float64).view(np.uint64)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_series(), max_size=5))
def test_samples_query_result_round_trips(series: list[tuple[list[int], list[int]]]) -> None:
    columns = _columns(series)
    result = read_pb2.QueryResult.FromString(bytes(samples_query_result(columns)))
    sent = [(label_set, s) for label_set, s in zip(columns.label_sets, series, strict=True) if s[0]]
    assert len(result.timeseries) == len(sent)  # a series without samples is not sent
    for got, (label_set, (ts, values)) in zip(result.timeseries, sent, strict=True):
        assert [(label.name, label.value) for label in got.labels] == list(label_set)
        assert [s.timestamp for s in got.samples] == ts
        assert _bits(np.array([s.value for s in got.samples], np.float64)) == values


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_series(), max_size=5))
def test_xor_chunks_decode_to_the_input(series: list[tuple[list[int], list[int]]]) -> None:
    columns = _columns(series)
    chunks = encode_xor_chunks(columns.offsets, columns.timestamps_ms, columns.values)
    for i, (ts, values) in enumerate(series):
        decoded: list[tuple[int, int]] = []
        previous_max = None
        for c in range(int(chunks.series_chunks[i]), int(chunks.series_chunks[i + 1])):
            samples = decode_xor(chunks.chunk_data(c))
            assert 1 <= len(samples) <= SAMPLES_PER_CHUNK
            assert (
                samples[0][0] == chunks.min_time_ms[c] and samples[-1][0] == chunks.max_time_ms[c]
            )
            assert previous_max is None or previous_max < samples[0][0]
            previous_max = samples[-1][0]
            decoded += samples
        assert decoded == list(zip(ts, values, strict=True))


def test_delta_of_delta_bucket_edges_and_extremes() -> None:
    # every bucket edge and its neighbours, both signs, then 64-bit dods and negative times
    base = 1 << 22  # deltas stay positive: base + dod, then back to base (dod = -dod)
    deltas = [base]
    for dod in DOD_EDGES:
        deltas += [base + dod, base]
    steady = [base] * 3
    jumps = [1, 1 << 61, 1, 3, (1 << 40) + 7, 2]
    ts = np.cumsum([-(1 << 62), *deltas, *steady, *jumps]).tolist()
    edge_series = (ts, [SPECIAL_BITS[i % len(SPECIAL_BITS)] for i in range(len(ts))])
    columns = _columns([edge_series, ([-5, -4, -2, 0, 7], [STALE_NAN] * 5)])
    chunks = encode_xor_chunks(columns.offsets, columns.timestamps_ms, columns.values)
    decoded = [decode_xor(chunks.chunk_data(c)) for c in range(chunks.chunk_count)]
    assert [s for chunk in decoded[:-1] for s in chunk] == list(zip(*edge_series, strict=True))
    assert decoded[-1] == [(t, STALE_NAN) for t in (-5, -4, -2, 0, 7)]


def test_read_response_holds_each_query_in_order() -> None:
    a = _columns([([1, 2, 3], [STALE_NAN, 0x8000000000000000, 7])])
    b = SeriesColumns.empty()
    c = _columns([([-10], [1]), ([5, 6], [2, 3])])
    body = read_response(
        [samples_query_result(a), samples_query_result(b), samples_query_result(c)]
    )
    response = read_pb2.ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(body)))
    assert [len(r.timeseries) for r in response.results] == [1, 0, 2]
    assert [s.timestamp for s in response.results[2].timeseries[1].samples] == [5, 6]
    assert _bits(np.array([s.value for s in response.results[0].timeseries[0].samples])) == [
        STALE_NAN,
        0x8000000000000000,
        7,
    ]


def test_samples_size_estimate_covers_todays_timestamps() -> None:
    n = 10_000
    ts = 1_700_000_000_000 + np.arange(n, dtype=np.int64) * 15_000
    columns = SeriesColumns(
        label_sets=[(("__name__", "up"),)],
        offsets=np.array([0, n], np.int64),
        timestamps_ms=ts,
        values=np.random.default_rng(0).standard_normal(n),
    )
    size = len(samples_query_result(columns))
    assert n * SAMPLES_BYTES_PER_SAMPLE <= size <= samples_answer_bytes(n, 1)


def test_frames_one_series_each_with_exact_sizes_and_checksums() -> None:
    rng = np.random.default_rng(7)
    series = []
    for n in (1, 119, 120, 121, 1000):
        ts = np.cumsum(rng.integers(1, 20_000, n)).tolist()
        series.append((ts, [int(b) for b in rng.integers(0, 1 << 63, n, dtype=np.uint64)]))
    columns = _columns(series)
    stream = ChunkStream.of(columns)
    frames = list(stream.frames(300, stream.largest_frame_bytes))
    assert [len(f) for f in frames] == [
        int(s) + 1 for s in stream.frame_sizes
    ]  # index 300: 2-byte varint
    messages = read_frames(b"".join(frames))
    assert [len(m.chunked_series) for m in messages] == [1] * 5
    assert {m.query_index for m in messages} == {300}
    decoded = series_samples(messages, first_only=True)
    assert list(decoded) == [tuple(ls) for ls in columns.label_sets]
    assert list(decoded.values()) == [list(zip(*s, strict=True)) for s in series]
    # query index 0 is what frame_sizes counts exactly
    assert [len(f) for f in chunked_frames(stream, 0, 1 << 24)] == frame_sizes(stream).tolist()


def test_a_frame_over_the_limit_is_refused_before_the_first_frame() -> None:
    rng = np.random.default_rng(3)
    small = (list(range(1, 11)), [1] * 10)
    big = (list(range(1, 5001)), [int(b) for b in rng.integers(0, 1 << 63, 5000, dtype=np.uint64)])
    columns = _columns([small, big])
    largest = largest_frame_bytes(columns)
    assert largest == int(frame_sizes(columns).max()) + QUERY_INDEX_SLACK
    assert largest > 5000 * 8  # random values: about 10 bytes a sample
    with pytest.raises(FrameTooLarge) as refused:
        chunked_frames(columns, 0, largest - 1)  # raises at the call: nothing was sent
    assert "m1" in str(refused.value) and refused.value.max_frame_bytes == largest - 1
    assert len(list(chunked_frames(columns, 0, largest))) == 2


def test_empty_answers() -> None:
    empty = SeriesColumns.empty()
    assert samples_query_result(empty) == b""
    assert list(chunked_frames(empty, 0, 100)) == []
    assert largest_frame_bytes(empty) == 0


def test_a_series_without_samples_is_not_sent() -> None:
    columns = _columns([([1, 2], [3, 4]), ([], []), ([5], [STALE_NAN])])
    result = read_pb2.QueryResult.FromString(bytes(samples_query_result(columns)))
    assert [ts.labels[0].value for ts in result.timeseries] == ["m0", "m2"]
    stream = ChunkStream.of(columns)
    assert stream.frame_sizes[1] == 0
    frames = read_frames(b"".join(stream.frames(0, stream.largest_frame_bytes)))
    assert [f.chunked_series[0].labels[0].value for f in frames] == ["m0", "m2"]
    only_empty = _columns([([], [])])
    assert largest_frame_bytes(only_empty) == 0 and list(chunked_frames(only_empty, 0, 1)) == []


def test_chunks_refuse_timestamps_that_do_not_increase() -> None:
    with pytest.raises(ValueError, match="strictly increase"):
        ChunkStream.of(_columns([([1, 2], [0, 0]), ([5, 5], [1, 2])]))
    ChunkStream.of(_columns([([1, 9], [0, 0]), ([], []), ([5, 6], [1, 2])]))  # across series: fine


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_series(), min_size=20, max_size=30))
def test_the_vectorised_decoder_reads_as_the_plain_one(
    series: list[tuple[list[int], list[int]]],
) -> None:
    """decode_xor_many, which reads the large streams, against decode_xor, chunk by chunk."""
    columns = _columns(series)
    chunks = encode_xor_chunks(columns.offsets, columns.timestamps_ms, columns.values)
    datas = [chunks.chunk_data(c) for c in range(chunks.chunk_count)]
    many = decode_xor_many(datas)
    assert len(many) == len(datas)
    for data, (ts, bits) in zip(datas, many, strict=True):
        assert list(zip(ts.tolist(), bits.tolist(), strict=True)) == decode_xor(data)


@pytest.mark.parametrize("start", [1_790_000_000_000, 0, (1 << 35) - 5])
def test_samples_of_one_varint_width_are_written_as_those_of_many(
    start: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This century's ms times share one varint width (the matrix path); 0.. and a
    # start just below 2**35 mix widths (per-sample lengths): both read back the same,
    # and the matrix path writes exactly what the per-sample one would.
    from collector.promql import encode
    from collector.promql.encode import _samples_bytes, _samples_bytes_varied

    ts = start + np.arange(0, 30_000, 15, dtype=np.int64)
    values = np.linspace(-1.0, 1.0, len(ts))
    columns = SeriesColumns(
        label_sets=[(("__name__", "a"),), (("__name__", "b"),)],
        offsets=np.array([0, 700, len(ts)], np.int64),
        timestamps_ms=ts,
        values=values,
    )
    whole = samples_query_result(columns)  # one block
    result = read_pb2.QueryResult.FromString(whole)
    assert [s.timestamp for t in result.timeseries for s in t.samples] == ts.tolist()
    assert _bits(np.array([s.value for t in result.timeseries for s in t.samples])) == _bits(values)
    # Blocks of rows across series: the same bytes in any block size.
    monkeypatch.setattr(encode, "_BLOCK_SAMPLES", 333)
    assert samples_query_result(columns) == whole
    fast, fast_at = _samples_bytes(ts, values)
    slow, slow_at = _samples_bytes_varied(ts, values)
    index = np.array([0, 700, len(ts)], np.int64)
    assert bytes(fast) == bytes(slow) and fast_at(index).tolist() == slow_at(index).tolist()


def test_snappy_of_pieces_is_snappy_of_the_joined_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    from collector.promql import encode

    monkeypatch.setattr(encode, "SNAPPY_STAGE_BYTES", 1000)  # many blocks, some pieces over
    rng = np.random.default_rng(3)
    pieces: list[bytes | memoryview] = [
        bytes(rng.integers(0, 4, int(n), dtype=np.uint8)) for n in rng.integers(0, 2500, 40)
    ]
    pieces.append(memoryview(b"x" * 5000)[7:])
    joined = b"".join(pieces)
    stitched = encode.snappy_pieces(pieces, len(joined))
    assert bytes(cramjam.snappy.decompress_raw(stitched)) == joined
    assert len(stitched) < len(joined)  # still compressed
    assert bytes(cramjam.snappy.decompress_raw(encode.snappy_pieces([], 0))) == b""
