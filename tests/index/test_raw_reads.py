"""`index.raw_reads` (PROTOCOL §3.10 "Readers"): a record's range used when its bytes are
its frame, the bundle's index as the fallback, ``bad-range`` otherwise, lengths bounded
before any read; the planner's whole-or-ranges decision and its coalescing."""

from __future__ import annotations

import hashlib
import uuid

import pyarrow as pa
import pytest

from index.raw_reads import (
    BadRange,
    RawRef,
    frame_in_span,
    plan_reads,
    read_frame,
    read_frame_sync,
)
from protocol import keys
from protocol.bundle import encode_bundle
from protocol.frame_encode import encode_frame, points_table
from store.counting import CountingStore
from store.errors import NotFound
from store.memory import MemoryStore

BOOT = uuid.UUID("5f0c6a2e-0000-4000-8000-0000000000b0")
MAX_FRAME = 1 << 20


def _frame(seq: int, rows: int = 3) -> bytes:
    table = points_table(
        [1_000 + i for i in range(rows)],
        ["m"] * rows,
        [float(i) for i in range(rows)],
        [None] * rows,
    )
    return encode_frame(agent_id="agent-a", boot_id=BOOT, seq_start=seq, points=table)


def _identity(seq: int, rows: int = 3) -> keys.BatchIdentity:
    return keys.BatchIdentity("agent-a", BOOT, seq, seq + rows - 1)


async def _bundle(store: MemoryStore, count: int = 4) -> tuple[str, list[bytes], list[RawRef]]:
    frames = [_frame(10 * i) for i in range(count)]
    bundle = encode_bundle(frames)
    await store.put(bundle.key, bundle.data)
    refs = [
        RawRef(bundle.key, e.frame_sha256, _identity(10 * i), e.offset, e.length)
        for i, e in enumerate(bundle.entries)
    ]
    return bundle.key, frames, refs


async def test_a_good_range_is_one_ranged_get() -> None:
    store = CountingStore(MemoryStore())
    _key, frames, refs = await _bundle(store.inner)  # type: ignore[arg-type]
    assert await read_frame(store, refs[2], max_frame_bytes=MAX_FRAME) == frames[2]
    assert store.requests == [("get", refs[2].raw_key)]


async def test_a_frame_blob_is_read_whole_as_before() -> None:
    store = CountingStore(MemoryStore())
    frame = _frame(0)
    sha = hashlib.sha256(frame).hexdigest()
    await store.inner.put(keys.raw_blob_key(sha), frame)
    ref = RawRef(keys.raw_blob_key(sha), sha, _identity(0))
    assert await read_frame(store, ref, max_frame_bytes=MAX_FRAME) == frame
    assert store.requests == [("get", keys.raw_blob_key(sha))]
    with pytest.raises(NotFound):
        await read_frame(store, RawRef(keys.raw_blob_key("0" * 64), "0" * 64), max_frame_bytes=9)


async def test_a_wrong_range_falls_back_to_the_index_entry_of_its_hash() -> None:
    store = CountingStore(MemoryStore())
    _key, frames, refs = await _bundle(store.inner)  # type: ignore[arg-type]
    wrong = RawRef(refs[1].raw_key, refs[1].frame_sha256, refs[1].identity, refs[2].raw_offset,
                   refs[2].raw_length)  # fmt: skip
    assert await read_frame(store, wrong, max_frame_bytes=MAX_FRAME) == frames[1]
    # The range, a HEAD, the tail (footer + index in one), the entry's range.
    assert [m for m, _k in store.requests] == ["get", "head", "get", "get"]


async def test_a_hash_the_bundle_does_not_hold_is_a_bad_range() -> None:
    store = MemoryStore()
    _key, _frames, refs = await _bundle(store)
    other = _frame(99)
    absent = RawRef(refs[0].raw_key, hashlib.sha256(other).hexdigest(), _identity(99),
                    refs[0].raw_offset, refs[0].raw_length)  # fmt: skip
    result = await read_frame(store, absent, max_frame_bytes=MAX_FRAME)
    assert isinstance(result, BadRange) and result.kind == "bad-range"
    assert "has no frame" in result.detail


async def test_an_identity_other_than_the_records_is_a_bad_range() -> None:
    store = MemoryStore()
    _key, _frames, refs = await _bundle(store)
    lying = RawRef(refs[0].raw_key, refs[0].frame_sha256, _identity(500), refs[0].raw_offset,
                   refs[0].raw_length)  # fmt: skip
    result = await read_frame(store, lying, max_frame_bytes=MAX_FRAME)
    assert isinstance(result, BadRange) and "the record names" in result.detail


