"""Step 1 of a GC run: settle the ``deleting`` marks left behind (PROTOCOL §3.5).

A mark left ``deleting`` by a crashed run, a DELETE whose answer was lost, or a stalled
former leader is resolved once the lease it recorded has expired and ``settle_s`` has
passed (`reconciler.gc.delete.resolvable_at_ns`): a blob found gone is logged (the run's
`RunLog`, before the mark goes), and the mark is removed; the blob is never deleted again
here (a collector may have re-created it after the first delete). A disabled GC still
does this.

An unreadable mark (PROTOCOL says nothing of one) makes collectors wait as on a deletion
under way, so it must not stay. It counts as ``deleting`` under an unknown lease: an
``unreadable-gc-mark`` problem is recorded, and once ``settle_s`` has passed since the
later of its first sighting and the start of our term, it is settled the same way (If
its ETag is unchanged); the blob, if still an orphan, is marked afresh from a later
audit. Why that wait is enough: a DELETE sent under an older lease lands before that
lease's expiry (signed, rule 6), which was before our term began (an unsigned one of an
older version: the conservative reading of `resolvable_at_ns` for marks without lease
fields). One of ours is sent only after its ``deleting`` mark was read back well-formed,
within a run, and the run whose settle pass first saw the mark unreadable started after
every earlier run of ours ended: anything in flight then lands within ``settle_s``.
"""

from __future__ import annotations

from protocol import keys, records
from reconciler.gc.bounded import for_each_bounded
from reconciler.gc.delete import resolvable_at_ns
from reconciler.gc.log import RunLog
from reconciler.gc.policy import NS
from reconciler.gc.work import GcWork, log

UNREADABLE_DETAIL = (
    "the GC mark does not parse; collectors wait on it as on a deletion under way. "
    "The GC removes it once the settle time has passed (no action needed unless it stays)"
)


async def finish_stale_deletions(work: GcWork, run_log: RunLog) -> None:
    now = work.clock.now_ns()
    await for_each_bounded(
        work.store.list(keys.GC_MARKS_PREFIX),
        lambda info: work.per_item("settle", info.key, _settle_one(work, run_log, info.key, now)),
        work.policy.concurrency,
    )


async def _settle_one(work: GcWork, run_log: RunLog, mark_key: str, now: int) -> None:
    mark, etag = await work.read_mark(mark_key)
    if etag is None:
        return
    started = work.lease().started_at_unix_ns
    unreadable = mark is None
    if mark is None:
        first_seen = await work.problems.record("unreadable-gc-mark", mark_key, UNREADABLE_DETAIL)
        if max(first_seen, started) + int(work.policy.settle_s * NS) > now:
            return
        sha = keys.parse_gc_mark_key(mark_key)
        # Which raw object it marked is unreadable too: a frame blob, or a bundle of that
        # hash (PROTOCOL §3.10) when one exists (one HEAD more, for unreadable marks only).
        raw_key = keys.raw_bundle_key(sha)
        if not await work.exists(raw_key):
            raw_key = keys.raw_blob_key(sha)
        mark = records.GcMark(
            frame_sha256=sha,
            raw_blob_key=raw_key,
            marked_at_unix_ns=0,
            gc_run_id="unreadable-mark",
            state="deleting",
        )
        log.warning("gc_unreadable_mark_settled", key=mark_key)
    elif mark.state != "deleting" or (
        resolvable_at_ns(mark, settle_s=work.policy.settle_s, term_started_at_unix_ns=started) > now
    ):
        return  # not deleting, or its DELETE may still land (`reconciler.gc.delete`)
    if not await work.exists(mark.raw_blob_key):
        run_log.add(
            records.GcLogEntry(
                frame_sha256=mark.frame_sha256,
                raw_blob_key=mark.raw_blob_key,
                blob_last_modified_ns=0,
                marked_at_unix_ns=mark.marked_at_unix_ns,
                audit_started_at_unix_ns=0,
                deleted_at_unix_ns=now,
                gc_run_id=mark.gc_run_id,
                reason=mark.reason,
            ),
            mark_key,
            etag,
            unreadable=unreadable,
        )
        return  # the mark goes once the run's log holds the deletion
    await work.fence()
    await work.delete_mark_if_unchanged(mark_key, etag)
    if unreadable:
        await work.problems.resolve("unreadable-gc-mark", mark_key)


async def remove_logged_marks(work: GcWork, run_log: RunLog) -> None:
    """After the run's log file exists: remove the marks of the blobs it records."""
    for mark_key, etag in run_log.marks:
        await work.per_item("unmark", mark_key, _unmark(work, run_log, mark_key, etag))


async def _unmark(work: GcWork, run_log: RunLog, mark_key: str, etag: str | None) -> None:
    await work.fence()
    if etag is None:
        await work.delete_store.delete(mark_key)
    else:
        await work.delete_mark_if_unchanged(mark_key, etag)
    if mark_key in run_log.unreadable_marks:
        await work.problems.resolve("unreadable-gc-mark", mark_key)
