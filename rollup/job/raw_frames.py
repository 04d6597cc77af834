"""Stage 1's raw reads: the frames of one task's work items, planned by raw object
(PROTOCOL §3.10 "Readers").

`task_frames` plans the task's items with `index.raw_reads.plan_reads` (column-wise):
a frame blob is read whole (one GET, as before); a bundle whole when the task's frames
cover at least half of it, else as coalesced ranged GETs. Each ranged item's frame is cut
out of what was read and checked (CRC, ``frame_sha256``, header identity); one that
fails goes through the bundle's index (`index.raw_reads.read_frame_sync`), and one the
index cannot serve is a `BadRange`, which stage 1 records as a ``bad-range`` problem:
the batch is not included and its hour is not sealed, as for a ``missing-blob``. A range
longer than a frame may be is refused before anything is read. One object's bytes are
held at a time.

The bound is the job's ``max_raw_bytes`` (the largest decoded payload it accepts, 64
MiB): a rollup does not know its collectors' ``ingest.max_frame_bytes``, and a frame is
never longer than its payload's bound plus its header (zstd adds a few bytes at worst),
so it is the job's own memory bound per frame, as for a frame blob.

Tasks are assigned by source (`rollup.job.stages.assign_tasks`: series locality), not by
bundle; each task decides for the part of a bundle it holds, as §3.10 says ("its frames
in the task").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from index.raw_reads import (
    BadRange,
    RawRef,
    SyncRawSource,
    frame_in_span,
    plan_reads,
    read_frame_sync,
)
from index.rows import FRAME_LENGTHS
from protocol import keys
from rollup.table.storage import StoreAccess, object_size, read_object, read_object_range

FrameRead = bytes | BadRange | None
"""An item's frame: its bytes (a frame blob's unchecked, as before; a range's checked),
a `BadRange`, or ``None`` when its raw object does not exist (``missing-blob``)."""


@dataclass(frozen=True, slots=True)
class StoreRawSource:
    """`index.raw_reads.SyncRawSource` over the executor's store access."""

    access: StoreAccess

    def get(self, key: str) -> bytes:
        return read_object(self.access, key)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        return read_object_range(self.access, key, offset, length)

    def size(self, key: str) -> int:
        return object_size(self.access, key)


def ref_of(item: dict[str, Any]) -> RawRef:
    """What a work item says of its frame. The identity is the manifest_id's: stage 1
    checks the decoded frame's identity against it again (`check_frame`)."""
    return RawRef(
        item["raw_blob_key"],
        item["frame_sha256"],
        keys.parse_manifest_id(item["manifest_id"]).identity,
        item.get("raw_offset"),
        item.get("raw_length"),
    )


def task_frames(
    source: SyncRawSource, items: pa.Table, *, max_frame_bytes: int
) -> Iterator[tuple[dict[str, Any], FrameRead]]:
    """Each item of ``items`` (`rollup.job.tasks.WORK_SCHEMA`) with its frame read from
    ``source`` (`StoreRawSource` on an executor; module docstring), by raw object."""
    offset, length = items.column("raw_offset"), items.column("raw_length")
    ranged = pc.or_(pc.is_valid(offset), pc.is_valid(length))
    in_bounds = pc.and_(
        pc.and_(pc.greater_equal(offset, 0), pc.greater_equal(length, FRAME_LENGTHS[0])),
        pc.less_equal(length, max_frame_bytes),
    )
    refused = pc.fill_null(pc.and_(ranged, pc.invert(pc.fill_null(in_bounds, False))), False)
    for item in items.filter(refused).to_pylist():  # bounded before any read: rare
        yield item, read_frame_sync(source, ref_of(item), max_frame_bytes=max_frame_bytes)
    kept = items.filter(pc.invert(refused))
    plan = plan_reads(
        kept.column("raw_blob_key"),
        kept.column("raw_offset"),
        kept.column("raw_length"),
        kept.column("raw_object_bytes"),
    )
    for i, records in enumerate(plan.records_of()):
        rows = kept.take(pa.array(records)).to_pylist()
        key = plan.keys[i]
        try:
            if plan.whole(i):
                body, base = source.get(key), 0
            else:
                start = int(plan.offsets[i])
                body, base = source.get_range(key, start, int(plan.lengths[i])), start
        except FileNotFoundError:
            for item in rows:
                yield item, None
            continue
        for item in rows:
            yield item, _frame_of(source, item, body, base, max_frame_bytes)
        del body


def _frame_of(
    source: SyncRawSource, item: dict[str, Any], body: bytes, base: int, max_frame_bytes: int
) -> FrameRead:
    ref = ref_of(item)
    if not ref.ranged:
        return body  # a frame blob, read whole: checked by stage 1 as before
    frame = frame_in_span(ref, base, body)
    if frame is not None:
        return frame
    assert ref.raw_offset is not None and ref.raw_length is not None
    start = ref.raw_offset - base
    first = body[max(0, start) : max(0, start + ref.raw_length)]
    try:
        return read_frame_sync(source, ref, max_frame_bytes=max_frame_bytes, first=first)
    except FileNotFoundError:
        return None  # deleted since it was read