async def test_a_length_over_max_frame_bytes_is_refused_before_any_read() -> None:
    store = CountingStore(MemoryStore())
    _key, _frames, refs = await _bundle(store.inner)  # type: ignore[arg-type]
    ref = refs[0]
    assert ref.raw_length is not None
    result = await read_frame(store, ref, max_frame_bytes=ref.raw_length - 1)
    assert isinstance(result, BadRange) and "length" in result.detail
    assert store.requests == []


async def test_the_blocking_reader_reads_as_the_async_one() -> None:
    store = MemoryStore()
    _key, frames, refs = await _bundle(store)

    class Source:
        def get(self, key: str) -> bytes:
            return store._objects[key].body

        def get_range(self, key: str, offset: int, length: int) -> bytes:
            return store._objects[key].body[offset : offset + length]

        def size(self, key: str) -> int:
            return len(store._objects[key].body)

    wrong = RawRef(refs[3].raw_key, refs[3].frame_sha256, refs[3].identity, 0, refs[0].raw_length)
    assert read_frame_sync(Source(), wrong, max_frame_bytes=MAX_FRAME) == frames[3]
    body = store._objects[refs[0].raw_key].body
    assert frame_in_span(refs[1], 0, body) == frames[1]
    assert frame_in_span(wrong, 0, body) is None  # the caller falls back to the index


def test_plan_reads_a_bundle_whole_when_its_frames_cover_half_of_it() -> None:
    # Bundle b: 10 frames of 100 bytes (object ~1,452 bytes); 8 wanted -> whole. Bundle c:
    # 2 of 10 wanted, adjacent -> one ranged GET. A frame blob: whole.
    keys_ = ["b"] * 8 + ["c", "c", "blob"]
    offsets = [i * 100 for i in range(8)] + [300, 400, None]
    lengths = [100] * 10 + [None]
    sizes = [1452] * 10 + [None]
    plan = plan_reads(pa.array(keys_), pa.array(offsets, pa.int64()),
                      pa.array(lengths, pa.int64()), pa.array(sizes, pa.int64()))  # fmt: skip
    reads = {(plan.keys[i], int(plan.offsets[i]), int(plan.lengths[i])) for i in range(len(plan))}
    assert reads == {("b", -1, -1), ("blob", -1, -1), ("c", 300, 200)}
    served = plan.records_of()
    assert sorted(len(r) for r in served) == [1, 2, 8]
    assert plan.keys[int(plan.read_of[9])] == "c" and plan.read_of[8] == plan.read_of[9]


def test_plan_coalesces_near_ranges_and_splits_far_ones() -> None:
    offsets = [0, 150, 5_000, 5_100, 50_000]
    plan = plan_reads(pa.array(["b"] * 5), pa.array(offsets, pa.int64()),
                      pa.array([100] * 5, pa.int64()), None, gap_bytes=1_000)  # fmt: skip
    spans = sorted((int(plan.offsets[i]), int(plan.lengths[i])) for i in range(len(plan)))
    assert spans == [(0, 250), (5_000, 200), (50_000, 100)]
    capped = plan_reads(pa.array(["b"] * 4), pa.array([0, 100, 200, 300], pa.int64()),
                        pa.array([100] * 4, pa.int64()), None, max_span_bytes=250)  # fmt: skip
    assert sorted(int(x) for x in capped.offsets) == [0, 200]
    # Ranges of two bundles never share a GET, even when they would be near.
    two = plan_reads(pa.array(["a", "b"]), pa.array([0, 100], pa.int64()),
                     pa.array([100, 100], pa.int64()))  # fmt: skip
    assert sorted(two.keys) == ["a", "b"] and len(two) == 2


async def test_a_range_into_an_object_too_small_for_a_footer_is_a_bad_range() -> None:
    store = MemoryStore()
    frame = _frame(0)
    sha = hashlib.sha256(frame).hexdigest()
    await store.put(keys.raw_bundle_key("ab" * 32), b"tiny")
    ref = RawRef(keys.raw_bundle_key("ab" * 32), sha, _identity(0), 0, len(frame))
    result = await read_frame(store, ref, max_frame_bytes=MAX_FRAME)
    assert isinstance(result, BadRange) and "footer" in result.detail
