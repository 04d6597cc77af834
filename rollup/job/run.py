"""One rollup run: plan → Spark stages → problems → commit (→ re-plan on conflict).

`run_rollup` is what ``lm-rollup run`` and the spark-submit entry call, with a Spark
session they own. Under the owner lease (taken here unless one is passed in):

1. load the latest snapshot and plan against it (`rollup.job.plan`); included batches
   whose key was retracted are removed first, in a commit of their own
   (`rollup.lifecycle.retraction`), and the plan made again; nothing to do → done;
2. run the stages (`rollup.job.stages`) in a thread while the lease is renewed;
3. record each bad frame (hash mismatch, undecodable, missing blob, another batch's) and
   each refused batch (``overlapping-identity``) as a problem; such batches are left out
   of the ledger, so they stay pending and ``verify`` shows them missing;
4. build `Changes` (new points/rollup/series/ledger files; the superseded ``rollup_1m``
   files of every rewritten hour; ``series_day`` files of days written late or settled,
   `rollup.lifecycle.series_files`; retracted batches included again) and `commit` them;
5. `CommitConflict` (another commit moved the pointer): delete this attempt's files,
   re-plan against the new latest snapshot and retry, at most ``max_commit_retries``
   times. Every attempt re-plans from the ledger it commits on: never twice;
6. after a commit, once the pointer read back shows it, delete the work markers read,
   except those of hours with batches left out (they stay pending, and the marker makes
   the next run try them again); a plan with nothing to do deletes its markers at once;
7. with ``[rollup] compact_after_run``, compact what the commit left (its own commit);
8. whatever the outcome, publish every committed version not yet published as Iceberg
   metadata (`rollup.iceberg.publish`); a failed publish is logged, the next run repairs.

A crash anywhere before the pointer swap leaves only orphan files; the next run plans
the same batches again and produces exact totals.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import structlog

from config.settings import RollupSettings
from protocol.clock import Clock, SystemClock
from rollup.iceberg.publish import publish_or_log
from rollup.job.base_inputs import (
    data_file_of,
    expired_files,
    hour_inputs,
    hours_left_pending,
    marker_hour,
    refused_hours,
    retention_cutoffs,
    upkeep_due,
)
from rollup.job.plan import Plan, make_plan
from rollup.job.problems import record_problems
from rollup.job.stages import StageRecord, run_stages
from rollup.job.tasks import WriteOptions
from rollup.lifecycle import compaction, series_files
from rollup.lifecycle.retraction import commit_retraction, restored_batches
from rollup.table.commit import (
    CommitConflict,
    LoadedSnapshot,
    commit,
    delete_uncommitted,
    load_latest,
)
from rollup.table.manifest import Changes, DataFile, LedgerHour
from rollup.table.owner import OwnerLease, OwnerLost
from rollup.table.storage import StoreAccess
from store.base import ObjectStore
from store.errors import StoreError
from store.time import store_clock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = structlog.get_logger(__name__)


class CommitRetriesExhausted(Exception):
    """Every attempt lost the pointer race: another writer keeps committing. Nothing of
    ours is reachable; run again later (the owner lease should make this rare)."""


MAX_RETRACTION_COMMITS = 3  # retraction commits a run tries before it includes batches

BeforeCommit = Callable[[int, Changes], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RunHooks:
    """Test seams. ``before_commit(attempt, changes)`` runs after the files are written
    and before the commit: raising there is a crash between the two."""

    before_commit: BeforeCommit | None = None


@dataclass
class RunSummary:
    """What a run did (``lm-rollup run`` prints it as JSON)."""

    outcome: str = "up-to-date"  # "committed", "up-to-date" or "nothing-included"
    version: int | None = None
    base_version: int | None = None
    batches: int = 0
    points: int = 0
    rollup_rows: int = 0
    files_added: int = 0
    files_removed: int = 0
    hours_checked: int = 0
    attempts: int = 0
    commit_conflicts: int = 0
    problems: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    compaction: dict[str, Any] | None = None
    """What ``[rollup] compact_after_run`` compacted after the commit (None: not run)."""
    late_excluded: int = 0
    """Batches included in the ledger with no rows: retention had dropped their hours."""
    retracted: list[dict[str, Any]] = field(default_factory=list)
    """Retraction commits of this run (`rollup.lifecycle.retraction.RetractionReport`)."""
    iceberg_published: list[int] = field(default_factory=list)
    """Versions published as Iceberg metadata by this run (`rollup.iceberg.publish`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def run_rollup(
    spark: SparkSession,
    store: ObjectStore,
    *,
    access: StoreAccess,
    settings: RollupSettings,
    owner: OwnerLease | None = None,
    clock: Clock | None = None,
    hooks: RunHooks | None = None,
    progress: bool = False,
    job_id: str | None = None,
) -> RunSummary:
    """Run once; see the module doc. Raises `LeaseHeld` (another owner is active),
    `OwnerLost`, `CommitRetriesExhausted`, store errors (`OutcomeUnknown` from the
    commit means the next run's load tells whether it landed)."""
    clock = clock or SystemClock()
    hooks = hooks or RunHooks()
    own = owner or await OwnerLease.acquire(
        store, job_id or f"lm-rollup-{uuid.uuid4()}", settings.owner_lease_ttl_s, clock
    )
    try:
        summary = await _Run(spark, store, access, settings, own, clock, hooks, progress).run()
        if settings.compact_after_run and summary.outcome == "committed":
            summary.compaction = await compaction.compact_after_run(store, access, settings, clock)
        summary.iceberg_published = await publish_or_log(
            store, store_url=access.url, retention_s=settings.retention_s, owner=own
        )
        return summary
    finally:
        if owner is None:
            await own.release()


class _Run:
    def __init__(
        self,
        spark: SparkSession,
        store: ObjectStore,
        access: StoreAccess,
        settings: RollupSettings,
        owner: OwnerLease,
        clock: Clock,
        hooks: RunHooks,
        progress: bool,
    ) -> None:
        self.spark = spark
        self.store = store
        self.settings = settings
        self.owner = owner
        self.clock = clock
        self.hooks = hooks
        self.progress = progress
        self.options = WriteOptions(
            access=access,
            compression=settings.compression,
            row_group_size=settings.parquet_row_group_size,
        )
        self.summary = RunSummary()

    async def run(self) -> RunSummary:
        summary = self.summary
        for attempt in range(self.settings.max_commit_retries + 1):
            summary.attempts = attempt + 1
            await self.owner.check()
            started = time.monotonic()
            base, plan = await self._plan(await load_latest(self.store))
            now_ns = store_clock(self.store, self.clock).now_ns()
            retention = retention_cutoffs(self.settings, base, now_ns)
            self._note_plan(plan, started)
            if not plan.batches and not upkeep_due(base, retention, now_ns, self.settings):
                summary.problems = plan.refused_problems()
                await record_problems(self.store, self.clock, summary.problems)
                await self._consume_markers(plan, keep_hours=refused_hours(plan))
                summary.outcome = "up-to-date"
                return summary
            # Nothing new but retention drops hours or a day settled: commit that alone.
            records = await self._stages(plan, retention) if plan.batches else []
            problems = [r.body for r in records if r.kind == "problem"]
            changes = replace(
                self._changes(base, records, retention),
                restored=restored_batches(base, plan.items, {p["manifest_id"] for p in problems}),
            )
            changes = await self._with_days(base, changes, retention)
            summary.problems = problems + plan.refused_problems()
            await record_problems(self.store, self.clock, summary.problems)
            if not (changes.added_files or changes.added_ledger_files or changes.removed_files):
                summary.outcome = "nothing-included"
                return summary
            if self.hooks.before_commit is not None:
                await self.hooks.before_commit(attempt, changes)
            started = time.monotonic()
            try:
                committed = await commit(
                    self.store, base=base, changes=changes, owner=self.owner, clock=self.clock
                )
            except CommitConflict as conflict:
                summary.commit_conflicts += 1
                deleted = await delete_uncommitted(self.store, changes)
                log.warning(
                    "rollup_commit_conflict",
                    attempt=attempt + 1,
                    current_version=conflict.current_version,
                    files_deleted=deleted,
                )
                continue
            except OwnerLost:
                await delete_uncommitted(self.store, changes)
                raise
            summary.seconds["commit"] = round(time.monotonic() - started, 3)
            self._note_commit(committed, changes, records)
            await self._consume_markers_after(
                committed.snapshot.version, plan, hours_left_pending(plan, changes)
            )
            return summary
        raise CommitRetriesExhausted(
            f"{summary.commit_conflicts} commit attempts lost the pointer race; run again"
        )

    def _note_plan(self, plan: Plan, started: float) -> None:
        summary = self.summary
        summary.base_version = plan.base.snapshot.version if plan.base else None
        summary.hours_checked = len(plan.hours_checked)
        summary.seconds["plan"] = round(time.monotonic() - started, 3)
        log.info(
            "rollup_planned",
            base_version=summary.base_version,
            batches=plan.batches,
            records=plan.records,
            hours_checked=len(plan.hours_checked),
        )

    async def _with_days(
        self, base: LoadedSnapshot | None, changes: Changes, retention: dict[str, str]
    ) -> Changes:
        """Plus the ``series_day`` files of days written late or settled (`run_days`)."""
        days = await asyncio.to_thread(
            series_files.run_days,
            base.snapshot if base is not None else None,
            [f for f in changes.added_files if f.table == "series"],
            removed=changes.removed_files,
            first_kept=retention.get("series_day"),
            now_us=store_clock(self.store, self.clock).now_ns() // 1000,
            settle_us=int(self.settings.series_day_settle_s * 1e6),
            access=self.options.access,
            version=(base.snapshot.version if base is not None else 0) + 1,
            compression=self.options.parquet_compression,
        )
        return replace(changes, added_files=(*changes.added_files, *days))

    async def _stages(self, plan: Plan, retention: dict[str, str]) -> list[StageRecord]:
        started = time.monotonic()
        log.info("rollup_stages_started", batches=plan.batches, records=plan.records)
        inputs = hour_inputs(plan.base, retention)
        work = asyncio.create_task(
            asyncio.to_thread(run_stages, self.spark, plan.items, self.options, inputs)
        )
        # Keep the lease while Spark works; if it is lost, the commit refuses anyway.
        renew_every = self.settings.owner_lease_ttl_s / 4
        while True:
            done, _ = await asyncio.wait({work}, timeout=renew_every)
            if done:
                break
            try:
                await self.owner.check()
            except OwnerLost:
                self.spark.sparkContext.cancelAllJobs()  # its files become orphans
                raise
        records = work.result()
        self.summary.seconds["stages"] = round(time.monotonic() - started, 3)
        log.info("rollup_stages_done", seconds=self.summary.seconds["stages"], records=len(records))
        return records

    def _changes(
        self, base: LoadedSnapshot | None, records: list[StageRecord], retention: dict[str, str]
    ) -> Changes:
        version = (base.snapshot.version if base is not None else 0) + 1
        added: list[DataFile] = []
        rewritten: set[str] = set()
        ledger_files: list[str] = []
        delta: dict[str, LedgerHour] = {}
        late: dict[str, LedgerHour] = {}
        for record in records:
            body = record.body
            if record.kind in ("points_file", "rollup_file", "series_file"):
                added.append(data_file_of(body, version))
                if record.kind == "rollup_file":
                    rewritten.add(body["partition"])
            elif record.kind == "ledger_file":
                ledger_files.append(body["path"])
                delta[record.hour] = LedgerHour(body["batches"], body["records"], body["setsum"])
                if body.get("late_excluded"):
                    part = body["late_excluded"]
                    late[record.hour] = LedgerHour(part["batches"], part["records"], part["setsum"])
        removed = {
            f.path
            for f in (base.snapshot.data_files("rollup_1m") if base is not None else ())
            if f.partition.iso in rewritten
        }
        removed |= expired_files(base, retention)
        if late:
            self.summary.late_excluded = sum(h.batches for h in late.values())
        return Changes(
            added_files=tuple(sorted(added, key=lambda f: f.path)),
            removed_files=tuple(sorted(removed)),
            added_ledger_files=tuple(sorted(ledger_files)),
            ledger_delta=dict(sorted(delta.items())),
            retention=retention,
            late_delta=dict(sorted(late.items())),
        )

    def _note_commit(
        self, committed: LoadedSnapshot, changes: Changes, records: list[StageRecord]
    ) -> None:
        summary = self.summary
        summary.outcome = "committed"
        summary.version = committed.snapshot.version
        summary.batches = sum(d.batches for d in changes.ledger_delta.values())
        summary.points = sum(d.records for d in changes.ledger_delta.values())
        summary.rollup_rows = sum(
            f.row_count for f in changes.added_files if f.table == "rollup_1m"
        )
        summary.files_added = len(changes.added_files) + len(changes.added_ledger_files)
        summary.files_removed = len(changes.removed_files)
        log.info(
            "rollup_run_committed",
            version=summary.version,
            batches=summary.batches,
            points=summary.points,
            problems=len(summary.problems),
        )

    async def _plan(self, base: LoadedSnapshot | None) -> tuple[LoadedSnapshot | None, Plan]:
        """The plan on the latest snapshot, after included batches whose key was
        retracted left in commits of their own (`rollup.lifecycle.retraction`)."""
        plan = await make_plan(self.store, base, progress=self.progress)
        for _ in range(MAX_RETRACTION_COMMITS):
            if base is None or not plan.retracted.num_rows:
                break
            report = await commit_retraction(
                self.store,
                base,
                plan.retracted,
                access=self.options.access,
                compression=self.options.parquet_compression,
                owner=self.owner,
                clock=self.clock,
            )
            if report is None:  # the pointer moved: plan again on the newer snapshot
                self.summary.commit_conflicts += 1
            else:
                self.summary.retracted.append(asdict(report))
            base = await load_latest(self.store)
            plan = await make_plan(self.store, base, progress=self.progress)
        return base, plan

    async def _consume_markers_after(self, version: int, plan: Plan, pending: set[str]) -> None:
        """Delete the plan's work markers once the pointer read back shows ``version`` (or
        a later one) committed: only then is the markers' work durably in the ledger.
        Markers of the ``pending`` hours (batches planned but not included) stay."""
        latest = await load_latest(self.store)
        if latest is None or latest.snapshot.version < version:
            log.warning("rollup_work_markers_kept", committed_version=version)
            return
        await self._consume_markers(plan, keep_hours=pending)

    async def _consume_markers(self, plan: Plan, *, keep_hours: set[str] | None = None) -> None:
        for key in plan.dirty_markers:
            if keep_hours and marker_hour(key) in keep_hours:
                continue
            try:
                await self.store.delete(key)
            except StoreError as exc:  # harmless: the next run re-checks the hour once more
                log.warning("rollup_dirty_marker_delete_failed", key=key, error=str(exc))
