"""Batch frame codec: golden vectors built from PROTOCOL §1 alone, and one invalid
vector per rule with the FrameError message it must produce."""

from __future__ import annotations

import dataclasses
import math
import struct
import uuid
import zlib
from collections.abc import Callable

import pyarrow as pa
import pytest
import zstandard

from protocol import frame as fr
from protocol import frame_encode as fe
from tests.protocol import frame_vectors as v

# -- helpers ------------------------------------------------------------------------


def ts_ints(points: pa.Table) -> list[int]:
    return list(points.column("ts").cast(pa.int64()).to_pylist())


def labels_of(points: pa.Table) -> list[dict[str, str] | None]:
    return [None if row is None else dict(row) for row in points.column("labels").to_pylist()]


def table(**columns: pa.Array) -> pa.Table:
    """A points table with defaults for the columns not given (one row each)."""
    rows = len(next(iter(columns.values()))) if columns else 1
    base: dict[str, pa.Array] = {
        "ts": pa.array([v.TS0 + i for i in range(rows)], v.TS),
        "metric": pa.array(["m"] * rows),
        "value": pa.array([1.0] * rows),
        "labels": pa.array([None] * rows, v.LABELS),
    }
    base.update(columns)
    return pa.table(base)


def frame_of(tbl: pa.Table, *, record_count: int | None = None) -> bytes:
    count = tbl.num_rows if record_count is None else record_count
    return v.spec_frame(payload=v.spec_stream(tbl), record_count=count)


def zstd_frame(raw: bytes, *, payload: bytes | None = None, raw_len: int | None = None) -> bytes:
    compressed = zstandard.ZstdCompressor(level=3).compress(raw) if payload is None else payload
    return v.spec_frame(
        payload=compressed,
        flags=0x01,
        payload_raw_len=len(raw) if raw_len is None else raw_len,
        record_count=v.labels_table().num_rows,
    )


def rejects(data: bytes, fragment: str, **kwargs: int) -> fr.FrameError:
    """``decode_frame`` refuses ``data`` naming ``fragment``, and the collector's
    ``check_payload`` refuses it with the very same message."""
    with pytest.raises(fr.FrameError) as caught:
        fr.decode_frame(data, **kwargs)
    assert fragment in str(caught.value), str(caught.value)
    try:
        header = fr.decode_header(data)
    except fr.FrameError as exc:
        assert str(exc) == str(caught.value)
        return caught.value
    with pytest.raises(fr.FrameError) as checked:
        fr.check_payload(data, header, max_raw_bytes=kwargs.get("max_raw_bytes", 64 * 1024 * 1024))
    assert str(checked.value) == str(caught.value)
    return caught.value


# -- constants and golden vectors ---------------------------------------------------


def test_constants_match_the_spec() -> None:
    assert (fr.FRAME_MAGIC, fr.FRAME_VERSION, fr.FLAG_ZSTD) == (b"LMB1", 1, 0x01)
    assert (fr.HEADER_LEN, fr.CRC_LEN, fr.MAX_AGENT_ID_BYTES) == (52, 4, 128)
    assert (fr.MAX_METRIC_BYTES, fr.MAX_LABELS_PER_ROW) == (256, 64)
    assert (fr.MAX_LABEL_KEY_BYTES, fr.MAX_LABEL_VALUE_BYTES) == (128, 1024)
    assert fr.POINTS_SCHEMA.equals(v.CANONICAL_SCHEMA)
    assert issubclass(fr.FrameError, ValueError)


PINNED: list[tuple[str, Callable[[], bytes], str]] = [
    ("minimal", v.minimal_frame, v.MINIMAL_HEX),
    ("labels", v.labels_frame, v.LABELS_HEX),
    ("dictionary_metric", v.dictionary_metric_frame, v.DICTIONARY_METRIC_HEX),
    ("extra_column", v.extra_column_frame, v.EXTRA_COLUMN_HEX),
]


@pytest.mark.parametrize(("build", "pinned"), [p[1:] for p in PINNED], ids=[p[0] for p in PINNED])
def test_spec_builders_reproduce_the_pinned_bytes(build: Callable[[], bytes], pinned: str) -> None:
    assert build().hex() == pinned


