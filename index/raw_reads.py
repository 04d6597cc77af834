"""Reading the frame a record names (PROTOCOL §3.10 "Readers"): the one function every
reader of raw bytes uses, and the planner of a batch of such reads.

A record (manifest, log or catalog row) names its raw object by ``raw_blob_key`` and,
when that object is a bundle, the frame's range in it (``raw_offset``/``raw_length``).
`read_frame` (async, any `store.base.ObjectStore`) and `read_frame_sync` (a blocking
`SyncRawSource`: Spark executors) read it:

- **no range** (a frame blob, every record before bundles): the object whole, one GET,
  exactly as before; its checks stay the caller's (CRC, hash, identity, as today).
- **a range**: ``raw_length <= max_frame_bytes`` (and a frame's least length) is checked
  before anything is read (else `BadRange`, no request); then one ranged GET, used when its
  bytes are one §1 frame passing its CRC, hashing to the record's ``frame_sha256`` and
  whose header identity is the record's. Only otherwise the bundle's tail is read (a HEAD
  for its size, one ranged GET of the last `TAIL_READ_BYTES`, a second only when the
  index is longer) and the entry of that ``frame_sha256`` is read and checked the same
  way. No such entry, a bad footer or index, or bytes failing their checks: `BadRange`,
  the ``bad-range`` problem (the batch is not included, its hour not sealed, a live answer
  partial: each caller maps it). A missing object raises as a GET does (`NotFound`,
  ``FileNotFoundError``): the caller's ``missing-blob`` as today.

Requests: a frame blob 1 GET; a good range 1 ranged GET; a range that fails 1 + 1 HEAD +
1-2 + 1 (rare: a record that disagrees with its bundle).

`plan_reads` (column-wise, numpy over Arrow columns, no Python object per record) groups
records by raw object and decides per bundle: read it whole when the records' frames
cover at least half of it (`WHOLE_FRACTION`), else ranged GETs of the records' frames,
adjacent and near ones (gaps up to `COALESCE_GAP_BYTES`) merged into one. A bundle's
size is the caller's hint (``object_bytes``: the rollup planner's lower bound from every
catalog row naming the bundle); without one, ranges are read. `frame_in_span` takes a
record's frame out of what such a read returned, checked as above; when it fails the
caller falls back to `read_frame`/`read_frame_sync` (the index path).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from protocol import keys
from protocol.bundle import (
    FOOTER_LEN,
    BadRangeError,
    BundleError,
    check_range,
    check_ranged_frame,
    locate_frame,
    parse_footer,
    parse_index,
)
from protocol.records import AcceptedManifest
from store.base import ObjectStore

TAIL_READ_BYTES = 64 * 1024
"""The bundle tail read at once when a range fails: the footer and an index of up to
~1,480 frames (44 bytes each), so one GET for the default ``bundle_max_frames`` (1,000)."""
MAX_INDEX_BYTES = 44 * 1_000_000
"""The longest index a reader fetches (a million frames): a bound on a hostile footer."""
WHOLE_FRACTION = 0.5
"""A bundle is read whole when the wanted frames are at least this share of its bytes."""
COALESCE_GAP_BYTES = 1024 * 1024
"""Ranges of one bundle this close are read as one GET: the skipped bytes cost less
transfer time than another request's latency (S3: tens of ms, ~1 MiB at 50 MB/s)."""
MAX_SPAN_BYTES = 16 * 1024 * 1024
"""The longest coalesced span (more than a default bundle: §3.10's 8 MiB + a frame)."""


@dataclass(frozen=True, slots=True)
class RawRef:
    """What a record says of its frame: the raw object, the frame's hash and identity,
    and its range in a bundle (``None``: a frame blob, read whole)."""

    raw_key: str
    frame_sha256: str
    identity: keys.BatchIdentity | None = None
    raw_offset: int | None = None
    raw_length: int | None = None

    @classmethod
    def of_manifest(cls, manifest: AcceptedManifest) -> RawRef:
        """What an accepted manifest names: its raw object and range (none: its frame
        blob), its frame's hash and identity."""
        return cls(
            manifest.raw_blob_key,
            manifest.frame_sha256,
            manifest.identity,
            manifest.raw_offset,
            manifest.raw_length,
        )

    @property
    def ranged(self) -> bool:
        return self.raw_offset is not None or self.raw_length is not None


