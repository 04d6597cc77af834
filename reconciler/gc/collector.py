"""`GarbageCollector`: one GC run, its four steps in order (see `reconciler.gc`).

1. settle stale ``deleting`` (and unreadable) marks (`reconciler.gc.settle`);
2. mark the candidates (`reconciler.gc.candidates`);
3. prove and delete (`reconciler.gc.deletion`), then write the run's log file and only
   then remove the marks of the blobs it records (`reconciler.gc.log`);
4. clear the vetoes that have done their work (`reconciler.gc.vetoes`).

The catalog-created entries no rule reads any more are not the GC's to trim: the lease
holder's housekeeping does, whether or not the GC is enabled (`reconciler.daemon`,
`reconciler.gc.catalog_since.trim_unneeded_entries`).

A store failure on one candidate or mark (503, a lost answer, a 409) skips that one and
the run goes on: skipping never deletes, and the next run starts over from the store.
After ``max_item_errors`` such failures the store counts as unavailable and the error is
raised. The run record (``reconciler/v1/gc-runs/``) says what the run did.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Awaitable, Callable

import structlog

from protocol import keys, records
from protocol.clock import Clock
from reconciler.gc.bounded import for_each_bounded
from reconciler.gc.candidates import (
    LatestAudit,
    OrphanFiles,
    Suspects,
    list_marks_and_vetoes,
    mark_candidates,
)
from reconciler.gc.delete import LeaseTerm
from reconciler.gc.deletion import Candidate, Deleter
from reconciler.gc.log import RunLog
from reconciler.gc.policy import GcOutcome, GcPolicy, GcRefused
from reconciler.gc.problems import GcProblems
from reconciler.gc.proof import TargetedProof
from reconciler.gc.settle import finish_stale_deletions, remove_logged_marks
from reconciler.gc.vetoes import clear_settled_vetoes
from reconciler.gc.work import Fence, GcWork
from store.base import ObjectStore
from store.errors import StoreError
from store.time import store_clock

log = structlog.get_logger("reconciler.gc")
KEEP_GC_RUNS = 50


class GarbageCollector:
    def __init__(
        self,
        *,
        store: ObjectStore,
        clock: Clock,
        policy: GcPolicy,
        latest_audit: LatestAudit,
        fence: Fence,
        lease: Callable[[], LeaseTerm],
        delete_store: ObjectStore | None = None,
        observe: Callable[[str, int], None] | None = None,
        deletion_blocker: Callable[[], Awaitable[str | None]] | None = None,
        store_now_ns: Callable[[], int] | None = None,
        suspects: Suspects | None = None,
        recently_referenced: Callable[[str], bool] | None = None,
        audits_marked: set[str] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """``lease`` describes the lease ``fence`` guards (`reconciler.gc.delete`);
        ``store_now_ns`` is store time for the signed DELETE's deadline (default: the
        store clock's estimate). ``latest_audit`` is the newest completed listing audit
        (`reconciler.gc.run.latest_listing_audit`): the GC never starts one.

        ``delete_store`` is the GC role's store (``store.gc_credentials_profile``): every
        delete the GC makes goes through it — blobs, marks, vetoes — and nothing else
        does (``deploy/bucket-policy/reconciler-gc-policy.json`` grants exactly those;
        the everyday role may delete none of them). Without it, ``store`` deletes."""
        # Horizon, grace and settle times compare LastModified and the marks' times with
        # "now" in store time (PROTOCOL §3.8), never the local clock alone.
        clock = store_clock(store, clock)
        self._work = GcWork(
            store=store,
            delete_store=delete_store or store,
            clock=clock,
            policy=policy,
            fence=fence,
            lease=lease,
            observe=observe or (lambda _event, _count: None),
            problems=GcProblems(store, clock.now_ns, fence),
        )
        self._latest_audit = latest_audit
        self._store_now_ns = store_now_ns or clock.now_ns
        self._deletion_blocker = deletion_blocker
        self._suspects = suspects or (lambda _before_ns: [])
        self._recently_referenced = recently_referenced or (lambda _sha: False)
        self._audits_marked = audits_marked if audits_marked is not None else set()
        self._rng = rng or random.Random()

    @property
    def policy(self) -> GcPolicy:
        return self._work.policy

    async def run(self, *, dry_run: bool = False) -> GcOutcome:
        """One GC run. Raises `GcRefused` when the deletion guard trips."""
        work = self._work
        work.item_errors = 0
        started = work.clock.now_ns()
        run = records.GcRunRecord(
            run_id=uuid.uuid4().hex[:16], started_at_unix_ns=started, dry_run=dry_run
        )
        outcome = GcOutcome(run)
        run_key = keys.gc_run_key(started, run.run_id)
        run_log = RunLog()
        if not dry_run:
            await work.fence()
            await work.store.put(run_key, run.to_json())
            await finish_stale_deletions(work, run_log)
        await list_marks_and_vetoes(work)
        audit = await self._latest_audit()
        orphans = OrphanFiles(work)
        counts = await mark_candidates(
            work,
            suspects=self._suspects,
            audit=audit,
            orphans=orphans,
            audits_marked=self._audits_marked,
            run_id=run.run_id,
            dry_run=dry_run,
        )
        try:
            await self._delete_proven(audit, orphans, run_log, dry_run, outcome)
        except GcRefused as exc:
            outcome.record = run.model_copy(
                update={
                    **counts,
                    "skipped_on_error": work.item_errors,
                    "refused": str(exc),
                    "completed_at_unix_ns": work.clock.now_ns(),
                }
            )
            if not dry_run:
                await self._write_log(run_log, started)
                await work.store.put(run_key, outcome.record.to_json())
            raise
        if not dry_run:
            await self._write_log(run_log, started)
            await clear_settled_vetoes(work, audit)
        outcome.record = run.model_copy(
            update={
                **counts,
                "deleted": len(outcome.deleted),
                "deleted_raw_retention": outcome.deleted_raw_retention,
                "skipped_on_error": work.item_errors,
                "stalled": outcome.stalled,
                "completed_at_unix_ns": work.clock.now_ns(),
            }
        )
        if not dry_run:
            await work.store.put(run_key, outcome.record.to_json())
            await work.per_item("trim", keys.RECONCILER_GC_RUNS_PREFIX, self._trim_runs())
        log.info(
            "gc_run_finished",
            **outcome.record.model_dump(exclude={"schema_"}),
            would_delete=len(outcome.would_delete),
        )
        return outcome

    async def settle_stale_deletions(self) -> None:
        """Only step 1: what a disabled GC still does, so that no ``deleting`` mark keeps
        collectors waiting (PROTOCOL §3.5)."""
        self._work.item_errors = 0
        await self._work.fence()
        run_log = RunLog()
        await finish_stale_deletions(self._work, run_log)
        await self._write_log(run_log, self._work.clock.now_ns())

    async def _write_log(self, run_log: RunLog, started: int) -> None:
        """The run's log file, then the marks it frees. If the file cannot be written the
        marks stay ``deleting``: a later run finds their blobs gone and logs them."""
        work = self._work
        try:
            await work.fence()
            await run_log.write(
                work.store,
                run_started_at_unix_ns=started,
                epoch=work.lease().epoch,
                clock=work.clock,
                rng=self._rng,
            )
        except StoreError as exc:
            log.warning("gc_log_write_failed", deletions=len(run_log.entries), error=str(exc))
            return
        await remove_logged_marks(work, run_log)

    async def _delete_proven(
        self,
        audit: records.AuditRecord | None,
        orphans: OrphanFiles,
        run_log: RunLog,
        dry_run: bool,
        outcome: GcOutcome,
    ) -> None:
        work = self._work
        now = work.clock.now_ns()
        eligible: list[tuple[str, records.GcMark]] = []

        async def read_one(key: str) -> None:
            mark, _etag = await work.read_mark(key)
            if mark is not None and mark.state == "marked" and _names_its_object(key, mark):
                if mark.marked_at_unix_ns + work.policy.grace_ns <= now:  # rule 3
                    eligible.append((key, mark))

        await for_each_bounded(
            sorted(keys.gc_mark_key(sha) for sha in work.marks),
            lambda key: work.per_item("read-mark", key, read_one(key)),
            work.policy.concurrency,
        )
        eligible.sort(key=lambda pair: pair[0])  # in key order, however the reads finished
        if not eligible:
            return
        if work.clock.skewed:  # rule 6: a skewed reconciler signs nothing; try next run
            log.error("gc_clock_skewed", skew_s=work.clock.skew_s, eligible_marks=len(eligible))
            return
        if self._deletion_blocker is not None and (reason := await self._deletion_blocker()):
            log.error("gc_deletions_blocked", reason=reason, eligible_marks=len(eligible))
            raise GcRefused(reason)
        if audit is None or audit.catalog_created_from is None:
            log.info("gc_waits_for_an_audit", eligible_marks=len(eligible))
            return  # rule 5: the GC never starts an audit; the next scheduled one comes
        deleter = Deleter(
            work,
            audit=audit,
            proof=TargetedProof(
                work.store,
                work.problems,
                work.policy.max_frame_bytes,
                max_bundle_bytes=work.policy.max_bundle_bytes,
                concurrency=work.policy.concurrency,
            ),
            run_log=run_log,
            recently_referenced=self._recently_referenced,
            store_now_ns=self._store_now_ns,
            dry_run=dry_run,
        )
        chosen = await deleter.select(eligible, await orphans.of(audit))
        proven = await deleter.prove(chosen) if chosen else []
        if proven is None:
            outcome.stalled = deleter.stalled
            return  # the catalog read cannot be trusted: delete nothing this run
        outcome.would_delete = [c.mark.frame_sha256 for c in proven]
        await deleter.guard(proven)
        if dry_run:
            return
        done = 0

        async def delete(candidate: Candidate) -> None:
            nonlocal done
            if await work.per_item("delete", candidate.mark_key, deleter.delete_one(candidate)):
                outcome.deleted.append(candidate.mark.frame_sha256)
                outcome.deleted_raw_retention += candidate.by_retention
            done += 1
            if done % 1000 == 0:
                log.info("gc_deleting", done=done, of=len(proven), deleted=len(outcome.deleted))

        await for_each_bounded(proven, delete, work.policy.concurrency)
        outcome.deleted.sort()
        work.observe("deletions", len(outcome.deleted))

    async def _trim_runs(self) -> None:
        """Keep the newest `KEEP_GC_RUNS` run records, so finding the last one (status)
        stays one short listing however long the store has run."""
        store = self._work.store
        run_keys = [info.key async for info in store.list(keys.RECONCILER_GC_RUNS_PREFIX)]
        for key in run_keys[: max(0, len(run_keys) - KEEP_GC_RUNS)]:
            await store.delete(key)


def _names_its_object(mark_key: str, mark: records.GcMark) -> bool:
    """A mark acts only on the raw object (frame blob or bundle) of the hash its key names
    (marks record the object's key, PROTOCOL §3.10); any other is left alone, logged."""
    try:
        _kind, sha = keys.parse_raw_object_key(mark.raw_blob_key)
    except keys.KeyFormatError:
        sha = ""
    if mark_key == keys.gc_mark_key(sha) and sha == mark.frame_sha256:
        return True
    log.error("gc_mark_names_another_object", key=mark_key, raw_blob_key=mark.raw_blob_key)
    return False