def test_pinned_minimal_layout_field_by_field() -> None:
    data = bytes.fromhex(v.MINIMAL_HEX)
    assert data[0:4] == b"LMB1" and data[4] == 1 and data[5] == 0
    assert struct.unpack(">H", data[6:8]) == (7,)
    assert data[8:24] == v.BOOT_ID.bytes
    assert struct.unpack(">QQIII", data[24:52])[:3] == (10, 10, 1)
    payload_len, raw_len = struct.unpack(">II", data[44:52])
    assert payload_len == raw_len == len(data) - 56 - 7
    assert data[52:59] == b"agent-a"
    assert struct.unpack(">I", data[-4:]) == (zlib.crc32(data[:-4]),)


def test_decode_minimal() -> None:
    data = bytes.fromhex(v.MINIMAL_HEX)
    got = fr.decode_frame(data)
    assert (got.agent_id, got.boot_id, got.seq_start, got.seq_end) == ("agent-a", v.BOOT_ID, 10, 10)
    assert (got.record_count, got.flags) == (1, 0)
    assert got.points.schema.equals(fr.POINTS_SCHEMA)
    assert ts_ints(got.points) == [v.TS0]
    assert got.points.column("metric").to_pylist() == ["cpu.usage"]
    assert got.points.column("value").to_pylist() == [0.5]
    assert labels_of(got.points) == [None]
    header = fr.decode_header(data)
    assert header == fr.FrameHeader(
        agent_id="agent-a",
        boot_id=v.BOOT_ID,
        seq_start=10,
        seq_end=10,
        record_count=1,
        flags=0,
        payload_len=len(data) - 63,
        payload_raw_len=len(data) - 63,
    )
    assert not header.compressed


def test_decode_labels_nan_inf_and_u64_max_sequence() -> None:
    got = fr.decode_frame(bytes.fromhex(v.LABELS_HEX))
    assert (got.seq_start, got.seq_end, got.record_count) == (v.U64_MAX - 2, v.U64_MAX, 3)
    assert ts_ints(got.points) == [v.TS0, v.TS0 + 1, v.TS0 - 5]
    values = got.points.column("value").to_pylist()
    assert values[0] == 1.25 and math.isnan(values[1]) and values[2] == -math.inf
    assert labels_of(got.points) == v.LABELS_ROWS
    assert got.points.column("labels").to_pylist()[0] == [("host", "web-1"), ("dc", "eu-1")]


def test_decode_dictionary_metric_is_decoded_to_utf8() -> None:
    got = fr.decode_frame(bytes.fromhex(v.DICTIONARY_METRIC_HEX))
    assert got.agent_id == "höst-ä"
    assert got.points.schema.equals(fr.POINTS_SCHEMA)
    assert got.points.column("metric").to_pylist() == ["disk.io", "net.rx", "disk.io"]
    assert labels_of(got.points) == [{"dev": "sda"}, None, {"dev": "sdb", "mode": ""}]


def test_decode_extra_column_is_dropped_and_columns_reordered() -> None:
    got = fr.decode_frame(bytes.fromhex(v.EXTRA_COLUMN_HEX))
    assert got.points.schema.equals(fr.POINTS_SCHEMA)
    assert (got.seq_start, got.seq_end) == (100, 101)
    assert got.points.column("metric").to_pylist() == ["lat", "lat"]
    assert got.points.column("value").to_pylist() == [7.0, 8.0]
    assert labels_of(got.points) == [None, {"k": "v"}]


@pytest.mark.parametrize(
    ("pinned", "tbl", "seq_start"),
    [(v.MINIMAL_HEX, v.minimal_table, 10), (v.LABELS_HEX, v.labels_table, v.U64_MAX - 2)],
    ids=["minimal", "labels"],
)
def test_encode_reproduces_the_pinned_bytes(
    pinned: str, tbl: Callable[[], pa.Table], seq_start: int
) -> None:
    data = fe.encode_frame(
        agent_id="agent-a", boot_id=v.BOOT_ID, seq_start=seq_start, points=tbl(), compress=False
    )
    assert data.hex() == pinned
    # Decoding then re-encoding the canonical points is byte-identical too.
    again = fe.encode_frame(
        agent_id="agent-a",
        boot_id=v.BOOT_ID,
        seq_start=seq_start,
        points=fr.decode_frame(data).points,
        compress=False,
    )
    assert again == data


