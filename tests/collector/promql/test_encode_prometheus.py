"""Our remote read answers against Prometheus 2.42's own remote-read SERVER (issue 32
item 1): the same samples are loaded into a real Prometheus (Debian's package) through
its remote-write receiver, then both answers are decoded and compared per series.

The Prometheus process is one per module, on 127.0.0.1 with a temporary TSDB, stopped by
its PID. Timestamps are fixed (2020-09), never today's: a fresh TSDB's head accepts any
time for its first sample, and every later write is sent in global time order so none
falls behind the head's window (nothing out of bounds or out of order; every sample
read back from it equals the input, which proves it). Chunk frames may differ (Prometheus
splits a series over 1 MiB frames and cuts chunks by its own rule); decoded samples per
series may not, and a chunk both cut alike must be the same bytes.
"""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cramjam
import numpy as np
import pytest

from collector.promql.encode import ChunkStream, read_response, samples_query_result
from collector.promql.proto import read_pb2
from collector.promql.series_columns import LabelSet, SeriesColumns, label_order_key
from tests.collector.conftest import free_port
from tests.prometheus_binary import require_prometheus

from .xor_decode import read_frames, series_samples

T0 = 1_600_000_000_000 // 7_200_000 * 7_200_000  # a 2 h boundary: a head chunk starts there
END = T0 + 3 * 3_600_000
STALE_NAN = 0x7FF0000000000002
WRITE_BATCH_SAMPLES = 50_000
THREE_MIB = 3 << 20
Samples = list[tuple[int, int]]  # (timestamp ms, value bits)


@dataclass(frozen=True)
class Dataset:
    series: dict[LabelSet, tuple[np.ndarray, np.ndarray]]  # label set -> (ts, float64 values)

    def columns(self, name_prefix: str) -> SeriesColumns:
        """The series whose name starts with the prefix, in Prometheus' label order."""
        keys = sorted(
            (k for k in self.series if dict(k)["__name__"].startswith(name_prefix)),
            key=label_order_key,
        )
        offsets = np.zeros(len(keys) + 1, np.int64)
        np.cumsum([len(self.series[k][0]) for k in keys], out=offsets[1:])
        return SeriesColumns(
            label_sets=keys,
            offsets=offsets,
            timestamps_ms=np.concatenate([self.series[k][0] for k in keys]).astype(np.int64),
            values=np.concatenate([self.series[k][1] for k in keys]).astype(np.float64),
        )

    def samples(self, key: LabelSet) -> Samples:
        ts, values = self.series[key]
        return list(zip(ts.tolist(), values.view(np.uint64).tolist(), strict=True))


def _mixed_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """A gauge's random walk with repeats, rounding, specials and NaN payloads."""
    walk = np.round(np.cumsum(rng.standard_normal(n)), int(rng.integers(0, 4)))
    bits = walk.view(np.uint64).copy()
    special = np.array(
        [
            STALE_NAN,
            0x7FF8000000000001,
            0xFFF00000000ABCDE,
            0x8000000000000000,
            0x7FF0000000000000,
            0,
        ],
        np.uint64,
    )
    pick = rng.random(n) < 0.05
    bits[pick] = rng.choice(special, int(pick.sum()))
    repeat = np.flatnonzero(rng.random(n) < 0.2)
    bits[repeat[repeat > 0]] = bits[repeat[repeat > 0] - 1]
    return bits.view(np.float64)


