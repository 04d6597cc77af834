"""Bundles: many batch frames in one raw object (PROTOCOL §3.10). Pure code, no I/O.

A bundle is the frames as received, end to end from offset 0 (the *data part*), then an
index (per frame: offset u64, length u32, `frame_sha256`), then a footer (frame count
u32, CRC-32 of the index u32, magic ``LMX1``); the byte table and the index's decisions
are in ``_bundle_index.py``. It is stored at `protocol.keys.raw_bundle_key` of the
SHA-256 of all its bytes.

- `encode_bundle` builds one from frames that passed their checks (and returns each
  frame's index entry: what its manifest's ``raw_offset``/``raw_length`` say).
- `check_bundle` is the whole-object check (GC rule 7, SHA verification, a rollup task
  that reads a bundle whole): footer, index CRC, entries tiling the data part exactly, and
  the frames parsed *on their own* end to end from offset 0 (each §1 header says its
  length) equal to the entries in order, each passing its header checks (CRC-32
  included, `protocol.frame.decode_header`) and its `frame_sha256`. It never trusts the
  index to find a frame. Payloads are not decoded: a frame's payload rules are its
  reader's (`protocol.frame.decode_frame`), as for a frame blob.
- Readers with a record's range (§3.10 "Readers"): `check_range` bounds the range before
  anything is read; `check_ranged_frame` checks the range's bytes (CRC, hash, header
  identity = the record's); when they fail, `locate_frame` finds the frame of that hash in
  the bundle's index (`parse_footer`, `parse_index` on the object's tail), else
  `BadRangeError` (the ``bad-range`` problem). `read_frame` does it all on a whole bundle.

Every failure raises `BundleError` (a ValueError) naming the part and the problem; the
range readers raise its subclass `BadRangeError`. Work is linear in the input and
allocation bounded by it: every count and length is checked against the object's size
before it is used, and loops run per frame (at most one per 100 bytes), never per byte.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from protocol import keys
from protocol._bundle_index import BUNDLE_MAGIC as BUNDLE_MAGIC
from protocol._bundle_index import ENTRY_LEN as ENTRY_LEN
from protocol._bundle_index import FOOTER_LEN as FOOTER_LEN
from protocol._bundle_index import MIN_FRAME_LEN, U32_MAX, pack_tail
from protocol._bundle_index import BadRangeError as BadRangeError
from protocol._bundle_index import BundleEntry as BundleEntry
from protocol._bundle_index import BundleError as BundleError
from protocol._bundle_index import BundleIndex as BundleIndex
from protocol._bundle_index import Footer as Footer
from protocol._bundle_index import max_bundle_bytes as max_bundle_bytes
from protocol._bundle_index import parse_footer as parse_footer
from protocol._bundle_index import parse_index as parse_index
from protocol.frame import FRAME_MAGIC, FrameError, FrameHeader, decode_header

__all__ = [
    "BUNDLE_MAGIC",
    "ENTRY_LEN",
    "FOOTER_LEN",
    "BadRangeError",
    "BundleEntry",
    "BundleError",
    "BundleIndex",
    "BundledFrame",
    "CheckedBundle",
    "EncodedBundle",
    "Footer",
    "check_bundle",
    "check_range",
    "check_ranged_frame",
    "encode_bundle",
    "locate_frame",
    "max_bundle_bytes",
    "parse_footer",
    "parse_index",
    "read_frame",
    "read_index",
]

# agent_id_len (u16 at 6) and payload_len (u32 at 44) of a §1 header: a frame's length.
_AGENT_ID_LEN = struct.Struct(">H")
_PAYLOAD_LEN = struct.Struct(">I")
_SHA_HEX = re.compile(r"[0-9a-f]{64}")


def _declared_len(data: bytes | memoryview, pos: int) -> int:
    """The length the §1 header at `pos` declares (56 + agent_id_len + payload_len);
    the caller made sure 56 bytes are there."""
    (agent_id_len,) = _AGENT_ID_LEN.unpack_from(data, pos + 6)
    (payload_len,) = _PAYLOAD_LEN.unpack_from(data, pos + 44)
    return MIN_FRAME_LEN + int(agent_id_len) + int(payload_len)


# --- writing ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EncodedBundle:
    """A bundle's bytes, its SHA-256 (hex) and its index entries in frame order."""

    data: bytes
    sha256: str
    entries: tuple[BundleEntry, ...]

    @property
    def key(self) -> str:
        return keys.raw_bundle_key(self.sha256)