def test_encode_canonicalizes_dictionary_and_extra_columns() -> None:
    for source in (v.dictionary_metric_table(), v.extra_column_table()):
        data = fe.encode_frame(agent_id="a", boot_id=v.BOOT_ID, seq_start=0, points=source)
        points = fr.decode_frame(data).points
        assert points.column_names == ["ts", "metric", "value", "labels"]
        assert points.column("metric").to_pylist() == source.column("metric").to_pylist()


def test_zstd_frame_by_spec() -> None:
    raw = v.spec_stream(v.labels_table())
    got = fr.decode_frame(zstd_frame(raw))
    assert got.flags == 0x01 and fr.decode_header(zstd_frame(raw)).compressed
    assert labels_of(got.points) == v.LABELS_ROWS
    # A streaming encoder's frame has no content-size field; still accepted.
    streamer = zstandard.ZstdCompressor(level=19).compressobj()
    no_size = streamer.compress(raw) + streamer.flush()
    assert zstandard.get_frame_parameters(no_size).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert fr.decode_frame(zstd_frame(raw, payload=no_size)).record_count == 3


def test_encode_compressed_round_trip() -> None:
    data = fe.encode_frame(
        agent_id="agent-a", boot_id=v.BOOT_ID, seq_start=5, points=v.labels_table(), zstd_level=9
    )
    header = fr.decode_header(data)
    assert header.flags == fr.FLAG_ZSTD and header.payload_raw_len == len(
        v.spec_stream(v.labels_table())
    )
    got = fr.decode_frame(data)
    assert (got.seq_start, got.seq_end) == (5, 7)
    assert labels_of(got.points) == v.LABELS_ROWS


def test_decoded_objects_are_frozen() -> None:
    got = fr.decode_frame(bytes.fromhex(v.MINIMAL_HEX))
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.seq_start = 1  # type: ignore[misc]


# -- invalid header vectors ---------------------------------------------------------

_STREAM = v.spec_stream(v.minimal_table())


def _hdr(**fields: object) -> bytes:
    return v.spec_frame(payload=_STREAM, **fields)  # type: ignore[arg-type]


INVALID_HEADERS: list[tuple[str, bytes, str]] = [
    ("bad_magic", _hdr(magic=b"LMB0"), "magic b'LMB0' != b'LMB1'"),
    ("version_0", _hdr(frame_version=0), "frame_version 0 is not supported"),
    ("version_2", _hdr(frame_version=2), "frame_version 2 is not supported"),
    ("flag_bit_1", _hdr(flags=0x02), "flags 0x02 has unknown bits"),
    ("flag_bit_7_with_zstd", _hdr(flags=0x81), "flags 0x81 has unknown bits"),
    ("agent_id_len_0", _hdr(agent_id=b""), "agent_id_len 0 not in 1..128"),
    ("agent_id_len_129", _hdr(agent_id=b"a" * 129), "agent_id_len 129 not in 1..128"),
    ("agent_id_len_lies", _hdr(agent_id_len=8), "frame length"),
    ("zero_boot_id", _hdr(boot_id=bytes(16)), "boot_id is all-zero"),
    ("seq_end_before_start", _hdr(seq_start=10, seq_end=9), "seq_end 9 < seq_start 10"),
    (
        "record_count_mismatch",
        _hdr(seq_start=10, seq_end=20, record_count=10),
        "record_count 10 != seq_end - seq_start + 1 = 11",
    ),
    ("record_count_0", _hdr(seq_start=10, seq_end=10, record_count=0), "record_count 0 < 1"),
    (
        "record_count_u32_overflow",
        _hdr(seq_start=0, seq_end=2**32, record_count=1),
        "record_count 1 != seq_end - seq_start + 1 = 4294967297",
    ),
    (
        "raw_len_mismatch_uncompressed",
        _hdr(payload_raw_len=len(_STREAM) + 1),
        f"payload_raw_len {len(_STREAM) + 1} != payload_len {len(_STREAM)}",
    ),
    ("control_char_in_agent_id", _hdr(agent_id=b"agent\n1"), "control character 0x0a at byte 5"),
    ("nul_in_agent_id", _hdr(agent_id=b"\x00a"), "control character 0x00 at byte 0"),
    ("del_in_agent_id", _hdr(agent_id=b"a\x7f"), "control character 0x7f at byte 1"),
    ("agent_id_not_utf8", _hdr(agent_id=b"ag\xffent"), "agent_id is not valid UTF-8"),
    ("agent_id_surrogate", _hdr(agent_id=b"\xed\xa0\x80"), "agent_id is not valid UTF-8"),
    ("bad_crc", _hdr(crc=zlib.crc32(_hdr()[:-4]) ^ 1), "crc32 mismatch: frame says 0x"),
    (
        "trailing_byte",
        _hdr(trailer=b"\x00"),
        f"frame length {len(_hdr()) + 1} != 56 + agent_id_len 7",
    ),
    ("truncated_crc", _hdr()[:-1], f"frame length {len(_hdr()) - 1} != 56"),
    ("truncated_header", _hdr()[:30], "frame length 30 < minimum 56"),
    ("empty", b"", "frame length 0 < minimum 56"),
]