def _dataset() -> Dataset:
    rng = np.random.default_rng(20200913)
    series: dict[LabelSet, tuple[np.ndarray, np.ndarray]] = {}
    for name in ("a", "b"):
        gaps = rng.integers(100, 10_000, 1000)
        gaps[rng.random(1000) < 0.02] = 100_000  # jumps: the 17- and 20-bit dod buckets
        gaps[500] = 700_000  # and the 64-bit one
        ts = T0 + 5 + np.cumsum(gaps)
        series[(("__name__", "lm_rr_two"), ("host", "h1"), ("series", name))] = (
            ts,
            _mixed_values(rng, 1000),
        )
    # 120 samples about a minute apart from a 2 h boundary: one Prometheus head chunk
    # (it cuts at the boundary, or at 240 samples, or earlier only when the first 30
    # samples span less than a quarter of the 2 h)
    one = T0 + np.concatenate([[0], np.cumsum(59_000 + rng.integers(0, 500, 119))])
    counter = np.cumsum(rng.integers(0, 5, 120)).astype(np.float64)
    counter[60:] -= counter[60]  # a reset
    stale_end = _mixed_values(rng, 120).view(np.uint64).copy()
    stale_end[-3:] = STALE_NAN
    patterns = {
        "mixed": _mixed_values(rng, 120),
        "counter": counter,
        "random_bits": rng.integers(0, 1 << 64, 120, dtype=np.uint64).view(np.float64),
        "constant": np.full(120, 42.5),
        "stale_end": stale_end.view(np.float64),
    }
    for pattern, values in patterns.items():
        series[(("__name__", "lm_rr_one_chunk"), ("pattern", pattern))] = (one, values)
    # under 30 samples (no early cut) whose deltas of deltas sit on every bucket edge
    edges = [8192, -8191, 8193, -8192, 65536, -65535, 65537, -65536]
    edges += [524288, -524287, 524289, -524288, 1_000_000, -1_000_000]
    deltas = np.cumsum([100_000, *edges])
    edge_ts = T0 + np.concatenate([[0], np.cumsum(deltas)])
    series[(("__name__", "lm_rr_one_chunk"), ("pattern", "dod_edges"))] = (
        edge_ts,
        _mixed_values(rng, len(edge_ts)),
    )
    # over 3 MiB of chunk data: random 64-bit patterns take about 10 bytes a sample
    n = 310_000
    big_ts = T0 + 1 + np.cumsum(rng.integers(5, 40, n))
    big_values = rng.integers(0, 1 << 64, n, dtype=np.uint64).view(np.float64)
    series[(("__name__", "lm_rr_big"), ("kind", "random"))] = (big_ts, big_values)
    assert max(int(ts[-1]) for ts, _ in series.values()) < END
    return Dataset(series)


# --- the Prometheus process ---------------------------------------------------------------


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, str]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read(), answer.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        return error.code, error.read(), ""


def _wait_ready(base: str, process: subprocess.Popen[bytes], log: Path) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False  # exited (a taken port, say): the caller retries on another port
        try:
            with urllib.request.urlopen(base + "/-/ready", timeout=5) as answer:
                if answer.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(random.uniform(0.05, 0.15))  # polling with a deadline, jittered
    raise AssertionError(f"prometheus never became ready: {log.read_text()[-2000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)


def _write_in_time_order(base: str, data: Dataset) -> None:
    """Remote-write every sample in global time order, in requests of a bounded size. A
    WriteRequest's ``timeseries = 1`` has the wire layout of a QueryResult's, so the
    body is `samples_query_result` of the window (what Prometheus reads back is then
    checked against the input, not against this encoding)."""
    columns = data.columns("lm_rr_")
    all_ts = np.sort(columns.timestamps_ms)
    bounds = [*all_ts[::WRITE_BATCH_SAMPLES].tolist(), int(all_ts[-1]) + 1]
    for lo, hi in itertools.pairwise(bounds):
        offsets, ts_parts, value_parts = [0], [], []
        for i in range(len(columns.label_sets)):
            ts = columns.timestamps_ms[columns.offsets[i] : columns.offsets[i + 1]]
            values = columns.values[columns.offsets[i] : columns.offsets[i + 1]]
            a, b = np.searchsorted(ts, [lo, hi])
            ts_parts.append(ts[a:b])
            value_parts.append(values[a:b])
            offsets.append(offsets[-1] + int(b - a))
        window = SeriesColumns(
            label_sets=columns.label_sets,
            offsets=np.array(offsets, np.int64),
            timestamps_ms=np.concatenate(ts_parts),
            values=np.concatenate(value_parts),
        )
        body = bytes(cramjam.snappy.compress_raw(samples_query_result(window)))
        status, answer, _ = _post(
            base + "/api/v1/write",
            body,
            {
                "Content-Type": "application/x-protobuf",
                "Content-Encoding": "snappy",
                "X-Prometheus-Remote-Write-Version": "0.1.0",
            },
        )
        assert status in (200, 204), (status, answer[:500])


@dataclass(frozen=True)
class Reference:
    base: str
    data: Dataset


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reference]:
    binary = require_prometheus()
    root = tmp_path_factory.mktemp("prometheus-reference")
    (root / "prometheus.yml").write_text("global: {}\n")
    log = root / "prometheus.log"
    for _attempt in range(3):
        port = free_port()
        with log.open("ab") as out:
            process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={root / 'prometheus.yml'}",
                    f"--storage.tsdb.path={root / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--web.enable-remote-write-receiver",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=root,
            )
        base = f"http://127.0.0.1:{port}"
        if _wait_ready(base, process, log):
            break
        _stop(process)
    else:
        raise AssertionError(f"prometheus did not start: {log.read_text()[-2000:]}")
    try:
        data = _dataset()
        _write_in_time_order(base, data)
        yield Reference(base=base, data=data)
    finally:
        _stop(process)