@dataclass(frozen=True, slots=True)
class BadRange:
    """The ``bad-range`` problem of one record (PROTOCOL §3.10): its range does not hold
    its frame and its bundle's index has no good entry of that hash."""

    raw_key: str
    frame_sha256: str
    detail: str
    kind: str = "bad-range"


class SyncRawSource(Protocol):
    """Blocking reads of raw objects (the rollup's executors). A missing object raises
    (``FileNotFoundError``) from each."""

    def get(self, key: str) -> bytes: ...

    def get_range(self, key: str, offset: int, length: int) -> bytes: ...

    def size(self, key: str) -> int: ...


@dataclass(frozen=True, slots=True)
class _Get:
    key: str


@dataclass(frozen=True, slots=True)
class _Range:
    key: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class _Size:
    key: str


_Request = _Get | _Range | _Size
_Steps = Generator[_Request, bytes | int, bytes | BadRange]


def _checked(ref: RawRef, frame: bytes) -> str | None:
    """``None`` when ``frame`` is the record's frame (CRC, hash, identity), else why not."""
    try:
        check_ranged_frame(frame, frame_sha256=ref.frame_sha256, identity=ref.identity)
    except BadRangeError as exc:
        return str(exc)
    return None


def _steps(ref: RawRef, max_frame_bytes: int, first: bytes | None = None) -> _Steps:
    """The reads of `read_frame`, as requests sent to the driver (sync or async).
    ``first``: the range's bytes already read (a planned span), so not read again."""
    if not ref.ranged:
        body = yield _Get(ref.raw_key)
        assert isinstance(body, bytes)
        return body
    if ref.raw_offset is None or ref.raw_length is None:
        return BadRange(ref.raw_key, ref.frame_sha256, "a range needs both offset and length")
    try:
        check_range(ref.raw_offset, ref.raw_length, max_frame_bytes=max_frame_bytes)
    except BadRangeError as exc:
        return BadRange(ref.raw_key, ref.frame_sha256, str(exc))
    if first is None:
        got = yield _Range(ref.raw_key, ref.raw_offset, ref.raw_length)
        assert isinstance(got, bytes)
        first = got
    why = _checked(ref, first) if len(first) == ref.raw_length else "short read"
    if why is None:
        return first
    return (yield from _by_index(ref, max_frame_bytes, why))


def _by_index(ref: RawRef, max_frame_bytes: int, why: str) -> _Steps:
    """The fallback: the bundle's footer and index, then the entry of the record's hash."""
    size = yield _Size(ref.raw_key)
    assert isinstance(size, int)
    where = f"range [{ref.raw_offset}, +{ref.raw_length}) failed ({why})"
    try:
        if size < FOOTER_LEN:
            raise BundleError(f"bad footer: object of {size} bytes")
        tail_len = min(size, TAIL_READ_BYTES)
        tail = yield _Range(ref.raw_key, size - tail_len, tail_len)
        assert isinstance(tail, bytes)
        if len(tail) != tail_len:
            raise BundleError(f"tail of {len(tail)} bytes, the object has {size}")
        footer = parse_footer(tail[-FOOTER_LEN:], size)
        start, length = footer.index_range
        if length > MAX_INDEX_BYTES:
            raise BundleError(f"index of {length} bytes > {MAX_INDEX_BYTES}")
        if start >= size - tail_len:
            at = start - (size - tail_len)
            index_bytes = tail[at : at + length]
        else:
            got = yield _Range(ref.raw_key, start, length)
            assert isinstance(got, bytes)
            index_bytes = got
        entry = locate_frame(parse_index(index_bytes, footer), ref.frame_sha256)
        check_range(entry.offset, entry.length, max_frame_bytes=max_frame_bytes)
        frame = yield _Range(ref.raw_key, entry.offset, entry.length)
        assert isinstance(frame, bytes)
        check_ranged_frame(frame, frame_sha256=ref.frame_sha256, identity=ref.identity)
    except BundleError as exc:  # BadRangeError included
        return BadRange(ref.raw_key, ref.frame_sha256, f"{where}; bundle index: {exc}")
    return frame