@pytest.mark.parametrize(
    ("data", "fragment"), [c[1:] for c in INVALID_HEADERS], ids=[c[0] for c in INVALID_HEADERS]
)
def test_invalid_header(data: bytes, fragment: str) -> None:
    with pytest.raises(fr.FrameError) as via_header:
        fr.decode_header(data)
    assert fragment in str(via_header.value)
    rejects(data, fragment)


def test_crc_is_checked_before_header_fields() -> None:
    """A corrupted field byte reads as a CRC mismatch, not as a garbage value."""
    good = bytes.fromhex(v.MINIMAL_HEX)
    for offset in (5, 8, 24, 32, 40, 48, 52):
        bad = bytearray(good)
        bad[offset] ^= 0xFF
        rejects(bytes(bad), "crc32 mismatch")


def test_c1_controls_and_max_length_agent_id_are_allowed() -> None:
    assert fr.decode_header(_hdr(agent_id="a\u0085b".encode())).agent_id == "a\u0085b"
    assert fr.decode_header(_hdr(agent_id=b"x" * 128)).agent_id == "x" * 128
    assert fr.decode_header(_hdr(seq_start=0, seq_end=0)).seq_start == 0


# -- invalid payload vectors --------------------------------------------------------

LONG_KEY = "k" * 129
INVALID_POINTS: list[tuple[str, pa.Table, str]] = [
    ("missing_value", table().drop_columns(["value"]), "missing column 'value'"),
    ("missing_labels", table().drop_columns(["labels"]), "missing column 'labels'"),
    (
        "duplicate_ts",
        table().append_column("ts", pa.array([1], v.TS)),
        "column 'ts' appears 2 times",
    ),
    ("ts_microseconds", table(ts=pa.array([1], pa.timestamp("us", tz="UTC"))), "ts: column type"),
    ("ts_offset_tz", table(ts=pa.array([1], pa.timestamp("ns", tz="+00:00"))), "ts: column type"),
    ("ts_naive", table(ts=pa.array([1], pa.timestamp("ns"))), "ts: column type timestamp[ns]"),
    ("ts_int64", table(ts=pa.array([1], pa.int64())), "ts: column type int64"),
    ("metric_binary", table(metric=pa.array([b"m"])), "metric: column type binary"),
    ("metric_view", table(metric=pa.array(["m"], pa.string_view())), "metric: column type"),
    ("value_float32", table(value=pa.array([1.0], pa.float32())), "value: column type float"),
    (
        "labels_int_values",
        table(labels=pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64()))),
        "labels: column type",
    ),
    (
        "labels_large_keys",
        table(labels=pa.array([None], pa.map_(pa.large_string(), pa.string()))),
        "labels: column type",
    ),
    ("labels_list", table(labels=pa.array([["a"]])), "labels: column type"),
    ("null_ts", table(ts=pa.array([1, None], v.TS)), "ts: row 1 is null"),
    ("null_metric", table(metric=pa.array(["a", None, "b"])), "metric: row 1 is null"),
    (
        "null_metric_in_dictionary",
        table(metric=pa.DictionaryArray.from_arrays([0, 1], pa.array(["a", None]))),
        "metric: row 1 is null",
    ),
    (
        "dictionary_metric_257_bytes",
        table(metric=pa.DictionaryArray.from_arrays([0, 1, 0], pa.array(["a", "m" * 257]))),
        "metric: row 1 is 257 bytes (must be 1..256)",
    ),
    (
        "null_dictionary_index",
        table(metric=pa.DictionaryArray.from_arrays(pa.array([0, None], pa.int8()), ["a"])),
        "metric: row 1 is null",
    ),
    (
        "empty_metric",
        table(metric=pa.array(["a", ""])),
        "metric: row 1 is 0 bytes (must be 1..256)",
    ),
    ("metric_257_bytes", table(metric=pa.array(["m" * 257])), "metric: row 0 is 257 bytes"),
    ("metric_258_utf8_bytes", table(metric=pa.array(["é" * 129])), "metric: row 0 is 258 bytes"),
    ("null_value", table(value=pa.array([1.0, None])), "value: row 1 is null"),
    (
        "65_labels",
        table(labels=pa.array([None, [(f"k{i}", "v") for i in range(65)]], v.LABELS)),
        "labels: row 1 has 65 entries (max 64)",
    ),
    (
        "duplicate_label_key",
        table(labels=pa.array([[("a", "1")], [("b", "1"), ("a", "2"), ("b", "3")]], v.LABELS)),
        "labels: row 1 has duplicate key 'b'",
    ),
    ("empty_label_key", table(labels=pa.array([[("", "v")]], v.LABELS)), "row 0 has an empty key"),
    (
        "label_key_129_bytes",
        table(labels=pa.array([[("ok", "v"), (LONG_KEY, "v")]], v.LABELS)),
        "labels: row 0 has a 129-byte key (must be 1..128 bytes)",
    ),
    (
        "label_value_1025_bytes",
        table(labels=pa.array([None, None, [("k", "v" * 1025)]], v.LABELS)),
        "labels: row 2 key 'k' has a 1025-byte value (max 1024)",
    ),
    (
        "null_label_value",
        table(labels=pa.array([[("k", None)]], v.LABELS)),
        "labels: row 0 key 'k' has a null value",
    ),
]