def _read(
    base: str, queries: list[read_pb2.Query], response_type: read_pb2.ReadRequest.ResponseType
) -> tuple[bytes, str]:
    request = read_pb2.ReadRequest(queries=queries, accepted_response_types=[response_type])
    status, body, content_type = _post(
        base + "/api/v1/read",
        bytes(cramjam.snappy.compress_raw(request.SerializeToString())),
        {
            "Content-Type": "application/x-protobuf",
            "Content-Encoding": "snappy",
            "X-Prometheus-Remote-Read-Version": "0.1.0",
        },
    )
    assert status == 200, (status, body[:500])
    return body, content_type


def _query(name_regex: str) -> read_pb2.Query:
    return read_pb2.Query(
        start_timestamp_ms=T0,
        end_timestamp_ms=END,
        matchers=[
            read_pb2.LabelMatcher(type=read_pb2.LabelMatcher.RE, name="__name__", value=name_regex)
        ],
    )


def _prometheus_stream(ref: Reference, name_regex: str) -> list[read_pb2.ChunkedReadResponse]:
    body, content_type = _read(
        ref.base, [_query(name_regex)], read_pb2.ReadRequest.STREAMED_XOR_CHUNKS
    )
    assert content_type.startswith("application/x-streamed-protobuf")
    return read_frames(body)


def _ours(ref: Reference, prefix: str) -> tuple[ChunkStream, list[read_pb2.ChunkedReadResponse]]:
    stream = ChunkStream.of(ref.data.columns(prefix))
    return stream, read_frames(b"".join(stream.frames(0, 16 << 20)))


@dataclass(frozen=True)
class OurStream:
    stream: ChunkStream
    frames: list[read_pb2.ChunkedReadResponse]
    decoded: dict[LabelSet, Samples]  # read as newer clients do: the first series a frame


@pytest.fixture(scope="module")
def our_stream(reference: Reference) -> OurStream:
    """Our answer to ``__name__=~"lm_rr_.*"``, decoded once for the module."""
    stream, frames = _ours(reference, "lm_rr_")
    return OurStream(stream, frames, series_samples(frames, first_only=True))


# --- the comparisons ----------------------------------------------------------------------


def test_two_series_decode_alike(reference: Reference) -> None:
    theirs = series_samples(_prometheus_stream(reference, "lm_rr_two"))
    stream, frames = _ours(reference, "lm_rr_two")
    ours = series_samples(frames, first_only=True)
    assert len(frames) == 2 and list(ours) == list(theirs)  # same series, same order
    for key in theirs:
        assert len(theirs[key]) == 1000
        assert ours[key] == theirs[key] == reference.data.samples(key)
    assert len(stream.chunks.min_time_ms) == 2 * 9  # 1000 samples: 9 chunks of <= 120 each


def test_chunks_cut_alike_are_the_same_bytes(reference: Reference) -> None:
    their_frames = _prometheus_stream(reference, "lm_rr_one_chunk")
    stream, frames = _ours(reference, "lm_rr_one_chunk")
    assert len(their_frames) == len(frames) == 6
    for i, (theirs, ours) in enumerate(zip(their_frames, frames, strict=True)):
        assert theirs.chunked_series[0].labels == ours.chunked_series[0].labels
        (their_chunk,) = theirs.chunked_series[0].chunks
        assert stream.chunks.series_chunks[i + 1] - stream.chunks.series_chunks[i] == 1
        assert ours.chunked_series[0].chunks[0] == their_chunk  # times, type and bytes


