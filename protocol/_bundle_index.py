"""A bundle's index and footer (PROTOCOL §3.10), and the bundle's error types.

Public as `protocol.bundle.*`; kept apart so a reader that fetched only a bundle's tail
(footer, then index) can use it without the frame-tiling code.

Tail layout, big-endian (§3.10, "Layout"), after the data part of ``D`` bytes:

| offset | size | field |
|---|---|---|
| D + 44·i | 8 | entry i: offset (u64) of frame i in the data part |
| D + 44·i + 8 | 4 | entry i: length (u32) of frame i |
| D + 44·i + 12 | 32 | entry i: `frame_sha256`, the 32 raw digest bytes |
| D + 44·n | 4 | footer: frame count n (u32) |
| D + 44·n + 4 | 4 | footer: CRC-32 (IEEE, as `zlib.crc32`) of the index bytes [D, D + 44·n) |
| D + 44·n + 8 | 4 | footer: magic, ASCII `LMX1` |

Decisions where §3.10 is loose (change them only together with PROTOCOL.md):
- The index's `frame_sha256` is the raw 32-byte digest: the largest-object formula's
  44 bytes per frame (8 + 4 + 32) leaves no room for 64 hex characters.
- A bundle holds at least one frame (a count of 0 is a bad footer): an empty object of
  12 bytes is never written and is refused as corrupt, never deleted as empty.
- The index is checked on its own before any frame is read: entry 0 at offset 0, each
  next entry exactly where the previous one ends, the last one ending where the index
  starts, and every length at least a §1 frame's minimum (56). So a gap, an overlap or
  an out-of-bounds range is refused naming the entry, whatever the frames say.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "BUNDLE_MAGIC",
    "ENTRY_LEN",
    "FOOTER_LEN",
    "MIN_FRAME_LEN",
    "BadRangeError",
    "BundleEntry",
    "BundleError",
    "BundleIndex",
    "Footer",
    "max_bundle_bytes",
    "parse_footer",
    "parse_index",
]

BUNDLE_MAGIC = b"LMX1"
ENTRY_STRUCT = struct.Struct(">QI32s")
FOOTER_STRUCT = struct.Struct(">II4s")
ENTRY_LEN = ENTRY_STRUCT.size
FOOTER_LEN = FOOTER_STRUCT.size
MIN_FRAME_LEN = 56  # §1: header 52 + crc32 4 (agent_id and payload may not both be empty,
# but the header's own checks say so; 56 is what the tiling needs)
U32_MAX = 2**32 - 1
assert ENTRY_LEN == 44 and FOOTER_LEN == 12


class BundleError(ValueError):
    """A bundle (or a range read from one) breaks PROTOCOL §3.10.

    ``str(err)`` names the part (footer, index entry i, frame i at its offset) and the
    problem. Retrying never helps: the object is corrupt (the GC's ``corrupt-blob``).
    """


class BadRangeError(BundleError):
    """A record's range does not hold the frame it names (PROTOCOL §3.10 "Readers": a
    ``bad-range`` problem): out of the object's bounds, longer than a frame may be, not
    at an index entry, or bytes that fail the frame's CRC, hash or identity."""


def max_bundle_bytes(*, bundle_max_bytes: int, max_frame_bytes: int, bundle_max_frames: int) -> int:
    """The largest raw object a collector with these settings writes (§3.10): a bundle
    closes once it reaches `bundle_max_bytes` of frames, so the frame that closed it may
    add up to `max_frame_bytes`; then the index and the footer. The size every PUT and the
    §3.6 probe must be able to send in one conditional PutObject."""
    return bundle_max_bytes + max_frame_bytes + ENTRY_LEN * bundle_max_frames + FOOTER_LEN


@dataclass(frozen=True, slots=True)
class BundleEntry:
    """One index entry: frame bytes [offset, offset + length) of the bundle, whose
    SHA-256 (hex) is `frame_sha256`."""

    offset: int
    length: int
    frame_sha256: str

    @property
    def end(self) -> int:
        return self.offset + self.length

    def pack(self) -> bytes:
        return ENTRY_STRUCT.pack(self.offset, self.length, bytes.fromhex(self.frame_sha256))


@dataclass(frozen=True, slots=True)
class Footer:
    """A parsed footer; `data_len` is where the index starts (the data part's length)."""

    frame_count: int
    index_crc32: int
    object_size: int

    @property
    def index_len(self) -> int:
        return ENTRY_LEN * self.frame_count

    @property
    def data_len(self) -> int:
        return self.object_size - FOOTER_LEN - self.index_len

    @property
    def index_range(self) -> tuple[int, int]:
        """(offset, length) of the index in the object: what a reader GETs next."""
        return self.data_len, self.index_len