@pytest.mark.parametrize(
    ("tbl", "fragment"), [c[1:] for c in INVALID_POINTS], ids=[c[0] for c in INVALID_POINTS]
)
def test_invalid_points_are_rejected_by_decode_and_encode(tbl: pa.Table, fragment: str) -> None:
    rejects(frame_of(tbl), fragment)
    with pytest.raises(fr.FrameError) as caught:
        fe.encode_frame(agent_id="a", boot_id=v.BOOT_ID, seq_start=0, points=tbl)
    assert fragment in str(caught.value)


def test_points_at_the_limits_are_accepted() -> None:
    tbl = table(
        metric=pa.array(["m" * 256, "é" * 128]),
        labels=pa.array([[(f"k{i}", "") for i in range(64)], [("k" * 128, "v" * 1024)]], v.LABELS),
    )
    got = fr.decode_frame(frame_of(tbl)).points
    assert got.column("metric").to_pylist() == ["m" * 256, "é" * 128]
    assert labels_of(got)[1] == {"k" * 128: "v" * 1024}


@pytest.mark.parametrize(("rows", "record_count"), [(1, 2), (3, 2)])
def test_wrong_row_count(rows: int, record_count: int) -> None:
    tbl = table(value=pa.array([1.0] * rows))
    rejects(
        frame_of(tbl, record_count=record_count),
        f"payload has {rows} rows but record_count is {record_count}",
    )


def test_payload_that_is_not_arrow() -> None:
    rejects(v.spec_frame(payload=b"this is not an arrow stream"), "payload: Arrow IPC stream")
    rejects(v.spec_frame(payload=b""), "payload_raw_len 0")


