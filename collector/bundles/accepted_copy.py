"""The accepted frame of a conflict, when it lives in a bundle (PROTOCOL §3.10 "Records").

A quarantine record names frame blobs only. When the accepted manifest names a bundle
and a range, `copy_accepted_frame` first makes the accepted frame's own frame blob:

1. read the record's range (`index.raw_reads.read_frame`: ``raw_length`` bounded by
   ``max_frame_bytes`` before anything is read, one ranged GET whose bytes must be one §1
   frame with its CRC, the record's ``frame_sha256`` and the record's identity; only when
   they fail, the bundle's index entry of that hash). A 404 on the bundle (raw retention
   deleted it) → ``accepted_blob_present: false``. Bytes that fail their checks → the
   ``bad-range`` problem (logged ``accepted_frame_bad_range``: the reconciler's readers
   find and record it on their own read of that manifest) and
   ``accepted_blob_present: false``;
2. create the frame blob with If-None-Match under the §3.5 collector side of *that frame
   blob* (as step 1 does for a submitted frame: created → its ``blob`` row; already there
   → mark, veto, wait out a deletion, HEAD, create again), so it cannot be deleted before
   the record that names it exists. The copy takes no mark or veto on the bundle: the
   record names only the copy.

Requests: 1 ranged GET (a failed range: + 1 HEAD + 1-2 GETs of the bundle's tail + 1),
then as step 1: 1 PUT (+ the collector side's GETs and HEAD on a 412).
"""

from __future__ import annotations

import structlog

from index.log_writer import IndexLogWriter
from index.raw_reads import BadRange, RawRef, read_frame
from index.rows import blob_row
from protocol import keys, records
from store.errors import ConditionConflict, NotFound, OutcomeUnknown, Unavailable

from ..blob_survival import keep_existing_blob
from ..store_calls import BudgetedRequest, Created

log = structlog.get_logger(__name__)


async def copy_accepted_frame(
    request: BudgetedRequest,
    accepted: records.AcceptedManifest,
    *,
    collector_id: str,
    index_log: IndexLogWriter,
    max_frame_bytes: int,
) -> bool:
    """Make the frame blob of a bundled accepted frame (module docstring). True when it
    is there (``accepted_blob_present``). Raises `BudgetExhausted`."""
    assert accepted.raw_offset is not None and accepted.raw_length is not None
    sha = accepted.frame_sha256
    ref = RawRef.of_manifest(accepted)
    frame = await _read(request, ref, max_frame_bytes)
    if frame is None:
        log.warning("accepted_bundle_gone", raw_key=ref.raw_key, frame_sha256=sha)
        return False
    if isinstance(frame, BadRange):
        log.error(
            "accepted_frame_bad_range",
            problem=frame.kind,
            raw_key=frame.raw_key,
            frame_sha256=sha,
            detail=frame.detail,
            manifest_key=accepted.manifest_key,
        )
        return False
    created = await request.create_idempotent("put_raw_blob", keys.raw_blob_key(sha), frame)
    if created is not Created.EXISTED:  # ours, or maybe ours: index it (idempotent)
        index_log.append(blob_row(sha, request.clock.now_ns()))
    if created is not Created.YES:
        recreated = await keep_existing_blob(
            request, frame=frame, sha=sha, collector_id=collector_id
        )
        if recreated:
            index_log.append(blob_row(sha, request.clock.now_ns()))
    return True


async def _read(
    request: BudgetedRequest, ref: RawRef, max_frame_bytes: int
) -> bytes | BadRange | None:
    """The frame the record names, or None when its bundle is gone. Bounded by the
    request's budget; repeating is safe: reads."""
    delays = request.delays()
    while True:
        try:
            return await request.call(
                "get_raw_range",
                ref.raw_key,
                lambda: read_frame(request.store, ref, max_frame_bytes=max_frame_bytes),
            )
        except NotFound:
            return None
        except (Unavailable, ConditionConflict, OutcomeUnknown):
            await request.pause(delays)