def parse_footer(footer: bytes | memoryview, object_size: int) -> Footer:
    """Check the last `FOOTER_LEN` bytes of an object of `object_size` bytes: magic
    ``LMX1``, a frame count of at least 1 whose index fits in the object with at least
    `MIN_FRAME_LEN` bytes of frames per entry. O(1); raises BundleError ("bad footer")."""
    if len(footer) != FOOTER_LEN:
        raise BundleError(f"bad footer: {len(footer)} bytes, expected {FOOTER_LEN}")
    if object_size < FOOTER_LEN:
        raise BundleError(f"bad footer: object of {object_size} bytes < footer {FOOTER_LEN}")
    count, crc, magic = FOOTER_STRUCT.unpack(footer)
    if magic != BUNDLE_MAGIC:
        raise BundleError(f"bad footer: magic {magic!r} != {BUNDLE_MAGIC!r}: not a bundle")
    if count < 1:
        raise BundleError("bad footer: frame count 0 (a bundle holds at least one frame)")
    needed = FOOTER_LEN + (ENTRY_LEN + MIN_FRAME_LEN) * count
    if needed > object_size:
        raise BundleError(
            f"bad footer: frame count {count} needs at least {needed} bytes "
            f"(index {ENTRY_LEN} + frame {MIN_FRAME_LEN} per frame, footer {FOOTER_LEN}), "
            f"object has {object_size}"
        )
    return Footer(count, crc, object_size)


@dataclass(frozen=True, slots=True)
class BundleIndex:
    """A checked index: entries in order, tiling [0, data_len) exactly."""

    entries: tuple[BundleEntry, ...]
    data_len: int

    def __iter__(self) -> Iterator[BundleEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def entry_of(self, frame_sha256: str) -> BundleEntry | None:
        """The first entry of that hash (a bundle may hold one frame twice: a re-send that
        arrived twice in one bundle window), or None."""
        for entry in self.entries:
            if entry.frame_sha256 == frame_sha256:
                return entry
        return None

    def entry_at(self, offset: int, length: int) -> BundleEntry:
        """The entry at exactly (offset, length); raises BadRangeError otherwise."""
        lo, hi = 0, len(self.entries)
        while lo < hi:  # entries are sorted by offset (they tile)
            mid = (lo + hi) // 2
            if self.entries[mid].offset < offset:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.entries) and self.entries[lo].offset == offset:
            entry = self.entries[lo]
            if entry.length == length:
                return entry
            raise BadRangeError(
                f"range [{offset}, +{length}) starts at index entry {lo} whose length is "
                f"{entry.length}"
            )
        raise BadRangeError(f"range [{offset}, +{length}) is not at an index entry")


def parse_index(index: bytes | memoryview, footer: Footer) -> BundleIndex:
    """Check the index bytes (`footer.index_range` of the object) against the footer's
    CRC-32, then that the entries tile the data part exactly. Work is linear in the index
    (the footer bounded it by the object's size). Raises BundleError."""
    if len(index) != footer.index_len:
        raise BundleError(
            f"index is {len(index)} bytes, footer's frame count {footer.frame_count} "
            f"says {footer.index_len}"
        )
    crc = zlib.crc32(index)
    if crc != footer.index_crc32:
        raise BundleError(
            f"index crc32 mismatch: footer says 0x{footer.index_crc32:08x}, computed 0x{crc:08x}"
        )
    data_len = footer.data_len
    entries: list[BundleEntry] = []
    expected = 0
    for i, (offset, length, digest) in enumerate(ENTRY_STRUCT.iter_unpack(index)):
        where = f"index entry {i} [{offset}, +{length})"
        if offset > expected:
            raise BundleError(f"{where}: gap of {offset - expected} bytes after offset {expected}")
        if offset < expected:
            raise BundleError(f"{where}: overlaps the previous frame, which ends at {expected}")
        if length < MIN_FRAME_LEN:
            raise BundleError(f"{where}: length < a frame's minimum {MIN_FRAME_LEN}")
        if offset + length > data_len:
            raise BundleError(f"{where}: out of bounds, the data part is {data_len} bytes")
        entries.append(BundleEntry(offset, length, digest.hex()))
        expected = offset + length
    if expected != data_len:
        raise BundleError(
            f"index entries end at {expected}, the data part is {data_len} bytes: "
            f"gap of {data_len - expected} bytes before the index"
        )
    return BundleIndex(tuple(entries), data_len)


def pack_tail(entries: list[BundleEntry]) -> bytes:
    """The index and footer for `entries` (already tiling from 0)."""
    index = b"".join(entry.pack() for entry in entries)
    return index + FOOTER_STRUCT.pack(len(entries), zlib.crc32(index), BUNDLE_MAGIC)
