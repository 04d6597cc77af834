"""The bundle format (PROTOCOL §3.10) against its golden vectors, and each rejection by
name: footer, index CRC, gaps, overlaps, out-of-bounds ranges, an index disagreeing with
the frames, a frame failing its CRC or hash; the range readers; the bundle key."""

from __future__ import annotations

import hashlib
import struct
import uuid
import zlib
from typing import Any

import pytest

from protocol import bundle as bd
from protocol import keys
from tests.protocol import bundle_vectors as bv
from tests.protocol import frame_vectors as fv

MAX_FRAME = 1 << 20


def _entry(offset: int, length: int, frame: bytes) -> tuple[int, int, bytes]:
    return offset, length, hashlib.sha256(frame).digest()


def test_golden_bundle_bytes_hash_and_entries() -> None:
    data = bv.golden_bundle()
    assert hashlib.sha256(data).hexdigest() == bv.BUNDLE_SHA256
    encoded = bd.encode_bundle(bv.golden_frames())
    assert encoded.data == data
    assert encoded.sha256 == bv.BUNDLE_SHA256
    assert [(e.offset, e.length, e.frame_sha256) for e in encoded.entries] == list(bv.ENTRIES)
    assert encoded.key == (
        f"raw-bundles/v1/sha256/{bv.BUNDLE_SHA256[:2]}/{bv.BUNDLE_SHA256[2:4]}/"
        f"{bv.BUNDLE_SHA256}.lmbundle"
    )


def test_golden_bundle_layout_field_by_field() -> None:
    data = bv.golden_bundle()
    assert data[-4:] == b"LMX1"
    count, crc = struct.unpack(">II", data[-12:-4])
    assert count == 3
    index = data[-12 - 44 * 3 : -12]
    assert crc == zlib.crc32(index)
    offset, length, digest = struct.unpack(">QI32s", index[44:88])
    assert (offset, length) == (1031, 1135)
    assert data[offset : offset + length] == bytes.fromhex(fv.LABELS_HEX)
    assert digest.hex() == bv.ENTRIES[1][2]


def test_check_golden_bundle() -> None:
    data = bv.golden_bundle()
    checked = bd.check_bundle(data, sha256=bv.BUNDLE_SHA256)
    assert checked.size == len(data) and checked.data_len == 1031 + 1135 + 1344
    assert [bytes(checked.frame_bytes(data, i)) for i in range(3)] == bv.golden_frames()
    assert checked.frames[1].identity.seq_end == 2**64 - 1
    assert checked.frames[0].identity == keys.BatchIdentity("agent-a", fv.BOOT_ID, 10, 10)
    assert checked.key == keys.raw_bundle_key(bv.BUNDLE_SHA256)