def test_a_series_over_3_mib_is_one_frame_of_ours_and_decodes_alike(
    reference: Reference, our_stream: OurStream
) -> None:
    their_frames = _prometheus_stream(reference, "lm_rr_big")
    assert len(their_frames) >= 4  # Prometheus splits it over 1 MiB frames
    _, (frame,) = _ours(reference, "lm_rr_big")
    (key,) = [tuple((label.name, label.value) for label in frame.chunked_series[0].labels)]
    assert sum(len(c.data) for c in frame.chunked_series[0].chunks) > THREE_MIB
    index = our_stream.stream.columns.label_sets.index(key)
    assert frame == our_stream.frames[index]  # the same frame as in the whole answer
    theirs = series_samples(their_frames)
    assert list(theirs) == [key] and len(theirs[key]) == 310_000
    assert our_stream.decoded[key] == theirs[key] == reference.data.samples(key)


def test_every_series_comes_out_whole_reading_only_the_first_series_of_each_frame(
    reference: Reference, our_stream: OurStream
) -> None:
    frames = our_stream.frames
    assert [len(f.chunked_series) for f in frames] == [1] * 9
    keys = [
        tuple((label.name, label.value) for label in f.chunked_series[0].labels) for f in frames
    ]
    assert keys == sorted(keys, key=label_order_key) and len(set(keys)) == 9
    assert list(our_stream.decoded) == keys
    for key in keys:
        assert our_stream.decoded[key] == reference.data.samples(key)


def _response(body: bytes) -> read_pb2.ReadResponse:
    return read_pb2.ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(body)))


def _decoded(result: read_pb2.QueryResult) -> list[tuple[LabelSet, Samples]]:
    series = []
    for ts in result.timeseries:
        key = tuple((label.name, label.value) for label in ts.labels)
        stamps = [s.timestamp for s in ts.samples]
        bits = np.array([s.value for s in ts.samples], np.float64).view(np.uint64).tolist()
        series.append((key, list(zip(stamps, bits, strict=True))))
    return series


def test_samples_answers_are_the_same(reference: Reference) -> None:
    queries = [_query("lm_rr_two|lm_rr_one_chunk"), _query("lm_rr_big")]
    body, content_type = _read(reference.base, queries, read_pb2.ReadRequest.SAMPLES)
    assert content_type == "application/x-protobuf"
    theirs = _response(body)
    columns = [reference.data.columns("lm_rr_one_chunk"), reference.data.columns("lm_rr_two")]
    first = SeriesColumns(
        label_sets=[*columns[0].label_sets, *columns[1].label_sets],
        offsets=np.concatenate(
            [columns[0].offsets, columns[1].offsets[1:] + columns[0].offsets[-1]]
        ),
        timestamps_ms=np.concatenate([c.timestamps_ms for c in columns]),
        values=np.concatenate([c.values for c in columns]),
    )
    big = samples_query_result(reference.data.columns("lm_rr_big"))
    ours = _response(read_response([samples_query_result(first), big]))
    assert [len(r.timeseries) for r in theirs.results] == [8, 1]
    # the small series, sample by sample: Prometheus' SAMPLES encoder (gogo protobuf)
    # leaves a double out when it == 0, so its answers turn a stored -0.0 into 0.0 (its
    # chunks keep it); ours keep the bits
    negative_zero = 0x8000000000000000
    ours_small = _decoded(ours.results[0])
    as_prometheus_sends = [
        (key, [(t, 0 if v == negative_zero else v) for t, v in samples])
        for key, samples in ours_small
    ]
    assert as_prometheus_sends == _decoded(theirs.results[0])
    assert sum(v == negative_zero for _, samples in ours_small for _, v in samples) > 10
    for key, samples in ours_small:
        assert samples == reference.data.samples(key)
    # the 310,000 random samples (no zero field in them), as bytes: both answers
    # re-serialized alike, and equal to ours as sent (which decodes to the input: the
    # round-trip tests)
    assert theirs.results[1].SerializeToString() == ours.results[1].SerializeToString() == big