def encode_bundle(
    frames: Sequence[bytes], frame_sha256s: Sequence[str] | None = None
) -> EncodedBundle:
    """The bundle of `frames`, in order. Frames are the caller's checked ones (the
    collector's, which passed `decode_header`); here each is only checked to be a §1
    frame by structure (magic, declared length = its length, at most u32), so the result
    tiles. `frame_sha256s`, when given, are their hashes as the caller computed them while
    receiving (trusted, as the manifest will carry them); else they are computed.

    A collector writes a single frame as a plain frame blob (§3.10); this function
    accepts one frame too (a valid bundle), but refuses none. Raises BundleError."""
    if not frames:
        raise BundleError("a bundle holds at least one frame")
    if frame_sha256s is not None and len(frame_sha256s) != len(frames):
        raise BundleError(f"{len(frame_sha256s)} hashes for {len(frames)} frames")
    entries: list[BundleEntry] = []
    offset = 0
    for i, frame in enumerate(frames):
        size = len(frame)
        if size < MIN_FRAME_LEN or frame[:4] != FRAME_MAGIC or _declared_len(frame, 0) != size:
            raise BundleError(f"frame {i} ({size} bytes) is not a §1 frame by its header")
        if size > U32_MAX:
            raise BundleError(f"frame {i} is {size} bytes, more than an index length (u32)")
        if frame_sha256s is None:
            sha = hashlib.sha256(frame).hexdigest()
        else:
            sha = frame_sha256s[i]
            if not _SHA_HEX.fullmatch(sha):
                raise BundleError(f"frame {i}: frame_sha256 {sha!r} is not 64 lowercase hex")
        entries.append(BundleEntry(offset, size, sha))
        offset += size
    data = b"".join([*frames, pack_tail(entries)])
    return EncodedBundle(data, hashlib.sha256(data).hexdigest(), tuple(entries))


# --- checking a whole bundle --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BundledFrame:
    """A frame of a checked bundle: where it is, its hash, its checked §1 header."""

    entry: BundleEntry
    header: FrameHeader

    @property
    def identity(self) -> keys.BatchIdentity:
        return self.header.identity


@dataclass(frozen=True, slots=True)
class CheckedBundle:
    """A bundle that passed `check_bundle`: its hash, size and frames in order."""

    sha256: str
    size: int
    frames: tuple[BundledFrame, ...]

    @property
    def key(self) -> str:
        return keys.raw_bundle_key(self.sha256)

    @property
    def data_len(self) -> int:
        return self.size - FOOTER_LEN - ENTRY_LEN * len(self.frames)

    def frame_bytes(self, data: bytes, i: int) -> memoryview:
        """Frame i's bytes in `data` (the bundle that was checked), without a copy."""
        entry = self.frames[i].entry
        return memoryview(data)[entry.offset : entry.end]


def read_index(data: bytes | memoryview) -> BundleIndex:
    """The checked index of a whole bundle in `data` (footer, index CRC, tiling); the
    frames are not read. Raises BundleError."""
    view = memoryview(data)
    if len(view) < FOOTER_LEN:
        raise BundleError(f"bad footer: object of {len(view)} bytes < footer {FOOTER_LEN}")
    footer = parse_footer(view[len(view) - FOOTER_LEN :], len(view))
    start, length = footer.index_range
    return parse_index(view[start : start + length], footer)


def check_bundle(data: bytes | memoryview, *, sha256: str | None = None) -> CheckedBundle:
    """Check a whole bundle by every §3.10 rule (this module's docstring); when `sha256`
    is given (the hash its key names), the bytes must hash to it first. Returns the
    frames with their checked headers, in order. Raises BundleError, and nothing else,
    for any invalid input."""
    view = memoryview(data)
    size = len(view)
    digest = hashlib.sha256(view).hexdigest()
    if sha256 is not None and digest != sha256:
        raise BundleError(f"bundle bytes hash to {digest}, its key names {sha256}")
    index = read_index(view)
    data_len = index.data_len
    frames: list[BundledFrame] = []
    pos = 0
    # The frames are parsed by their own headers, end to end from offset 0; the index
    # (already known to tile) is only compared with what they say.
    while pos < data_len:
        i = len(frames)
        if i >= len(index):
            raise BundleError(f"frame {i} at offset {pos}: past the index's {len(index)} entries")
        if data_len - pos < MIN_FRAME_LEN:
            raise BundleError(
                f"frame {i} at offset {pos}: {data_len - pos} bytes left in the data part, "
                f"less than a frame's {MIN_FRAME_LEN}"
            )
        magic = bytes(view[pos : pos + 4])
        if magic != FRAME_MAGIC:
            raise BundleError(
                f"frame {i} at offset {pos}: magic {magic!r} != {FRAME_MAGIC!r}: not a batch frame"
            )
        length = _declared_len(view, pos)
        if pos + length > data_len:
            raise BundleError(
                f"frame {i} at offset {pos}: its header says {length} bytes, past the end "
                f"of the data part ({data_len})"
            )
        entry = index.entries[i]
        if (entry.offset, entry.length) != (pos, length):
            raise BundleError(
                f"index disagrees with the frames: frame {i} is [{pos}, +{length}), "
                f"index entry {i} says [{entry.offset}, +{entry.length})"
            )
        frame = view[pos : pos + length]
        try:
            header = decode_header(frame)
        except FrameError as exc:
            raise BundleError(f"frame {i} at offset {pos}: {exc}") from None
        sha = hashlib.sha256(frame).hexdigest()
        if sha != entry.frame_sha256:
            raise BundleError(
                f"frame {i} at offset {pos}: frame_sha256 mismatch: index says "
                f"{entry.frame_sha256}, bytes hash to {sha}"
            )
        frames.append(BundledFrame(entry, header))
        pos += length
    if len(frames) != len(index):
        raise BundleError(f"{len(frames)} frames in the data part, {len(index)} index entries")
    return CheckedBundle(digest, size, tuple(frames))