def test_check_refuses_bytes_that_do_not_hash_to_the_key() -> None:
    with pytest.raises(bd.BundleError, match="its key names"):
        bd.check_bundle(bv.golden_bundle(), sha256="0" * 64)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d[:-4] + b"LMX2", "bad footer: magic"),
        (lambda d: d[:-12] + struct.pack(">I", 0) + d[-8:], "bad footer: frame count 0"),
        (lambda d: d[:-12] + struct.pack(">I", 2**32 - 1) + d[-8:], "bad footer: frame count"),
        (lambda d: d[:11], "bad footer: object of 11 bytes"),
        (lambda d: b"", "bad footer"),
        (lambda d: d[:-12] + struct.pack(">I", 2) + d[-8:], "index crc32 mismatch"),
        (lambda d: d[:-8] + b"\0\0\0\0" + d[-4:], "index crc32 mismatch"),
        (lambda d: d[:-20] + bytes([d[-20] ^ 1]) + d[-19:], "index crc32 mismatch"),
        (lambda d: b"\0" + d, "gap of 1 bytes before the index"),
        (lambda d: d[1:], "index entry 2 .*: out of bounds, the data part is 3509 bytes"),
    ],
)
def test_damaged_tail_is_refused(damage, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(bd.BundleError, match=message):
        bd.check_bundle(damage(bv.golden_bundle()))


def test_index_gap_overlap_out_of_bounds_and_disagreement() -> None:
    a, b, c = bv.golden_frames()
    la, lb, lc = len(a), len(b), len(c)
    cases = {
        "gap of 1 bytes after offset 0": [_entry(1, la, a)],
        "overlaps the previous frame": [_entry(0, la, a), _entry(la - 1, lb, b)],
        "gap of 5 bytes after offset": [_entry(0, la, a), _entry(la + 5, lb, b)],
        "out of bounds": [_entry(0, la, a), _entry(la, lb, b), _entry(la + lb, lc + 1, c)],
        "length < a frame's minimum": [_entry(0, 10, a)],
        "gap of .* bytes before the index": [_entry(0, la, a), _entry(la, lb, b)],
        # Tiles exactly, but not where the frames are.
        "index disagrees with the frames": [
            _entry(0, lb, b),
            _entry(lb, la, a),
            _entry(la + lb, lc, c),
        ],
        "frame 1 at offset 1031: frame_sha256 mismatch": [
            _entry(0, la, a),
            _entry(la, lb, a),
            _entry(la + lb, lc, c),
        ],
    }
    for message, entries in cases.items():
        data = bv.spec_bundle([a, b, c], entries=entries)
        with pytest.raises(bd.BundleError, match=message):
            bd.check_bundle(data)


def test_frame_crc_and_header_failures_name_the_frame() -> None:
    a, b, c = bv.golden_frames()
    bad_crc = b[:-1] + bytes([b[-1] ^ 0x40])
    with pytest.raises(bd.BundleError, match="frame 1 at offset 1031: crc32 mismatch"):
        bd.check_bundle(bv.spec_bundle([a, bad_crc, c]))
    # A header declaring a longer frame than the bytes it has: the frames no longer tile.
    grown = b[:44] + struct.pack(">I", struct.unpack(">I", b[44:48])[0] + 1) + b[48:]
    with pytest.raises(bd.BundleError, match=r"index disagrees|past the end"):
        bd.check_bundle(bv.spec_bundle([a, grown, c], entries=bv.spec_entries([a, b, c])))
    # Not a frame at all at offset 0.
    junk = b"X" * len(a)
    with pytest.raises(bd.BundleError, match="frame 0 at offset 0: magic"):
        bd.check_bundle(bv.spec_bundle([junk, b, c]))


def test_every_single_byte_flip_of_the_golden_bundle_is_detected() -> None:
    data = bv.golden_bundle()
    for mask in (0x01, 0x80, 0xFF):
        for pos in range(len(data)):
            damaged = bytearray(data)
            damaged[pos] ^= mask
            with pytest.raises(bd.BundleError):
                bd.check_bundle(bytes(damaged))


def test_encode_refuses_what_would_not_tile() -> None:
    a, b, _ = bv.golden_frames()
    with pytest.raises(bd.BundleError, match="at least one frame"):
        bd.encode_bundle([])
    with pytest.raises(bd.BundleError, match=r"frame 1 .* not a §1 frame"):
        bd.encode_bundle([a, b + b"\0"])
    with pytest.raises(bd.BundleError, match=r"frame 0 .* not a §1 frame"):
        bd.encode_bundle([b"LMB1" + bytes(40)])
    with pytest.raises(bd.BundleError, match="2 hashes for 1 frames"):
        bd.encode_bundle([a], ["0" * 64, "1" * 64])
    with pytest.raises(bd.BundleError, match="64 lowercase hex"):
        bd.encode_bundle([a], ["A" * 64])
    given = bd.encode_bundle([a, b], [hashlib.sha256(a).hexdigest(), hashlib.sha256(b).hexdigest()])
    assert given == bd.encode_bundle([a, b])


def test_max_bundle_bytes_is_the_formula() -> None:
    assert (
        bd.max_bundle_bytes(
            bundle_max_bytes=8 << 20, max_frame_bytes=16 << 20, bundle_max_frames=1000
        )
        == (8 << 20) + (16 << 20) + 44 * 1000 + 12
    )


# --- range readers ---------------------------------------------------------------------------


def test_read_frame_by_a_records_range() -> None:
    data = bv.golden_bundle()
    for i, (offset, length, sha) in enumerate(bv.ENTRIES):
        frame = bd.read_frame(data, offset, length, frame_sha256=sha, max_frame_bytes=MAX_FRAME)
        assert bytes(frame) == bv.golden_frames()[i]
    offset, length, sha = bv.ENTRIES[0]
    identity = keys.BatchIdentity("agent-a", fv.BOOT_ID, 10, 10)
    other = keys.BatchIdentity("agent-a", fv.BOOT_ID, 10, 11)
    assert bd.read_frame(
        data, offset, length, frame_sha256=sha, max_frame_bytes=MAX_FRAME, identity=identity
    )
    refusals: list[tuple[tuple[int, int], dict[str, Any], str]] = [
        ((offset, length), {"identity": other}, "ranged frame is batch"),
        ((offset, length), {"frame_sha256": bv.ENTRIES[1][2]}, "the record names"),
        ((offset + 1, length), {}, "not at an index entry"),
        ((offset, length - 1), {}, "whose length is"),
        ((-1, length), {}, "negative offset"),
        ((offset, 55), {}, "length not in 56"),
        ((offset, length), {"max_frame_bytes": length - 1}, "length not in"),
        ((len(data) - 100, 90), {}, "out of bounds"),
    ]
    for (off, n), override, message in refusals:
        kwargs = {"frame_sha256": sha, "max_frame_bytes": MAX_FRAME, **override}
        with pytest.raises(bd.BadRangeError, match=message):
            bd.read_frame(data, off, n, **kwargs)
    with pytest.raises(bd.BadRangeError, match="bundle index: bad footer"):
        bd.read_frame(data[:-1] + b"2", offset, length, frame_sha256=sha, max_frame_bytes=MAX_FRAME)


def test_ranged_read_then_index_fallback() -> None:
    """§3.10 "Readers": the range's bytes are used when they check; else the index entry
    of that hash, read from the tail (footer, then the index range it names)."""
    data = bv.golden_bundle()
    offset, length, sha = bv.ENTRIES[2]
    header = bd.check_ranged_frame(data[offset : offset + length], frame_sha256=sha)
    assert header.agent_id == "h\u00f6st-\u00e4"
    wrong = data[offset - 1 : offset - 1 + length]
    with pytest.raises(bd.BadRangeError, match="ranged frame"):
        bd.check_ranged_frame(wrong, frame_sha256=sha)
    footer = bd.parse_footer(data[-bd.FOOTER_LEN :], len(data))
    start, n = footer.index_range
    index = bd.parse_index(data[start : start + n], footer)
    entry = bd.locate_frame(index, sha)
    assert (entry.offset, entry.length) == (offset, length)
    assert index.entry_at(offset, length) == entry
    with pytest.raises(bd.BadRangeError, match="has no frame"):
        bd.locate_frame(index, "0" * 64)
    with pytest.raises(bd.BundleError, match="index is 43 bytes"):
        bd.parse_index(data[start : start + 43], footer)
    with pytest.raises(bd.BadRangeError, match="out of bounds"):
        bd.check_range(0, 100, max_frame_bytes=MAX_FRAME, object_size=100 + 44 + 11)
    bd.check_range(0, 100, max_frame_bytes=MAX_FRAME, object_size=100 + 44 + 12)


def test_a_frame_twice_in_one_bundle() -> None:
    a = bv.golden_frames()[0]
    data = bd.encode_bundle([a, a]).data
    checked = bd.check_bundle(data)
    assert [f.entry.offset for f in checked.frames] == [0, len(a)]
    assert bd.locate_frame(bd.read_index(data), hashlib.sha256(a).hexdigest()).offset == 0


# --- keys ------------------------------------------------------------------------------------


def test_raw_object_keys() -> None:
    sha = bv.BUNDLE_SHA256
    bundle_key = keys.raw_bundle_key(sha)
    blob_key = keys.raw_blob_key(sha)
    assert bundle_key.startswith(keys.RAW_BUNDLES_PREFIX)
    assert keys.parse_raw_bundle_key(bundle_key) == sha
    assert keys.parse_raw_object_key(bundle_key) == ("bundle", sha)
    assert keys.parse_raw_object_key(blob_key) == ("blob", sha)
    assert keys.parse_raw_blob_key(blob_key) == sha
    with pytest.raises(keys.KeyFormatError, match="not a raw-blob key"):
        keys.parse_raw_blob_key(bundle_key)
    with pytest.raises(keys.KeyFormatError, match="not a raw-bundle key"):
        keys.parse_raw_bundle_key(blob_key)
    for bad in (
        bundle_key.replace(".lmbundle", ".lmbatch"),
        blob_key.replace(".lmbatch", ".lmbundle"),
        bundle_key.replace(f"/{sha[:2]}/", "/00/", 1) if sha[:2] != "00" else "x",
        bundle_key.upper(),
        bundle_key + "x",
    ):
        with pytest.raises(keys.KeyFormatError):
            keys.parse_raw_object_key(bad)
    with pytest.raises(keys.KeyFormatError):
        keys.raw_bundle_key(str(uuid.uuid4()))
