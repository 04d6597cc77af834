"""Properties of the batch frame codec: encode→decode is the identity, and any damage
to a valid frame is refused with FrameError and nothing else."""

from __future__ import annotations

import math
import struct
import uuid
import zlib
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import frame as fr
from protocol import frame_encode as fe
from tests.protocol import frame_vectors as v

U64_MAX = 2**64 - 1
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DAMAGE = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def utf8_text(*, min_size: int, max_bytes: int, max_size: int) -> st.SearchStrategy[str]:
    return st.text(st.characters(codec="utf-8"), min_size=min_size, max_size=max_size).filter(
        lambda s: len(s.encode("utf-8")) <= max_bytes
    )


agent_ids = st.text(
    st.characters(codec="utf-8", exclude_characters=[chr(c) for c in range(0x20)] + ["\x7f"]),
    min_size=1,
    max_size=40,
).filter(lambda s: len(s.encode("utf-8")) <= fr.MAX_AGENT_ID_BYTES)
boot_ids = st.uuids().filter(lambda u: u.int != 0)
label_sets = st.none() | st.dictionaries(
    utf8_text(min_size=1, max_bytes=fr.MAX_LABEL_KEY_BYTES, max_size=12),
    utf8_text(min_size=0, max_bytes=fr.MAX_LABEL_VALUE_BYTES, max_size=20),
    max_size=6,
)
points_rows = st.lists(
    st.tuples(
        st.integers(-(2**63), 2**63 - 1),
        utf8_text(min_size=1, max_bytes=fr.MAX_METRIC_BYTES, max_size=30),
        st.floats(allow_nan=True, allow_infinity=True),
        label_sets,
    ),
    min_size=1,
    max_size=25,
)


@st.composite
def frames(draw: st.DrawFn) -> tuple[bytes, dict[str, Any]]:
    """A valid frame and the inputs it was built from."""
    rows = draw(points_rows)
    seq_start = min(draw(st.integers(0, U64_MAX)), U64_MAX - len(rows) + 1)
    inputs: dict[str, Any] = {
        "agent_id": draw(agent_ids),
        "boot_id": draw(boot_ids),
        "seq_start": seq_start,
        "rows": rows,
        "compress": draw(st.booleans()),
    }
    points = fe.points_table(*(list(column) for column in zip(*rows, strict=True)))
    data = fe.encode_frame(
        agent_id=inputs["agent_id"],
        boot_id=inputs["boot_id"],
        seq_start=seq_start,
        points=points,
        compress=inputs["compress"],
    )
    return data, inputs


def float_bits(x: float) -> bytes:
    return struct.pack(">d", x)


@PROPERTY
@given(frames())
def test_round_trip(case: tuple[bytes, dict[str, Any]]) -> None:
    data, inputs = case
    rows = inputs["rows"]
    got = fr.decode_frame(data)
    assert got.agent_id == inputs["agent_id"]
    assert got.boot_id == inputs["boot_id"]
    assert (got.seq_start, got.seq_end) == (
        inputs["seq_start"],
        inputs["seq_start"] + len(rows) - 1,
    )
    assert got.record_count == len(rows)
    assert got.flags == (fr.FLAG_ZSTD if inputs["compress"] else 0)
    points = got.points
    assert points.schema.equals(fr.POINTS_SCHEMA)
    assert points.column("ts").cast(pa.int64()).to_pylist() == [r[0] for r in rows]
    assert points.column("metric").to_pylist() == [r[1] for r in rows]
    # NaN payload bits survive too: compare the IEEE-754 bytes, not the values.
    assert [float_bits(x) for x in points.column("value").to_pylist()] == [
        float_bits(r[2]) for r in rows
    ]
    assert points.column("labels").to_pylist() == [
        None if r[3] is None else list(r[3].items()) for r in rows
    ]
    header = fr.decode_header(data)
    assert (header.agent_id, header.boot_id, header.seq_end) == (
        got.agent_id,
        got.boot_id,
        got.seq_end,
    )
    again = fe.encode_frame(
        agent_id=got.agent_id,
        boot_id=got.boot_id,
        seq_start=got.seq_start,
        points=points,
        compress=inputs["compress"],
    )
    assert again == data


@DAMAGE
@given(frames(), st.data())
def test_any_single_byte_change_is_refused(case: tuple[bytes, dict[str, Any]], data: Any) -> None:
    frame, _ = case
    position = data.draw(st.integers(0, len(frame) - 1), label="position")
    delta = data.draw(st.integers(1, 255), label="delta")
    damaged = bytearray(frame)
    damaged[position] = (damaged[position] + delta) % 256
    with pytest.raises(fr.FrameError):
        fr.decode_frame(bytes(damaged))