async def read_frame(
    store: ObjectStore, ref: RawRef, *, max_frame_bytes: int, first: bytes | None = None
) -> bytes | BadRange:
    """The frame ``ref`` names, read from ``store`` (module docstring): a frame blob's
    bytes unchecked, a range's checked, or `BadRange`. `NotFound` when the object is
    absent. ``first``: the range's bytes already read by a planned span."""
    steps = _steps(ref, max_frame_bytes, first)
    answer: bytes | int | None = None
    try:
        while True:
            request = steps.send(answer) if answer is not None else next(steps)
            if isinstance(request, _Get):
                answer = (await store.get(request.key))[0]
            elif isinstance(request, _Range):
                answer = await store.get_range(request.key, request.offset, request.length)
            else:
                answer = (await store.head(request.key)).size
    except StopIteration as done:
        result: bytes | BadRange = done.value
        return result


def read_frame_sync(
    source: SyncRawSource, ref: RawRef, *, max_frame_bytes: int, first: bytes | None = None
) -> bytes | BadRange:
    """`read_frame` over a blocking source (the rollup's executors)."""
    steps = _steps(ref, max_frame_bytes, first)
    answer: bytes | int | None = None
    try:
        while True:
            request = steps.send(answer) if answer is not None else next(steps)
            if isinstance(request, _Get):
                answer = source.get(request.key)
            elif isinstance(request, _Range):
                answer = source.get_range(request.key, request.offset, request.length)
            else:
                answer = source.size(request.key)
    except StopIteration as done:
        result: bytes | BadRange = done.value
        return result


def frame_in_span(ref: RawRef, span_offset: int, span: bytes | memoryview) -> bytes | None:
    """``ref``'s range cut out of ``span`` (bytes of its object from ``span_offset``: a
    whole object is offset 0) when those bytes are its frame (CRC, hash, identity), else
    ``None`` (the caller falls back to the index: `read_frame`'s ``first``)."""
    if ref.raw_offset is None or ref.raw_length is None:
        return None
    start = ref.raw_offset - span_offset
    if start < 0 or start + ref.raw_length > len(span):
        return None
    frame = bytes(span[start : start + ref.raw_length])
    return frame if _checked(ref, frame) is None else None


