"""A raw blob that already existed must survive GC: PROTOCOL §3.5, collector side.

A raw-blob create answered 412 (the blob was there, or our own earlier attempt landed)
is followed by `keep_existing_blob`:

- a GC mark for the hash → write the veto (a create answered 200 or 412: either way it
  exists), then re-read the mark: still ``marked`` → the GC's last veto check, which
  follows its If-Match to ``deleting``, will see the veto; ``deleting`` (or unreadable:
  the safe side) → wait until the mark is gone;
- then, in every case (with no mark too: reading "no mark" proves nothing, a deletion
  may have just finished), prove the blob exists: a HEAD that finds it, or, when the
  HEAD finds nothing, creating it again with If-None-Match (a 412 proves it is there).

From then on a deletion needs a new mark and ``gc.mark_grace``, far longer than this
request. A duplicate therefore costs one upload of the frame (the 412), never two.

An identity conflict's *accepted* blob, which its quarantine record will name, goes
through the same steps (`keep_accepted_blob`, PROTOCOL §3.2) on every conflict, except
the last: this request does not hold the accepted bytes, so a HEAD that finds nothing
means raw retention deleted the blob, and the record says so
(``accepted_blob_present: false``).

Every create here (veto, blob) goes through `BudgetedRequest.call`, which checks the
request's deadline immediately before sending: a wait for a deletion that eats the
budget ends the request (503) with nothing more sent.
"""

from __future__ import annotations

import structlog

from protocol import keys, records
from store.errors import ConditionConflict, NotFound, Unavailable

from .store_calls import BudgetedRequest, Created

log = structlog.get_logger(__name__)


async def keep_existing_blob(
    request: BudgetedRequest,
    *,
    frame: bytes,
    sha: str,
    collector_id: str,
    key: str | None = None,
) -> bool:
    """Make sure the raw object of ``sha`` survives GC: the frame blob, or with ``key`` the
    bundle of that hash whose bytes are ``frame`` (PROTOCOL §3.10: the collector side
    always works on the raw object a record names, never on a bundled frame's hash).
    True when it had to be created again (the caller indexes it as a new raw object).
    Raises `BudgetExhausted`."""
    key = key or keys.raw_blob_key(sha)
    await hold_off_deletion(request, sha=sha, collector_id=collector_id, key=key)
    if await blob_present(request, sha, key=key):
        return False
    op = "put_raw_blob" if key == keys.raw_blob_key(sha) else "put_raw_bundle"
    created = await request.create_idempotent(op, key, frame)
    if created is Created.EXISTED:
        return False
    log.warning("raw_blob_recreated", raw_key=key)
    return True


async def keep_accepted_blob(request: BudgetedRequest, *, sha: str, collector_id: str) -> bool:
    """The collector side of PROTOCOL §3.5 for the *accepted* blob of an identity
    conflict, which the quarantine record will name (and so keep alive, §3.5 rule 7):
    hold off a deletion (`hold_off_deletion`), then HEAD the blob. True when it is there:
    no deletion can then start before a new mark and ``gc.mark_grace``, longer than this
    request. False when it is gone: raw retention deleted it (only raw retention deletes
    a blob an accepted manifest names), and this request does not hold its bytes to
    create it again; the record says ``accepted_blob_present: false``. Raises
    `BudgetExhausted`."""
    await hold_off_deletion(request, sha=sha, collector_id=collector_id)
    present = await blob_present(request, sha)
    if not present:
        log.warning("accepted_blob_gone", frame_sha256=sha)
    return present


async def hold_off_deletion(
    request: BudgetedRequest, *, sha: str, collector_id: str, key: str | None = None
) -> None:
    """Read the mark of ``sha`` (the raw object ``key``, the frame blob by default: the
    veto records it, PROTOCOL §3.10): ``marked`` → write the veto (read back: a create
    answered 412 proves it is there), then read the mark again; ``deleting`` (first or
    second read) → wait until the mark is gone. When this returns, no deletion of the
    blob is in flight, and none can start before a new mark and its grace: the blob is
    present or absent *for good* from here on, which the caller proves with a HEAD
    (`blob_present`; reading "no mark" alone proves nothing: a deletion may have just
    finished). Raises `BudgetExhausted`."""
    mark_key = keys.gc_mark_key(sha)
    if await _read_mark(request, mark_key) is None:
        return
    veto = records.GcVeto(
        frame_sha256=sha,
        vetoed_at_unix_ns=request.clock.now_ns(),
        collector_id=collector_id,
        raw_blob_key=key or keys.raw_blob_key(sha),
    )
    await request.create_idempotent("put_gc_veto", keys.gc_veto_key(sha), veto.to_json())
    mark = await _read_mark(request, mark_key)
    if mark is not None and mark.state != "marked":
        log.warning("gc_deletion_in_progress", frame_sha256=sha)
        delays = request.delays()
        while await _read_mark(request, mark_key) is not None:
            await request.pause(delays)


async def blob_present(request: BudgetedRequest, sha: str, *, key: str | None = None) -> bool:
    """A HEAD of the frame blob of ``sha`` (or of the raw object ``key`` of that hash):
    True when found, False on a 404. Raises `BudgetExhausted`."""
    key = key or keys.raw_blob_key(sha)
    delays = request.delays()
    while True:
        try:
            await request.call("head_raw_blob", key, lambda: request.store.head(key))
            return True
        except NotFound:
            return False
        except (Unavailable, ConditionConflict):
            await request.pause(delays)  # safe to repeat: a read


async def _read_mark(request: BudgetedRequest, mark_key: str) -> records.GcMark | None:
    delays = request.delays()
    while True:
        try:
            body, _etag = await request.call(
                "get_gc_mark", mark_key, lambda: request.store.get(mark_key)
            )
            return records.GcMark.from_json(body)
        except NotFound:
            return None
        except (Unavailable, ConditionConflict):
            pass  # safe to repeat: a read
        except records.RecordError:
            # An unreadable mark is treated as "deletion may be under way": the safe side.
            return records.GcMark(
                frame_sha256="0" * 64,
                raw_blob_key="?",
                marked_at_unix_ns=0,
                gc_run_id="?",
                state="deleting",
            )
        await request.pause(delays)