def test_invalid_utf8_inside_the_stream() -> None:
    offsets = pa.py_buffer(struct.pack("<ii", 0, 2))
    bad = pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(b"\xff\xfe")])
    rejects(frame_of(table(metric=bad)), "payload: Arrow IPC stream: ArrowInvalid")


def test_non_monotonic_offsets_inside_the_stream() -> None:
    # Passes Arrow's cheap validation (and so the IPC reader); only full validation
    # sees it, and it must run before any compute kernel reads the buffers.
    offsets = pa.py_buffer(struct.pack("<iii", 0, 3, 1))
    bad = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"abc")])
    rejects(frame_of(table(metric=bad)), "payload: Arrow IPC stream: ArrowInvalid")


def test_ipc_body_compression_is_refused() -> None:
    for codec in ("zstd", "lz4"):
        options = pa.ipc.IpcWriteOptions(compression=codec)
        payload = v.spec_stream(v.dictionary_metric_table(), options=options)
        rejects(v.spec_frame(payload=payload, record_count=3), "uses body compression")


def test_bytes_after_the_arrow_stream() -> None:
    rejects(frame_of_payload(_STREAM + b"\x00" * 8), "8 bytes after the end of the Arrow IPC")
    rejects(frame_of_payload(_STREAM + _STREAM), "after the end of the Arrow IPC stream")
    # Without its end-of-stream marker the first stream runs into the second schema.
    rejects(frame_of_payload(_STREAM[:-8] + _STREAM), "payload: Arrow IPC stream")


def frame_of_payload(payload: bytes, record_count: int = 1) -> bytes:
    return v.spec_frame(payload=payload, record_count=record_count)


def test_stream_without_eos_and_with_several_batches_is_accepted() -> None:
    assert fr.decode_frame(frame_of_payload(_STREAM[:-8])).record_count == 1
    first = v.dictionary_metric_table()
    second = table(metric=pa.array(["other"]).dictionary_encode())
    second = second.cast(first.schema)
    batches = [*first.to_batches(), first.to_batches()[0].slice(0, 0), *second.to_batches()]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, first.schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    got = fr.decode_frame(frame_of_payload(sink.getvalue().to_pybytes(), record_count=4))
    assert got.points.column("metric").to_pylist() == ["disk.io", "net.rx", "disk.io", "other"]


def test_dictionary_deltas_are_accepted() -> None:
    data = v.dictionary_delta_frame()
    assert pa.ipc.open_stream(data[59:-4]).read_all().num_rows == 3
    got = fr.decode_frame(data).points
    assert got.column("metric").to_pylist() == ["a", "bb", "ccc"]
    assert labels_of(got) == [{"k": "v"}, None, {"x": "y", "z": ""}]


def test_hostile_offsets_are_caught_before_batches_are_concatenated() -> None:
    # Offsets 0, 2**30, 3 pass Arrow's cheap validation; concatenating the batches
    # before full validation reads far out of bounds (a segfault, not an exception).
    offsets = pa.py_buffer(struct.pack("<iii", 0, 2**30, 3))
    hostile = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"abc")])
    sink = pa.BufferOutputStream()
    tbl = table(metric=hostile)
    with pa.ipc.new_stream(sink, tbl.schema) as writer:
        writer.write_table(tbl)
        writer.write_table(table(metric=pa.array(["x"])))
    rejects(frame_of_payload(sink.getvalue().to_pybytes(), 3), "payload: Arrow IPC stream")


def test_large_utf8_metric_and_unusual_map_types_are_canonicalized() -> None:
    odd_map = pa.map_(
        pa.field("name", pa.string(), nullable=False),
        pa.field("val", pa.string(), nullable=False),
        keys_sorted=True,
    )
    tbl = table(
        metric=pa.DictionaryArray.from_arrays(
            pa.array([1, 0], pa.uint8()), pa.array(["a", "bb"], pa.large_string())
        ),
        labels=pa.array([[("x", "1")], None], odd_map),
    )
    got = fr.decode_frame(frame_of(tbl)).points
    assert got.schema.equals(fr.POINTS_SCHEMA)
    assert got.column("metric").to_pylist() == ["bb", "a"]
    tbl = table(metric=pa.array(["a"], pa.large_string()))
    assert fr.decode_frame(frame_of(tbl)).points.column("metric").type == pa.string()


