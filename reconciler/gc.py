"""Garbage collection of orphan raw blobs: mark, wait, veto, prove, delete (PROTOCOL §3.5).

Only raw blobs are ever deleted; manifests and quarantine records never are. The proof
comes from the index (PROTOCOL §3.7): a completed *catalog* audit lists ``raw-blobs/v1/``
and joins it with every reference in the catalog; its orphan file
(``reconciler/v1/audit-orphans/…``) names each blob that was present in that listing,
older than the retry horizon in store time, and referenced by no catalog row — which,
since the audit completed, means by no record that existed when it started. With raw
retention (PROTOCOL §4.1, `reconciler.raw_retention`) the audit also leaves out the
accepted rows of retired hours, and flags a blob only they referenced (``raw_retention``):
such a blob is marked with that ``reason`` and goes through every step below, except that
the deletion guard does not count it (bulk deletions are what retention is for). The
reconciler's entry point is `reconciler.gc_run`. One run:

1. **Finish stale deletions.** A mark left in ``deleting`` by a crashed run (or a delete
   whose answer was lost, or a stalled former leader) is resolved once the lease it
   recorded has expired and ``settle_s`` has passed (`reconciler.gc_delete`): if the blob
   is gone the deletion is logged; either way the mark is removed. The blob is never
   deleted again here: a collector may have re-created it after the first delete. A
   mark that does not parse counts as ``deleting`` under an unknown lease (collectors
   wait on it): it is reported (``unreadable-gc-mark``) and removed the same way once
   ``settle_s`` has passed since its first sighting and our term's start
   (`_settle_unreadable`). A disabled GC still does this (`settle_stale_deletions`).
2. **Mark.** Candidates: the steady pass's `OrphanSuspects` (``blob`` log rows no record
   row named) older than the horizon, and the orphans of the latest completed catalog
   audit (so orphans whose log row was lost are found too). A candidate with no mark and
   no veto (both known from one listing of ``gc/v1/marks/`` and ``gc/v1/vetoes/``) gets a
   mark (If-None-Match, rule 3). No per-blob HEAD or LIST: a run's requests grow with the
   candidates and the marks, never with the store.
3. **Prove and delete.** A mark older than ``mark_grace`` is eligible once a completed
   catalog audit *started after* ``marked_at + mark_grace`` (rule 5); the run performs
   that audit itself when none exists. The mark is proven when that audit's orphan file
   names the blob (rules 1 and 2) and no veto exists (rule 4); otherwise it is withdrawn
   (the blob is referenced, gone, or young). The deletion guard refuses the whole run when
   it would delete more than ``max_delete_fraction`` of the blobs that audit listed. For
   each blob: the mark goes ``marked`` → ``deleting`` with If-Match (recording our lease;
   an unknown outcome is read back), then the veto and the references the steady pass has
   seen since are checked once more, then the blob is deleted by one signed request that
   cannot land after that lease (PROTOCOL §3.5 rule 6, `reconciler.gc_delete`), the
   deletion logged under ``gc/v1/log/``, and the mark removed. A request discarded unsent
   or refused by the store deleted nothing: its mark is removed at once.
4. **Vetoes.** A veto older than the grace is removed with its mark once a completed
   catalog audit started after the veto plus the grace: that audit decides afresh whether
   the blob is an orphan (referenced, gone or young: never marked again; still orphaned:
   re-marked from scratch).

A store failure on one candidate or mark (503, a lost answer, a 409) skips that one and
the run goes on: skipping never deletes, and the next run starts over from the store.
Each step leaves a state a later run resolves (no mark, a ``marked`` mark, or a
``deleting`` one for the stale-deletion pass). After ``max_item_errors`` such failures in
one run the store is treated as unavailable and the error is raised.

Why ``deleting``: a collector that finds a mark writes its veto, then re-reads the mark
(`collector.accept`). If it still reads ``marked``, the veto was written before this
run's last veto check (which follows the If-Match to ``deleting``), so the blob is kept.
If it reads ``deleting`` or nothing, the collector waits for the mark to go and re-creates
the blob. This closes a race PROTOCOL §3.5 leaves open (see `protocol.records.GcMark`).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from protocol import keys, records
from protocol.clock import Clock
from reconciler.gc_delete import DeleteOutcome, LeaseTerm, delete_within_lease, resolvable_at_ns
from store.base import ObjectInfo, ObjectStore
from store.errors import (
    ConditionConflict,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    StoreError,
    Unavailable,
)
from store.time import store_clock

from .bounded import for_each_bounded
from .gc_problems import GcProblems
from .orphans import decode_orphans

log = structlog.get_logger("reconciler.gc")
T = TypeVar("T")
NS = 1_000_000_000
KEEP_GC_RUNS = 50


@dataclass(frozen=True, slots=True)
class GcPolicy:
    retry_horizon_s: float
    mark_grace_s: float
    max_delete_fraction: float = 0.1
    settle_s: float = 120.0
    max_item_errors: int = 100
    delete_expiry_s: int = 5
    """Lifetime of each signed blob DELETE (`reconciler.gc_delete`)."""
    max_clock_skew_s: float = 0.0
    """Bound on the distance between the deleter's clock and store time."""
    max_network_delay_s: float = 0.0
    """The longest a request may take to reach the store (rule 6: the signed DELETE's
    deadline plus this must fall before the recorded lease expiry)."""
    concurrency: int = 1
    """Marks, mark reads and deletions in flight at once (``gc.concurrency``): each
    blob's steps are independent of every other blob's, and `for_each_bounded` cancels
    the rest on an error that ends the run (every step leaves a state a later run
    resolves, see the module docstring)."""

    def __post_init__(self) -> None:
        if not 0 < self.max_delete_fraction <= 1:
            raise ValueError(
                f"max_delete_fraction must be in (0, 1], got {self.max_delete_fraction}"
            )
        if self.retry_horizon_s <= 0 or self.mark_grace_s <= 0 or self.settle_s < 0:
            raise ValueError("retry_horizon_s and mark_grace_s must be > 0, settle_s >= 0")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.max_item_errors < 0:
            raise ValueError(f"max_item_errors must be >= 0, got {self.max_item_errors}")
        if self.delete_expiry_s < 1 or self.max_clock_skew_s < 0:
            raise ValueError("delete_expiry_s must be >= 1 and max_clock_skew_s >= 0")
        if self.max_network_delay_s < 0:
            raise ValueError("max_network_delay_s must be >= 0")
        settle = self.delete_expiry_s + self.max_clock_skew_s + self.max_network_delay_s
        if self.settle_s < settle:
            raise ValueError(
                f"settle_s must cover delete_expiry_s + max_clock_skew_s + "
                f"max_network_delay_s = {settle:g}, got {self.settle_s:g}"
            )