# --- reading one frame by a record's range --------------------------------------------------


def check_range(
    raw_offset: int, raw_length: int, *, max_frame_bytes: int, object_size: int | None = None
) -> None:
    """Bound a record's range before reading it (§3.10 "Readers"): offset ≥ 0, a frame's
    length (56..`max_frame_bytes`), and, when the object's size is known (a listing, a
    HEAD), ending before its footer and index could start. Raises BadRangeError."""
    where = f"range [{raw_offset}, +{raw_length})"
    if raw_offset < 0:
        raise BadRangeError(f"{where}: negative offset")
    if not MIN_FRAME_LEN <= raw_length <= max_frame_bytes:
        raise BadRangeError(f"{where}: length not in {MIN_FRAME_LEN}..{max_frame_bytes}")
    if object_size is not None and raw_offset + raw_length + ENTRY_LEN + FOOTER_LEN > object_size:
        raise BadRangeError(f"{where}: out of bounds of an object of {object_size} bytes")


def check_ranged_frame(
    frame: bytes | memoryview, *, frame_sha256: str, identity: keys.BatchIdentity | None = None
) -> FrameHeader:
    """Check the bytes a record's range read: one §1 frame passing its header checks (CRC
    included), hashing to the record's `frame_sha256`, and, when given, whose header
    identity is the record's. Returns its header; raises BadRangeError."""
    try:
        header = decode_header(frame)
    except FrameError as exc:
        raise BadRangeError(f"ranged frame: {exc}") from None
    sha = hashlib.sha256(frame).hexdigest()
    if sha != frame_sha256:
        raise BadRangeError(f"ranged frame hashes to {sha}, the record names {frame_sha256}")
    if identity is not None:
        found = keys.BatchIdentity(
            header.agent_id, header.boot_id, header.seq_start, header.seq_end
        )
        if found != identity:
            raise BadRangeError(f"ranged frame is batch {found}, the record names {identity}")
    return header


def locate_frame(index: BundleIndex, frame_sha256: str) -> BundleEntry:
    """The index entry of `frame_sha256` (a reader's fallback when the record's range
    fails its checks), or BadRangeError when the bundle does not hold that frame."""
    entry = index.entry_of(frame_sha256)
    if entry is None:
        raise BadRangeError(f"the bundle's index has no frame {frame_sha256}")
    return entry


def read_frame(
    bundle: bytes | memoryview,
    raw_offset: int,
    raw_length: int,
    *,
    frame_sha256: str,
    max_frame_bytes: int,
    identity: keys.BatchIdentity | None = None,
) -> memoryview:
    """Frame bytes of a record's range in a whole bundle held in memory: the range
    bounded (`check_range`), checked against the bundle's index (footer and CRC; an
    entry at exactly that range, of that hash) and its bytes checked
    (`check_ranged_frame`). Returns a view of them; raises BadRangeError (the index or
    footer itself being bad included)."""
    view = memoryview(bundle)
    check_range(raw_offset, raw_length, max_frame_bytes=max_frame_bytes, object_size=len(view))
    try:
        index = read_index(view)
    except BadRangeError:
        raise
    except BundleError as exc:
        raise BadRangeError(f"bundle index: {exc}") from None
    entry = index.entry_at(raw_offset, raw_length)
    if entry.frame_sha256 != frame_sha256:
        raise BadRangeError(
            f"range [{raw_offset}, +{raw_length}) is the index's frame {entry.frame_sha256}, "
            f"the record names {frame_sha256}"
        )
    frame = view[raw_offset : raw_offset + raw_length]
    check_ranged_frame(frame, frame_sha256=frame_sha256, identity=identity)
    return frame