@DAMAGE
@given(frames())
def test_every_truncation_is_refused(case: tuple[bytes, dict[str, Any]]) -> None:
    frame, _ = case
    for length in range(len(frame)):
        with pytest.raises(fr.FrameError):
            fr.decode_frame(frame[:length])


@DAMAGE
@given(frames(), st.binary(min_size=1, max_size=64))
def test_any_extension_is_refused(case: tuple[bytes, dict[str, Any]], extra: bytes) -> None:
    frame, _ = case
    with pytest.raises(fr.FrameError):
        fr.decode_frame(frame + extra)


@pytest.mark.parametrize("name", ["MINIMAL_HEX", "LABELS_HEX"])
@pytest.mark.parametrize("compress", [False, True], ids=["plain", "zstd"])
def test_every_single_byte_change_of_a_golden_frame_is_refused(name: str, compress: bool) -> None:
    """Exhaustive: every position, every other byte value (~250k decodes, well under 2 s)."""
    golden = fr.decode_frame(bytes.fromhex(getattr(v, name)))
    good = fe.encode_frame(
        agent_id=golden.agent_id,
        boot_id=golden.boot_id,
        seq_start=golden.seq_start,
        points=golden.points,
        compress=compress,
    )
    damaged = bytearray(good)
    accepted = []
    for position in range(len(good)):
        original = damaged[position]
        for value in range(256):
            if value == original:
                continue
            damaged[position] = value
            try:
                fr.decode_frame(bytes(damaged))
            except fr.FrameError:
                continue
            accepted.append((position, value))
        damaged[position] = original
    assert accepted == []


def with_fixed_crc(frame: bytearray) -> bytes:
    frame[-4:] = struct.pack(">I", zlib.crc32(frame[:-4]))
    return bytes(frame)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames(), st.data())
def test_damage_behind_a_valid_crc_raises_only_frame_error(
    case: tuple[bytes, dict[str, Any]], data: Any
) -> None:
    """With the CRC recomputed, damage reaches the zstd/Arrow decoders: the outcome is a
    valid Frame or a FrameError, never another exception (or a crash)."""
    frame, _ = case
    damaged = bytearray(frame)
    payload_start = len(frame) - fr.CRC_LEN - struct.unpack_from(">I", frame, 44)[0]
    lowest = data.draw(st.sampled_from([0, payload_start]), label="region")
    for _ in range(data.draw(st.integers(1, 4), label="changes")):
        position = data.draw(st.integers(lowest, len(frame) - fr.CRC_LEN - 1), label="position")
        damaged[position] = data.draw(st.integers(0, 255), label="value")
    try:
        got = fr.decode_frame(with_fixed_crc(damaged))
    except fr.FrameError:
        return
    assert got.points.num_rows == got.record_count
    assert got.points.schema.equals(fr.POINTS_SCHEMA)


GOLDEN_FRAMES = [
    bytes.fromhex(v.MINIMAL_HEX),
    bytes.fromhex(v.LABELS_HEX),
    bytes.fromhex(v.DICTIONARY_METRIC_HEX),
    bytes.fromhex(v.EXTRA_COLUMN_HEX),
    v.dictionary_delta_frame(),
]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(GOLDEN_FRAMES), st.data())
def test_payload_damage_to_golden_frames_raises_only_frame_error(frame: bytes, data: Any) -> None:
    """Dictionaries, deltas and extra columns (which generated frames never have) reach
    the Arrow reader damaged, behind a valid CRC."""
    damaged = bytearray(frame)
    payload_start = len(frame) - fr.CRC_LEN - struct.unpack_from(">I", frame, 44)[0]
    for _ in range(data.draw(st.integers(1, 4), label="changes")):
        position = data.draw(
            st.integers(payload_start, len(frame) - fr.CRC_LEN - 1), label="position"
        )
        damaged[position] = data.draw(st.integers(0, 255), label="value")
    try:
        got = fr.decode_frame(with_fixed_crc(damaged))
    except fr.FrameError:
        return
    assert got.points.num_rows == got.record_count


def test_nan_and_infinities_keep_their_bits() -> None:
    specials = [
        math.nan,
        -math.nan,
        math.inf,
        -math.inf,
        -0.0,
        struct.unpack(">d", b"\x7f\xf0" + b"\0" * 5 + b"\x01")[0],
    ]
    points = fe.points_table(
        [0] * len(specials), ["m"] * len(specials), specials, [None] * len(specials)
    )
    for compress in (False, True):
        got = fr.decode_frame(
            fe.encode_frame(
                agent_id="a", boot_id=uuid.uuid4(), seq_start=0, points=points, compress=compress
            )
        )
        assert [float_bits(x) for x in got.points.column("value").to_pylist()] == [
            float_bits(x) for x in specials
        ]