class GcRefused(Exception):
    """The deletion guard refused the run; nothing was deleted. Investigate before retrying."""


@dataclass
class GcOutcome:
    record: records.GcRunRecord
    would_delete: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    deleted_raw_retention: int = 0


AuditRunner = Callable[[], Awaitable[records.AuditRecord]]
LatestAudit = Callable[[], Awaitable[records.AuditRecord | None]]
Fence = Callable[[], Awaitable[None]]
Suspects = Callable[[int], list[tuple[str, int]]]
"""Blob hashes (and creation times) a log says nobody referenced, created before the
given time, handed over once (`reconciler.steady.OrphanSuspects.take_older_than`)."""


@dataclass
class _Listed:
    """One listing each of the marks and the vetoes, taken at the start of a run."""

    marks: set[str] = field(default_factory=set)
    vetoes: set[str] = field(default_factory=set)


class GarbageCollector:
    def __init__(
        self,
        *,
        store: ObjectStore,
        clock: Clock,
        policy: GcPolicy,
        run_audit: AuditRunner,
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
    ) -> None:
        """``lease`` describes the lease ``fence`` guards (`reconciler.gc_delete`);
        ``store_now_ns`` is store time for the signed DELETE's deadline (default: the
        store clock's estimate; the check adds ``max_clock_skew_s``, more than the
        estimate's uncertainty, before it sends).

        ``delete_store`` is the GC role's store (``store.gc_credentials_profile``): every
        delete the GC makes goes through it — blobs, marks, vetoes — and nothing else
        does (``deploy/bucket-policy/reconciler-gc-policy.json`` grants exactly those;
        the everyday role may delete none of them). Without it, ``store`` deletes."""
        self._store = store
        self._delete_store = delete_store or store
        # Horizon, grace and settle times compare LastModified and the marks' times with
        # "now" in store time (PROTOCOL §3.8), never the local clock alone.
        self._clock = store_clock(store, clock)
        self._policy = policy
        self._run_audit = run_audit
        self._latest_audit = latest_audit
        self._fence = fence
        self._lease = lease
        self._store_now_ns = store_now_ns or self._clock.now_ns
        self._observe = observe or (lambda _event, _count: None)
        self._deletion_blocker = deletion_blocker
        self._suspects = suspects or (lambda _before_ns: [])
        self._recently_referenced = recently_referenced or (lambda _sha: False)
        self._audits_marked = audits_marked if audits_marked is not None else set()
        self._problems = GcProblems(store, self._clock.now_ns, fence)
        self._run_id = "unstarted"
        self._item_errors = 0
        self._listed = _Listed()
        self._orphans_of: dict[str, dict[str, tuple[int, int, bool]]] = {}

    async def _per_item(self, what: str, key: str, work: Awaitable[T]) -> T | None:
        """``work`` for one candidate or mark; on a store failure, skip it (``None``).

        Safe: every step leaves a state a later run resolves, and skipping deletes nothing."""
        try:
            return await work
        except (Unavailable, ConditionConflict) as exc:
            self._item_errors += 1
            log.warning("gc_item_skipped", step=what, key=key, error=str(exc))
            if self._item_errors > self._policy.max_item_errors:
                raise
            return None

    async def run(self, *, dry_run: bool = False) -> GcOutcome:
        """One GC run. Raises `GcRefused` when the deletion guard trips."""
        started = self._clock.now_ns()
        run = records.GcRunRecord(
            run_id=uuid.uuid4().hex[:16], started_at_unix_ns=started, dry_run=dry_run
        )
        outcome = GcOutcome(run)
        self._item_errors = 0
        run_key = keys.gc_run_key(started, run.run_id)
        if not dry_run:
            await self._fence()
            await self._store.put(run_key, run.to_json())
            await self._finish_stale_deletions()
        self._listed = await self._list_marks_and_vetoes()
        counts = await self._mark_candidates(dry_run)
        try:
            await self._delete_proven(dry_run, outcome)
        except GcRefused as exc:
            outcome.record = run.model_copy(
                update={
                    **counts,
                    "skipped_on_error": self._item_errors,
                    "refused": str(exc),
                    "completed_at_unix_ns": self._clock.now_ns(),
                }
            )
            if not dry_run:
                await self._store.put(run_key, outcome.record.to_json())
            raise
        if not dry_run:
            await self._clear_settled_vetoes()
        outcome.record = run.model_copy(
            update={
                **counts,
                "deleted": len(outcome.deleted),
                "deleted_raw_retention": outcome.deleted_raw_retention,
                "skipped_on_error": self._item_errors,
                "completed_at_unix_ns": self._clock.now_ns(),
            }
        )
        if not dry_run:
            await self._store.put(run_key, outcome.record.to_json())
            await self._per_item("trim", keys.RECONCILER_GC_RUNS_PREFIX, self._trim_runs())
        log.info(
            "gc_run_finished",
            **outcome.record.model_dump(exclude={"schema_"}),
            would_delete=len(outcome.would_delete),
        )
        return outcome

    async def _trim_runs(self) -> None:
        """Keep the newest `KEEP_GC_RUNS` run records, so finding the last one (status)
        stays one short listing however long the store has run."""
        run_keys = [info.key async for info in self._store.list(keys.RECONCILER_GC_RUNS_PREFIX)]
        for key in run_keys[: max(0, len(run_keys) - KEEP_GC_RUNS)]:
            await self._store.delete(key)

    # --- 1. stale deletions ------------------------------------------------------------------

    async def settle_stale_deletions(self) -> None:
        """Only step 1: what a disabled GC still does, so that no ``deleting`` mark keeps
        collectors waiting (PROTOCOL §3.5)."""
        self._item_errors = 0
        await self._fence()
        await self._finish_stale_deletions()

    async def _finish_stale_deletions(self) -> None:
        now = self._clock.now_ns()
        await for_each_bounded(
            self._store.list(keys.GC_MARKS_PREFIX),
            lambda info: self._per_item("settle", info.key, self._settle_one(info.key, now)),
            self._policy.concurrency,
        )

    async def _settle_one(self, mark_key: str, now: int) -> None:
        mark, etag = await self._read_mark(mark_key)
        if mark is None and etag is not None:
            await self._settle_unreadable(mark_key, etag, now)
            return
        if mark is None or mark.state != "deleting":
            return
        started = self._lease().started_at_unix_ns
        if (
            resolvable_at_ns(mark, settle_s=self._policy.settle_s, term_started_at_unix_ns=started)
            > now
        ):
            return  # its DELETE may still land: see reconciler.gc_delete
        if not await self._exists(mark.raw_blob_key):
            await self._log_deletion(mark, blob_last_modified_ns=0, audit_started=0)
        await self._fence()
        await self._delete_mark_if_unchanged(mark_key, etag)

    async def _settle_unreadable(self, mark_key: str, etag: str, now: int) -> None:
        """An unreadable mark (PROTOCOL §3.5 says nothing of one): collectors treat it as
        ``deleting`` and wait for it to go, so it must not stay. It is treated as a
        ``deleting`` mark whose lease is unknown: an ``unreadable-gc-mark`` problem is
        recorded, and once the settle time has passed since the later of its first sighting
        and the start of our lease term, the blob is checked (gone: the deletion is logged)
        and the mark removed, If its ETag is unchanged. The blob, if still there and still
        an orphan, is marked afresh from a later audit.

        Why that wait is enough: a DELETE sent under an older lease lands before that
        lease's expiry (signed, PROTOCOL §3.5 rule 6), which was before our term began (an
        unsigned one of an older version: the same conservative reading as a ``deleting``
        mark without lease fields, `reconciler.gc_delete`). One of ours is sent only after
        its ``deleting`` mark was read back well-formed, within a run, and the run whose
        settle pass first saw the mark unreadable started after every earlier run of ours
        ended: anything in flight then lands within ``settle_s`` of that sighting."""
        subject = mark_key
        first_seen = await self._problems.record(
            "unreadable-gc-mark",
            subject,
            "the GC mark does not parse; collectors wait on it as on a deletion under way. "
            "The GC removes it once the settle time has passed (no action needed)",
        )
        started = self._lease().started_at_unix_ns
        if max(first_seen, started) + int(self._policy.settle_s * NS) > now:
            return
        sha = keys.parse_gc_mark_key(mark_key)
        if not await self._exists(keys.raw_blob_key(sha)):
            unknown = records.GcMark(
                frame_sha256=sha,
                raw_blob_key=keys.raw_blob_key(sha),
                marked_at_unix_ns=0,
                gc_run_id="unreadable-mark",
                state="deleting",
            )
            await self._log_deletion(unknown, blob_last_modified_ns=0, audit_started=0)
        await self._fence()
        await self._delete_mark_if_unchanged(mark_key, etag)
        await self._problems.resolve("unreadable-gc-mark", subject)
        log.warning("gc_unreadable_mark_removed", key=mark_key)

    # --- 2. mark ------------------------------------------------------------------------------

    async def _list_marks_and_vetoes(self) -> _Listed:
        listed = _Listed()
        async for info in self._store.list(keys.GC_MARKS_PREFIX):
            listed.marks.add(info.key.removeprefix(keys.GC_MARKS_PREFIX).removesuffix(".json"))
        async for info in self._store.list(keys.GC_VETOES_PREFIX):
            listed.vetoes.add(info.key.removeprefix(keys.GC_VETOES_PREFIX).removesuffix(".json"))
        return listed

    async def _mark_candidates(self, dry_run: bool) -> dict[str, int]:
        horizon_ns = self._clock.now_ns() - int(self._policy.retry_horizon_s * NS)
        # A dry run leaves the suspects for the next real run (taking them hands them over).
        candidates: dict[str, records.GcReason] = (
            {} if dry_run else {sha: "orphan" for sha, _ in self._suspects(horizon_ns)}
        )
        audit = await self._latest_audit()
        if audit is not None and audit.audit_id not in self._audits_marked:
            for sha, (_size, _modified, by_retention) in (await self._orphans(audit)).items():
                candidates[sha] = "raw-retention" if by_retention else "orphan"
            if not dry_run:
                self._audits_marked.add(audit.audit_id)
        counts = {"candidates": len(candidates), "marked": 0, "vetoed": 0}
        to_mark: list[tuple[str, records.GcReason]] = []
        for sha, reason in sorted(candidates.items()):
            if sha in self._listed.vetoes:
                counts["vetoed"] += 1
            elif sha not in self._listed.marks and not dry_run:
                to_mark.append((sha, reason))
        await for_each_bounded(
            to_mark,
            lambda item: self._per_item("mark", item[0], self._mark(*item, counts)),
            self._policy.concurrency,
        )
        self._observe("candidates", counts["candidates"])
        self._observe("marks", counts["marked"])
        self._observe("vetoes", counts["vetoed"])
        return counts

    async def _mark(self, sha: str, reason: records.GcReason, counts: dict[str, int]) -> None:
        mark = records.GcMark(
            frame_sha256=sha,
            raw_blob_key=keys.raw_blob_key(sha),
            marked_at_unix_ns=self._clock.now_ns(),
            gc_run_id=self._run_id,
            reason=reason,
        )
        await self._fence()
        try:
            await self._store.put(keys.gc_mark_key(sha), mark.to_json(), if_none_match=True)
            counts["marked"] += 1
            self._listed.marks.add(sha)
        except PreconditionFailed:
            pass

    async def _orphans(self, audit: records.AuditRecord) -> dict[str, tuple[int, int, bool]]:
        """The audit's orphan file (read once per run and audit)."""
        key = keys.audit_orphans_key(audit.started_at_unix_ns, audit.audit_id)
        if key not in self._orphans_of:
            body, _etag = await self._store.get(key)
            self._orphans_of[key] = decode_orphans(body)
        return self._orphans_of[key]

    # --- 3. prove and delete -------------------------------------------------------------------

    async def _delete_proven(self, dry_run: bool, outcome: GcOutcome) -> None:
        now = self._clock.now_ns()
        grace_ns = int(self._policy.mark_grace_s * NS)
        eligible: list[tuple[str, records.GcMark]] = []

        async def read_one(info: ObjectInfo) -> None:
            read = await self._per_item("read-mark", info.key, self._read_mark(info.key))
            mark = read[0] if read is not None else None
            if (
                mark is not None
                and mark.state == "marked"
                and mark.marked_at_unix_ns + grace_ns <= now
            ):
                eligible.append((info.key, mark))

        await for_each_bounded(
            self._store.list(keys.GC_MARKS_PREFIX), read_one, self._policy.concurrency
        )
        eligible.sort(key=lambda pair: pair[0])  # in key order, however the reads finished
        if not eligible:
            return
        if self._clock.skewed:  # rule 6: a skewed reconciler signs nothing; try next run
            log.error("gc_clock_skewed", skew_s=self._clock.skew_s, eligible_marks=len(eligible))
            return
        if self._deletion_blocker is not None and (reason := await self._deletion_blocker()):
            log.error("gc_deletions_blocked", reason=reason, eligible_marks=len(eligible))
            raise GcRefused(reason)
        audit = await self._latest_audit()
        newest_needed = max(m.marked_at_unix_ns for _, m in eligible) + grace_ns
        if (audit is None or audit.started_at_unix_ns <= newest_needed) and not dry_run:
            log.info("gc_audit_needed", eligible_marks=len(eligible))
            audit = await self._run_audit()
        if audit is None or audit.status != "completed":
            return
        orphans = await self._orphans(audit)
        proven: list[tuple[str, records.GcMark, int, bool]] = []
        for mark_key, mark in eligible:
            if audit.started_at_unix_ns <= mark.marked_at_unix_ns + grace_ns:
                continue  # rule 5: the audit must have started after mark + grace
            found = orphans.get(mark.frame_sha256)
            if found is None or mark.frame_sha256 in self._listed.vetoes:
                # Referenced, gone, young (rules 1, 2) or vetoed (rule 4): withdraw.
                if not dry_run:
                    await self._per_item("withdraw", mark_key, self._withdraw(mark_key))
                continue
            proven.append((mark_key, mark, found[1], found[2]))
        outcome.would_delete = [m.frame_sha256 for _, m, _, _ in proven]
        # The guard is against a broken index taking live blobs for orphans; blobs raw
        # retention lets go of are expected in bulk, each proven by the audit against the
        # rollup ledger (`reconciler.raw_retention`), so they do not count against it.
        if orphans_proven := sum(not by_retention for *_, by_retention in proven):
            await self._guard(orphans_proven, audit.blobs_listed)
        if dry_run:
            return
        done = 0

        async def delete(item: tuple[str, records.GcMark, int, bool]) -> None:
            nonlocal done
            mark_key, mark, last_modified_ns, by_retention = item
            if await self._per_item(
                "delete",
                mark_key,
                self._delete_one(
                    mark_key, mark, last_modified_ns, audit.started_at_unix_ns, by_retention
                ),
            ):
                outcome.deleted.append(mark.frame_sha256)
                outcome.deleted_raw_retention += by_retention
            done += 1
            if done % 1000 == 0:
                log.info("gc_deleting", done=done, of=len(proven), deleted=len(outcome.deleted))

        await for_each_bounded(proven, delete, self._policy.concurrency)
        self._observe("deletions", len(outcome.deleted))

    async def _guard(self, planned: int, total: int) -> None:
        """Refuse deleting more than the allowed fraction of the blobs the audit listed."""
        if planned > self._policy.max_delete_fraction * total:
            detail = (
                f"would delete {planned} of {total} raw blobs, more than gc.max_delete_fraction = "
                f"{self._policy.max_delete_fraction}; nothing was deleted"
            )
            log.error("gc_deletion_guard", planned=planned, total=total)
            problem = records.ProblemRecord(
                kind="gc-guard",
                subject_key=keys.RAW_BLOBS_PREFIX,
                detail=detail,
                first_seen_unix_ns=self._clock.now_ns(),
                last_seen_unix_ns=self._clock.now_ns(),
            )
            await self._store.put(
                keys.problem_key("gc-guard", keys.RAW_BLOBS_PREFIX), problem.to_json()
            )
            self._observe("guard_refusals", 1)
            raise GcRefused(detail)

    async def _withdraw(self, mark_key: str) -> None:
        await self._fence()
        await self._delete_store.delete(mark_key)

    async def _delete_one(
        self,
        mark_key: str,
        mark: records.GcMark,
        last_modified_ns: int,
        audit_started: int,
        by_retention: bool,
    ) -> bool:
        await self._fence()
        current, etag = await self._read_mark(mark_key)
        if current is None or current.state != "marked" or etag is None:
            return False
        lease = self._lease()
        deleting = current.model_copy(
            update={
                "state": "deleting",
                "deleting_since_unix_ns": self._clock.now_ns(),
                "lease_epoch": lease.epoch,
                "lease_expires_at_unix_ns": lease.expires_at_unix_ns,
                # What the proving audit says now (a mark of either reason is proven afresh).
                "reason": "raw-retention" if by_retention else "orphan",
            }
        )
        deleting_etag = await self._write_deleting(mark_key, deleting, etag)
        if deleting_etag is None:
            return False  # changed under us, or unknown: the stale-deletion pass resolves it
        sha = mark.frame_sha256
        try:
            # The last checks come after "deleting" is visible: see the module docstring.
            if await self._exists(keys.gc_veto_key(sha)) or self._recently_referenced(sha):
                self._observe("vetoes", 1)
                await self._delete_store.delete(mark_key)
                return False
        except (Unavailable, ConditionConflict):
            # No DELETE was sent: take the mark back now rather than leave collectors
            # waiting until the lease it records has expired (the stale-deletion pass).
            await self._release_unsent(mark_key, deleting_etag)
            raise
        await self._fence()
        deleted = await delete_within_lease(
            self._delete_store,
            mark.raw_blob_key,
            expires_in_s=self._policy.delete_expiry_s,
            lease_expires_at_unix_ns=lease.expires_at_unix_ns,
            now_ns=self._store_now_ns,
            max_clock_skew_s=self._policy.max_clock_skew_s,
            max_network_delay_s=self._policy.max_network_delay_s,
            skewed=lambda: self._clock.skewed,
        )
        if deleted is DeleteOutcome.UNKNOWN:
            log.warning("gc_delete_unsettled", key=mark.raw_blob_key)
            return False  # the mark stays "deleting"; the stale-deletion pass settles it
        if deleted is not DeleteOutcome.DELETED:
            # Nothing was (or can be) applied: withdraw the mark so collectors stop waiting.
            log.warning("gc_delete_not_applied", key=mark.raw_blob_key, outcome=deleted.value)
            await self._fence()
            await self._delete_mark_if_unchanged(mark_key, deleting_etag)
            return False
        await self._log_deletion(
            deleting, blob_last_modified_ns=last_modified_ns, audit_started=audit_started
        )
        await self._delete_store.delete(mark_key)
        return True

    async def _release_unsent(self, mark_key: str, deleting_etag: str) -> None:
        """Remove our own ``deleting`` mark whose DELETE was never sent (best effort: a
        mark left behind is settled by the stale-deletion pass)."""
        try:
            await self._delete_mark_if_unchanged(mark_key, deleting_etag)
        except StoreError as exc:
            log.warning("gc_mark_release_failed", key=mark_key, error=str(exc))

    async def _write_deleting(
        self, mark_key: str, deleting: records.GcMark, etag: str
    ) -> str | None:
        """Swap the mark to ``deleting``; its new ETag, or None when it did not (or may
        not) land. An unknown outcome is read back before it counts (PROTOCOL §3.5)."""
        body = deleting.to_json()
        try:
            return await self._store.put(mark_key, body, if_match=etag)
        except PreconditionFailed:
            return None
        except OutcomeUnknown:
            try:
                stored, stored_etag = await self._store.get(mark_key)
            except NotFound:
                return None
            return stored_etag if stored == body else None

    # --- 4. vetoes that have done their work ---------------------------------------------

    async def _clear_settled_vetoes(self) -> None:
        """Remove each veto older than the grace, together with its mark, once a qualifying
        audit started after veto + grace (PROTOCOL §3.5). A veto protects a collector
        request that found the blob; after the grace that request has landed its manifest
        or never will, and that audit cataloged it: its orphan file decides afresh whether
        the blob is referenced, gone (never marked again) or still an orphan (marked from
        scratch)."""
        if not self._listed.vetoes:
            return  # the run's listing found none: nothing to read
        grace_ns = int(self._policy.mark_grace_s * NS)
        now = self._store_now_ns()
        audit = await self._latest_audit()
        audit_started = audit.started_at_unix_ns if audit is not None else None
        cleared = 0
        async for info in self._store.list(keys.GC_VETOES_PREFIX):
            if info.last_modified_ns + grace_ns > now:
                continue
            try:
                sha = keys.parse_gc_veto_key(info.key)
            except keys.KeyFormatError:
                log.warning("gc_veto_key_ignored", key=info.key)
                continue
            done = await self._per_item(
                "veto", info.key, self._clear_veto(sha, info, grace_ns, audit_started)
            )
            cleared += bool(done)
        if cleared:
            log.info("gc_vetoes_cleared", count=cleared)

    async def _clear_veto(
        self, sha: str, veto: ObjectInfo, grace_ns: int, audit_started: int | None
    ) -> bool:
        if audit_started is None or audit_started <= veto.last_modified_ns + grace_ns:
            return False  # the request it protects may not be cataloged yet
        mark_key = keys.gc_mark_key(sha)
        mark, mark_etag = await self._read_mark(mark_key)
        if mark_etag is not None and (mark is None or mark.state == "deleting"):
            return False  # deleting or unreadable: the stale-deletion pass resolves it first
        await self._fence()
        if mark is not None:
            await self._delete_mark_if_unchanged(mark_key, mark_etag)
        # The veto goes last: a crash in between leaves a veto without a mark (cleared
        # next time), never a mark whose veto is gone.
        await self._delete_store.delete(veto.key)
        return True

    # --- small reads and writes ------------------------------------------------------------

    async def _log_deletion(
        self, mark: records.GcMark, *, blob_last_modified_ns: int, audit_started: int
    ) -> None:
        now = self._clock.now_ns()
        entry = records.GcLogEntry(
            frame_sha256=mark.frame_sha256,
            raw_blob_key=mark.raw_blob_key,
            blob_last_modified_ns=blob_last_modified_ns,
            marked_at_unix_ns=mark.marked_at_unix_ns,
            audit_started_at_unix_ns=audit_started,
            deleted_at_unix_ns=now,
            gc_run_id=mark.gc_run_id,
            reason=mark.reason,
        )
        try:
            await self._store.put(
                keys.gc_log_key(keys.UtcHour.from_unix_ns(now), mark.frame_sha256),
                entry.to_json(),
                if_none_match=True,
            )
        except PreconditionFailed:
            pass

    async def _read_mark(self, key: str) -> tuple[records.GcMark | None, str | None]:
        """``(mark, etag)``; ``(None, None)`` when absent, ``(None, etag)`` when the mark
        exists but does not parse (settled by `_settle_unreadable`, never acted on)."""
        try:
            body, etag = await self._store.get(key)
        except NotFound:
            return None, None
        try:
            return records.GcMark.from_json(body), etag
        except records.RecordError as exc:
            log.error("gc_mark_unreadable", key=key, error=str(exc))
            return None, etag

    async def _delete_mark_if_unchanged(self, key: str, etag: str | None) -> None:
        _current, current_etag = await self._read_mark(key)
        if current_etag is not None and current_etag == etag:
            await self._delete_store.delete(key)

    async def _head(self, key: str) -> ObjectInfo | None:
        try:
            return await self._store.head(key)
        except NotFound:
            return None

    async def _exists(self, key: str) -> bool:
        return await self._head(key) is not None