# --- planning the reads of many records -------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """The GETs that serve a set of records, and which GET serves each record.

    Per GET ``i``: ``keys[i]``, ``offsets[i]``/``lengths[i]`` (both -1: the whole
    object). Per record ``r`` (in the input order): ``read_of[r]`` is the GET holding its
    bytes. GETs are grouped by raw object in key order, ranges in offset order."""

    keys: list[str]
    offsets: np.ndarray
    lengths: np.ndarray
    read_of: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    def whole(self, i: int) -> bool:
        return bool(self.offsets[i] < 0)

    def records_of(self) -> list[np.ndarray]:
        """Per GET, the records it serves (input positions, ascending)."""
        order = np.argsort(self.read_of, kind="stable")
        bounds = np.searchsorted(self.read_of[order], np.arange(1, len(self.keys)))
        return list(np.split(order, bounds))


def plan_reads(
    raw_key: pa.Array | pa.ChunkedArray,
    raw_offset: pa.Array | pa.ChunkedArray,
    raw_length: pa.Array | pa.ChunkedArray,
    object_bytes: pa.Array | pa.ChunkedArray | None = None,
    *,
    whole_fraction: float = WHOLE_FRACTION,
    gap_bytes: int = COALESCE_GAP_BYTES,
    max_span_bytes: int = MAX_SPAN_BYTES,
) -> ReadPlan:
    """The GETs for records given as columns (module docstring). A record without a range
    is its object read whole; records of one object share its GETs. ``object_bytes``: per
    record, its object's size where known (null: unknown, so ranges). Ranges failing their
    bounds are still planned; `read_frame`'s checks refuse them (``bad-range``)."""
    n = len(raw_key)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return ReadPlan([], empty, empty, empty)
    encoded = pa.chunked_array([raw_key]).combine_chunks().dictionary_encode()
    names = encoded.dictionary.to_pylist()
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    offset = _ints(raw_offset, -1)
    length = _ints(raw_length, -1)
    size = _ints(object_bytes, -1) if object_bytes is not None else np.full(n, -1, np.int64)
    ranged = (offset >= 0) & (length > 0)
    # Per object: the bytes its records want, and whether it is read whole.
    wanted = np.bincount(codes, weights=np.where(ranged, length, 0), minlength=len(names))
    known = np.full(len(names), -1, np.int64)
    np.maximum.at(known, codes, size)
    unranged = np.bincount(codes, weights=~ranged, minlength=len(names)) > 0
    whole_obj = unranged | ((known > 0) & (wanted >= whole_fraction * known))
    whole = whole_obj[codes]
    # Ranged records, by (object, offset): a new GET where the object changes, the gap
    # from the span so far exceeds gap_bytes, or the span would grow past max_span_bytes.
    order = np.lexsort((offset, codes))
    order = order[~whole[order]]
    read_of = np.full(n, -1, np.int64)
    keys_out: list[str] = []
    offs: list[int] = []
    lens: list[int] = []
    whole_codes = np.flatnonzero(whole_obj)
    for code in whole_codes.tolist():
        keys_out.append(names[code])
        offs.append(-1)
        lens.append(-1)
    slot = np.full(len(names), -1, np.int64)
    slot[whole_codes] = np.arange(len(whole_codes))
    read_of[whole] = slot[codes[whole]]
    if len(order):
        o, ln, c = offset[order], length[order], codes[order]
        starts = _span_starts(o, ln, c, gap_bytes, max_span_bytes)
        first = np.flatnonzero(starts)
        ends = np.maximum.reduceat(o + ln, first)
        keys_out += [names[code] for code in c[first].tolist()]
        offs += o[first].tolist()
        lens += (ends - o[first]).tolist()
        read_of[order] = len(whole_codes) + np.cumsum(starts) - 1
    return ReadPlan(keys_out, np.array(offs, np.int64), np.array(lens, np.int64), read_of)


def _ints(column: pa.Array | pa.ChunkedArray, null: int) -> np.ndarray:
    array = pa.chunked_array([column]).combine_chunks().cast(pa.int64()).fill_null(null)
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.int64)


def _span_starts(
    offset: np.ndarray, length: np.ndarray, code: np.ndarray, gap: int, max_span: int
) -> np.ndarray:
    """Per ranged record (sorted by object, then offset): whether it starts a new GET —
    its object changes, or it begins more than ``gap`` after every earlier range of its
    object ends; a span longer than ``max_span`` is then cut where it would pass it (a
    loop only over such spans' records: rare, bundles are shorter than ``max_span``)."""
    n = len(offset)
    # Ends ranked by object first, so the running maximum never carries across objects.
    rank = code.astype(np.int64) << 42
    reach = np.maximum.accumulate(rank + offset + length)
    starts = np.ones(n, dtype=bool)
    starts[1:] = (code[1:] != code[:-1]) | (rank[1:] + offset[1:] - reach[:-1] > gap)
    first = np.flatnonzero(starts)
    too_long = np.maximum.reduceat(offset + length, first) - offset[first] > max_span
    for begin in first[too_long].tolist():
        end = int(first[first > begin][0]) if (first > begin).any() else n
        span_lo = int(offset[begin])
        for i in range(begin + 1, end):
            if int(offset[i] + length[i]) - span_lo > max_span:
                starts[i] = True
                span_lo = int(offset[i])
    return starts