def test_entries_under_a_null_labels_row_are_ignored_and_dropped() -> None:
    # Arrow lets a null list slot cover a non-empty child segment; its content is not
    # labels (even an invalid duplicate empty key there is fine).
    garbage = pa.MapArray.from_arrays(
        pa.array([0, 2, 3], pa.int32()),
        ["", "", "k"],
        ["x", "y", "v"],
        type=v.LABELS,
        mask=pa.array([True, False]),
    )
    got = fr.decode_frame(frame_of(table(labels=garbage))).points
    assert labels_of(got) == [None, {"k": "v"}]
    assert got.column("labels").chunk(0).keys.to_pylist() == ["k"]


def test_sliced_input_table_encodes_only_its_rows() -> None:
    sliced = v.labels_table().slice(1, 2)
    got = fr.decode_frame(
        fe.encode_frame(agent_id="a", boot_id=v.BOOT_ID, seq_start=0, points=sliced)
    ).points
    assert labels_of(got) == [None, {}]


def test_hundred_thousand_rows_with_a_duplicate_in_the_last_row() -> None:
    n = 100_000
    rows: list[list[tuple[str, str]] | None] = [
        [("host", f"h{i % 50}"), ("dc", "x"), ("env", "prod")] if i % 7 else None for i in range(n)
    ]
    good = table(value=pa.array([float(i) for i in range(n)]), labels=pa.array(rows, v.LABELS))
    assert fr.decode_frame(frame_of(good)).record_count == n
    rows[-1] = [("dc", "x"), ("host", "a"), ("dc", "y")]
    bad = table(value=pa.array([float(i) for i in range(n)]), labels=pa.array(rows, v.LABELS))
    rejects(frame_of(bad), f"labels: row {n - 1} has duplicate key 'dc'")


# -- zstd ------------------------------------------------------------------------------


def test_zstd_content_size_larger_than_raw_len_is_a_bomb() -> None:
    raw = v.spec_stream(v.labels_table())
    rejects(zstd_frame(raw, raw_len=len(raw) - 1), f"zstd frame content size {len(raw)} != ")


def test_zstd_bomb_without_content_size_stops_at_raw_len() -> None:
    streamer = zstandard.ZstdCompressor(level=1).compressobj()
    bomb = streamer.compress(b"\x00" * (64 * 1024 * 1024)) + streamer.flush()
    assert len(bomb) < 64 * 1024
    rejects(zstd_frame(b"", payload=bomb, raw_len=1000), "payload: zstd")


def test_zstd_output_shorter_than_raw_len() -> None:
    raw = v.spec_stream(v.labels_table())
    streamer = zstandard.ZstdCompressor(level=3).compressobj()
    no_size = streamer.compress(raw) + streamer.flush()
    rejects(zstd_frame(raw, payload=no_size, raw_len=len(raw) + 10), "decompressed to")


def test_zstd_trailing_data_and_second_frame() -> None:
    raw = v.spec_stream(v.labels_table())
    one = zstandard.ZstdCompressor(level=3).compress(raw)
    rejects(zstd_frame(raw, payload=one + b"\x00"), "payload: zstd")
    rejects(zstd_frame(raw, payload=one + one), "payload: zstd")


def test_zstd_flag_on_uncompressed_payload() -> None:
    raw = v.spec_stream(v.labels_table())
    rejects(zstd_frame(raw, payload=raw), "payload: zstd")


def test_zstd_window_larger_than_needed_is_refused() -> None:
    raw = v.spec_stream(v.labels_table())
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=27)
    streamer = zstandard.ZstdCompressor(compression_params=params).compressobj()
    huge_window = streamer.compress(raw) + streamer.flush()
    assert zstandard.get_frame_parameters(huge_window).window_size == 2**27
    rejects(zstd_frame(raw, payload=huge_window), "memory")


