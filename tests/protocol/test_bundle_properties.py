"""Properties of the bundle format (PROTOCOL §3.10): any set of frames round-trips; any
damage to a bundle is refused with BundleError and nothing else (or, if it passes, the
frames read back are byte-identical); every index that does not tile is refused."""

from __future__ import annotations

import hashlib
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import bundle as bd
from protocol import keys
from tests.protocol import bundle_vectors as bv
from tests.protocol import frame_vectors as fv

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_FRAME = 1 << 20


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """A §1 frame by its header (the bundle checks headers, CRC and hash, not payloads)."""
    agent = draw(st.text("abcxyz-0189\u00e9", min_size=1, max_size=12)).encode()
    seq_start = draw(st.integers(0, 2**64 - 10))
    return fv.spec_frame(
        payload=draw(st.binary(max_size=48)),
        agent_id=agent,
        boot_id=draw(st.uuids().filter(lambda u: u.int != 0)).bytes,
        seq_start=seq_start,
        record_count=draw(st.integers(1, 5)),
    )


frame_lists = st.lists(frames(), min_size=1, max_size=6)


def _same_frames(checked: bd.CheckedBundle, data: bytes, original: list[bytes]) -> bool:
    return [bytes(checked.frame_bytes(data, i)) for i in range(len(checked.frames))] == original


@PROPERTY
@given(frame_lists)
def test_round_trip(original: list[bytes]) -> None:
    encoded = bd.encode_bundle(original)
    assert encoded.data == bv.spec_bundle(original)  # the encoder is the §3.10 table
    assert encoded.sha256 == hashlib.sha256(encoded.data).hexdigest()
    assert keys.parse_raw_bundle_key(encoded.key) == encoded.sha256
    checked = bd.check_bundle(encoded.data, sha256=encoded.sha256)
    assert _same_frames(checked, encoded.data, original)
    assert tuple(f.entry for f in checked.frames) == encoded.entries
    for frame, entry in zip(original, encoded.entries, strict=True):
        assert entry.frame_sha256 == hashlib.sha256(frame).hexdigest()
        read = bd.read_frame(
            encoded.data,
            entry.offset,
            entry.length,
            frame_sha256=entry.frame_sha256,
            max_frame_bytes=MAX_FRAME,
        )
        assert bytes(read) == frame
    assert len(encoded.data) == sum(map(len, original)) + 44 * len(original) + 12


@PROPERTY
@given(frame_lists, st.data())
def test_single_byte_damage_is_refused(original: list[bytes], data: st.DataObject) -> None:
    bundle = bd.encode_bundle(original).data
    pos = data.draw(st.integers(0, len(bundle) - 1), label="pos")
    mask = data.draw(st.integers(1, 255), label="mask")
    damaged = bytearray(bundle)
    damaged[pos] ^= mask
    try:
        checked = bd.check_bundle(bytes(damaged))
    except bd.BundleError:
        return
    # Passing is harmless only if every frame reads back unchanged.
    assert _same_frames(checked, bytes(damaged), original)  # pragma: no cover


@PROPERTY
@given(frame_lists, st.data())
def test_any_damage_raises_bundle_error_only(original: list[bytes], data: st.DataObject) -> None:
    """Truncation, extension and rewritten spans: BundleError, never another exception."""
    bundle = bd.encode_bundle(original).data
    start = data.draw(st.integers(0, len(bundle)), label="start")
    end = data.draw(st.integers(start, min(len(bundle), start + 64)), label="end")
    patch = data.draw(st.binary(max_size=80), label="patch")
    damaged = bundle[:start] + patch + bundle[end:]
    try:
        checked = bd.check_bundle(damaged)
    except bd.BundleError:
        return
    assert _same_frames(checked, damaged, original)


@PROPERTY
@given(st.binary(max_size=400))
def test_random_bytes_raise_bundle_error_only(junk: bytes) -> None:
    try:
        bd.check_bundle(junk + b"LMX1")
    except bd.BundleError:
        return
    raise AssertionError("random bytes made a bundle")  # pragma: no cover


@PROPERTY
@given(st.lists(frames(), min_size=2, max_size=6), st.data())
def test_every_index_that_does_not_tile_is_refused(
    original: list[bytes], data: st.DataObject
) -> None:
    """One entry moved or resized (the index CRC recomputed, so only tiling can catch it):
    a gap, an overlap, an out-of-bounds range or an index disagreeing with the frames."""
    entries = bv.spec_entries(original)
    i = data.draw(st.integers(0, len(entries) - 1), label="entry")
    d_offset = data.draw(st.integers(-200, 200), label="d_offset")
    d_length = data.draw(st.integers(-200, 200), label="d_length")
    offset, length, sha = entries[i]
    moved = (max(0, offset + d_offset), max(0, length + d_length), sha)
    if moved[:2] == (offset, length):
        return
    entries[i] = moved
    bundle = bv.spec_bundle(original, entries=entries)
    try:
        bd.check_bundle(bundle)
    except bd.BundleError as exc:
        assert any(
            word in str(exc)
            for word in ("gap", "overlaps", "out of bounds", "minimum", "disagrees")
        ), exc
        return
    raise AssertionError(f"index entry {i} moved to {moved[:2]} passed")  # pragma: no cover


@PROPERTY
@given(st.lists(frames(), min_size=2, max_size=6), st.data())
def test_index_reordered_or_rehashed_is_refused(original: list[bytes], data: st.DataObject) -> None:
    """A tiling index that names the frames in another order, or another hash."""
    entries = bv.spec_entries(original)
    i = data.draw(st.integers(0, len(entries) - 2), label="i")
    if data.draw(st.booleans(), label="swap hashes"):
        a, b = entries[i], entries[i + 1]
        if a[2] == b[2]:
            return
        entries[i], entries[i + 1] = (a[0], a[1], b[2]), (b[0], b[1], a[2])
        message = "frame_sha256 mismatch"
    else:
        entries[i] = (entries[i][0], entries[i][1], uuid.uuid4().bytes * 2)
        message = "frame_sha256 mismatch"
    bundle = bv.spec_bundle(original, entries=entries)
    try:
        bd.check_bundle(bundle)
    except bd.BundleError as exc:
        assert message in str(exc)
        return
    raise AssertionError("a rehashed index passed")  # pragma: no cover


@PROPERTY
@given(frame_lists, st.integers(1, 2**32 - 1))
def test_hostile_frame_counts_fail_before_reading_the_index(
    original: list[bytes], count: int
) -> None:
    bundle = bd.encode_bundle(original).data
    if count == len(original):
        return
    forged = bundle[:-12] + count.to_bytes(4, "big") + bundle[-8:]
    try:
        bd.check_bundle(forged)
    except bd.BundleError as exc:
        assert "bad footer" in str(exc) or "index crc32 mismatch" in str(exc)
        return
    raise AssertionError("a forged frame count passed")  # pragma: no cover