def test_max_raw_bytes() -> None:
    raw = v.spec_stream(v.labels_table())
    rejects(zstd_frame(raw), f"payload_raw_len {len(raw)} > max_raw_bytes 100", max_raw_bytes=100)
    plain = bytes.fromhex(v.LABELS_HEX)
    rejects(
        plain,
        f"payload_raw_len {len(raw)} > max_raw_bytes {len(raw) - 1}",
        max_raw_bytes=len(raw) - 1,
    )
    assert fr.decode_frame(plain, max_raw_bytes=len(raw)).record_count == 3


# -- encode_frame and points_table input validation ---------------------------------


def _encode(**overrides: object) -> bytes:
    args: dict[str, object] = {
        "agent_id": "agent-a",
        "boot_id": v.BOOT_ID,
        "seq_start": 0,
        "points": v.minimal_table(),
    }
    args.update(overrides)
    return fe.encode_frame(**args)  # type: ignore[arg-type]


BAD_ENCODE_INPUTS: list[tuple[str, dict[str, object], str]] = [
    ("empty_agent_id", {"agent_id": ""}, "agent_id is 0 bytes (must be 1..128)"),
    ("long_agent_id", {"agent_id": "é" * 65}, "agent_id is 130 bytes"),
    ("control_agent_id", {"agent_id": "a\tb"}, "control character 0x09"),
    ("surrogate_agent_id", {"agent_id": "a\ud800"}, "not encodable as UTF-8"),
    ("bytes_agent_id", {"agent_id": b"a"}, "agent_id must be str"),
    ("zero_boot_id", {"boot_id": uuid.UUID(int=0)}, "boot_id is all-zero"),
    ("str_boot_id", {"boot_id": str(v.BOOT_ID)}, "boot_id must be uuid.UUID"),
    ("negative_seq", {"seq_start": -1}, "seq_start -1 not in 0..2**64-1"),
    ("huge_seq", {"seq_start": 2**64}, "not in 0..2**64-1"),
    ("bool_seq", {"seq_start": True}, "seq_start must be int"),
    ("seq_overflow", {"seq_start": v.U64_MAX, "points": v.labels_table()}, "overflows u64"),
    ("zero_rows", {"points": v.minimal_table().slice(0, 0)}, "0 rows"),
    ("not_a_table", {"points": [1, 2]}, "points must be a pyarrow.Table"),
]


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [c[1:] for c in BAD_ENCODE_INPUTS],
    ids=[c[0] for c in BAD_ENCODE_INPUTS],
)
def test_encode_refuses_what_decode_would_refuse(
    overrides: dict[str, object], fragment: str
) -> None:
    with pytest.raises(fr.FrameError) as caught:
        _encode(**overrides)
    assert fragment in str(caught.value)


def test_encode_at_the_u64_edge() -> None:
    got = fr.decode_frame(_encode(seq_start=v.U64_MAX))
    assert got.seq_start == got.seq_end == v.U64_MAX


def test_points_table_builds_the_canonical_table() -> None:
    built = fe.points_table(
        [v.TS0, v.TS0 + 1, v.TS0 - 5],
        ["cpu.usage", "mem.free", "cpu.usage"],
        [1.25, math.nan, -math.inf],
        v.LABELS_ROWS,
    )
    assert built.schema.equals(fr.POINTS_SCHEMA)
    data = fe.encode_frame(
        agent_id="agent-a", boot_id=v.BOOT_ID, seq_start=v.U64_MAX - 2, points=built, compress=False
    )
    assert data.hex() == v.LABELS_HEX


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (([1, 2], ["a"], [1.0], [None]), "column lengths differ"),
        (([1], ["a"], ["x"], [None]), "points_table"),
        (([2**63], ["a"], [1.0], [None]), "points_table"),
        (([1], [""], [1.0], [None]), "metric: row 0 is 0 bytes"),
        (([1], ["a"], [1.0], [{"": "v"}]), "empty key"),
    ],
)
def test_points_table_errors(args: tuple[list[object], ...], fragment: str) -> None:
    with pytest.raises(fr.FrameError) as caught:
        fe.points_table(*args)  # type: ignore[arg-type]
    assert fragment in str(caught.value)
