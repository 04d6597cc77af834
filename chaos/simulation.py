"""Deterministic in-process simulation of acceptance, the index, the reconciler and its GC.

One call, `simulate(config)`, builds a world on virtual time (`chaos.sim_runtime`):

- a `MemoryStore` (the bucket), watched by `WatchedStore`, which checks the GC's safety
  at the moment each operation is applied: no raw blob is deleted while an accepted
  manifest or quarantine record names it, and no manifest is created without its blob;
- ``collectors`` `BatchAcceptor`s, each with its `IndexLogWriter` (rows buffered and
  flushed as log segments every ``flush_s``), each through a seeded `DelayedStore`
  (latency; requests in flight land even if their caller gave up) and a seeded
  `FaultyStore` (409, 503, lost answers, unknown outcomes, hangs);
- agents: every batch is sent at a seeded moment to a random collector, retried after a
  503; some are re-sent much later (old content again: after GC may have marked it),
  some get a conflicting twin, some were "pre-landed" as orphan blobs (a collector that
  crashed after the blob: half of them flushed its ``blob`` log row first, half did not,
  so only an audit's listing finds those), some are never sent again (true orphans);
- the reconciler daemon (`reconciler.daemon.Reconciler.run`, through its own faulty
  store): steady passes over the log every ``reconciler_interval_s``, full audits when
  due, catalog compaction (the world starts shortly before an hour ends, so the first
  hour settles and is compacted), and the GC through `reconciler.gc.run_gc` with short
  horizons, from the start until ``settle_s`` after the last agent is done.

With ``raw_retention_s`` (PROTOCOL §4.1; `chaos.sim_retention`): a simulated rollup
commits ledgers of the cataloged batches (with a seeded lag; a few batches never, so
their hour can never retire), and the world runs until the first hour's blobs can have
been retired and deleted; around then some acknowledged batches are re-sent (a
duplicate, whether the blob is still there or not) or get a conflicting twin (a 409,
whose quarantine record must then keep the accepted blob). `WatchedStore` checks each
deletion against raw retention's rule, and the end state for retired blobs only.

When everything has settled (collectors flushed, requests in flight landed), a final
fault-free full audit runs and `SimReport.violations` lists every broken invariant:
each acknowledgement has its manifest with the same hash and a blob that hashes right;
no identity has two hashes; the catalog holds every record, each in a file a rollup work
marker names (`chaos.index_checks`); no referenced blob was deleted (also checked live
by `WatchedStore`). `SimReport.gc_coverage` is the fraction of true orphans (planted,
never sent) the GC deleted by the end.

Same config → same run, byte for byte (up to the random ids the GC and audit give
their own records, which decide nothing).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field

from chaos.faulty_store import Fault, FaultyStore
from chaos.sim_checks import WatchedStore, check_store
from chaos.sim_retention import (
    RetentionRule,
    SimRollup,
    gc_deletions_by_reason,
    retention_problems,
    retired_manifest_ids,
)
from chaos.sim_runtime import DelayedStore, S3LikeRetries, SimClock, run_virtual
from collector.accept import AcceptanceUnavailable, Accepted, BatchAcceptor, IdentityConflictFound
from config import (
    GcSettings,
    IngestSettings,
    ReconcilerSettings,
    RetentionSettings,
    Settings,
    StoreSettings,
)
from index.log_writer import IndexLogWriter
from index.rows import blob_row
from protocol import keys, records
from reconciler.audit import run_full_audit
from reconciler.context import open_context
from reconciler.daemon import Reconciler
from reconciler.metrics import ReconcilerMetrics
from store.base import ObjectStore
from store.errors import NotFound, StoreError
from store.lease import LeaseHeld
from store.memory import MemoryStore
from store.retry import Backoff

FIRST_HOUR_LEFT_S = 40
WORLD_START_NS = (1_760_000_000 // 3600 * 3600 + 3600 - FIRST_HOUR_LEFT_S) * keys.NS_PER_S
"""The world starts 40 s before an hour ends: it spans two hours, and the first one
settles (its end is older than the lookback), so the reconciler compacts it."""
RECONCILER_OWNER = "sim-reconciler"


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated world; every choice in it derives from ``seed``."""

    seed: int
    collectors: int = 3
    agents: int = 3
    batches_per_agent: int = 5
    resend_rate: float = 0.35
    conflict_rate: float = 0.15
    orphan_rate: float = 0.35
    give_up_rate: float = 0.15
    fault_rate: float = 0.08
    reconciler_fault_rate: float = 0.03
    reconciler_interval_s: float = 4.0
    settle_s: float = 30.0
    """How long the reconciler keeps running after the last agent is done."""
    audit_interval_s: float = 20.0
    lookback_s: float = 30.0
    catalog_grace_s: float = 5.0
    flush_s: float = 1.0
    late_rate: float = 0.04
    budget_s: float = 2.0
    max_latency_s: float = 0.2
    connect_timeout_s: float = 0.3
    read_timeout_s: float = 0.6
    retry_horizon_s: float = 4.0
    grace_margin_s: float = 1.0
    send_window_s: float = 50.0
    gc_concurrency: int = 1
    """``gc.concurrency``: 1 keeps the worlds chosen for the regressions as they were."""
    raw_retention_s: float | None = None
    """Raw retention (``[retention] raw_days``, as seconds); None: off, and no rollup."""
    rollup_interval_s: float = 5.0
    rollup_lag_s: float = 10.0
    rollup_withhold_rate: float = 0.04
    """Of the batches the simulated rollup sees, the share it never includes."""
    late_resend_rate: float = 0.5
    """With raw retention: acknowledged batches re-sent once their blobs may be gone."""
    late_conflict_rate: float = 0.2
    """With raw retention: acknowledged batches that get a conflicting twin around then."""


@dataclass
class SimReport:
    config: SimConfig
    violations: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def gc_coverage(self) -> float | None:
        """Deleted true orphans ÷ true orphans (planted, never sent); None without any."""
        planted = self.stats["orphans_true"]
        return self.stats["orphans_true_deleted"] / planted if planted else None


@dataclass(frozen=True, slots=True)
class _Header:
    agent_id: str
    boot_id: uuid.UUID
    seq_start: int
    seq_end: int
    record_count: int


@dataclass(frozen=True, slots=True)
class _Batch:
    header: _Header
    frame: bytes

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.frame).hexdigest()

    @property
    def identity(self) -> keys.BatchIdentity:
        h = self.header
        return keys.BatchIdentity(h.agent_id, h.boot_id, h.seq_start, h.seq_end)


def _collector_rates(rate: float) -> dict[str, dict[Fault, float]]:
    conditional = {
        Fault.CONFLICT: rate / 2,
        Fault.UNAVAILABLE: rate / 2,
        Fault.LOST_REPLY: rate,
        Fault.UNKNOWN_NOT_APPLIED: rate / 2,
        Fault.HANG: rate / 4,
    }
    reads = {Fault.UNAVAILABLE: rate / 2, Fault.HANG: rate / 8}
    return {
        "put_if_none_match": conditional,
        "get": reads,
        "head": reads,
        "list": {Fault.UNAVAILABLE: rate / 2},
    }


def _reconciler_rates(rate: float) -> dict[str, dict[Fault, float]]:
    # Mostly on writes: a real S3 client retries reads itself (`store.s3`); a failed read
    # only makes a steady pass, audit or GC run stop early and start over next time.
    return {
        "put_if_match": {Fault.LOST_REPLY: rate, Fault.CONFLICT: rate / 2},
        "put_if_none_match": {Fault.LOST_REPLY: rate, Fault.UNAVAILABLE: rate},
        "delete": {Fault.LOST_REPLY: rate, Fault.UNAVAILABLE: rate},
        "get": {Fault.UNAVAILABLE: rate / 20},
        "head": {Fault.UNAVAILABLE: rate / 20},
        "list": {Fault.UNAVAILABLE: rate / 20},
    }


def _settings(config: SimConfig) -> Settings:
    return Settings(
        store=StoreSettings(
            url="memory://simulation",
            connect_timeout_s=config.connect_timeout_s,
            read_timeout_s=config.read_timeout_s,
        ),
        ingest=IngestSettings(request_budget_s=config.budget_s, collector_id="sim"),
        reconciler=ReconcilerSettings(
            lease_ttl_s=10 * 24 * 3600.0,
            loop_interval_s=config.reconciler_interval_s,
            lookback_s=config.lookback_s,
            max_audit_interval_s=config.audit_interval_s,
            catalog_grace_s=config.catalog_grace_s,
            verify_rate_per_s=10_000.0,
            concurrency=4,
        ),
        gc=GcSettings(
            retry_horizon_s=config.retry_horizon_s,
            mark_grace_s=config.budget_s
            + config.connect_timeout_s
            + config.read_timeout_s
            + config.grace_margin_s,
            max_delete_fraction=1.0,
            concurrency=config.gc_concurrency,
        ),
        retention=RetentionSettings(
            raw_days=None if config.raw_retention_s is None else config.raw_retention_s / 86_400
        ),
    )


class _World:
    def __init__(self, config: SimConfig, report: SimReport) -> None:
        self.config = config
        self.report = report
        self.clock = SimClock(WORLD_START_NS)
        self.memory = MemoryStore("memory://simulation", clock=self.clock)
        self.watched = WatchedStore(
            self.memory,
            violations=report.violations,
            stats=report.stats,
            now_s=self.clock.monotonic,
        )
        self.settings = _settings(config)
        self.delayed: list[DelayedStore] = []
        self.faulty: list[FaultyStore] = []
        self.acceptors: list[BatchAcceptor] = []
        self.logs: list[IndexLogWriter] = []
        for index in range(config.collectors):
            store = self._faulty(f"collector-{index}", _collector_rates(config.fault_rate))
            log = IndexLogWriter(
                store=store,
                clock=self.clock,
                rng=random.Random(f"{config.seed}/index-log/{index}"),
                writer_id=f"sim-collector-{index}",
                flush_rows=64,
                flush_max_age_s=config.flush_s,
                max_buffered_rows=1024,
                backoff=Backoff(attempts=3, base_s=0.05, cap_s=0.5),
            )
            self.logs.append(log)
            self.acceptors.append(
                BatchAcceptor(
                    store=store,
                    collector_id=f"sim-collector-{index}",
                    clock=self.clock,
                    rng=random.Random(f"{config.seed}/acceptor/{index}"),
                    index_log=log,
                    budget_s=config.budget_s,
                    backoff=Backoff(attempts=8, base_s=0.05, cap_s=0.5),
                )
            )
        self.reconciler = Reconciler(
            store=self._faulty("reconciler", _reconciler_rates(config.reconciler_fault_rate)),
            settings=self.settings,
            clock=self.clock,
            rng=random.Random(f"{config.seed}/reconciler"),
            metrics=ReconcilerMetrics(clock=self.clock),
            owner=RECONCILER_OWNER,
        )
        # identity -> every hash acknowledged (200) for it, and the conflicts seen
        self.acked: dict[keys.BatchIdentity, set[str]] = {}
        self.conflict_views: list[tuple[keys.BatchIdentity, str]] = []
        self.true_orphans: set[str] = set()
        self.rollup: SimRollup | None = None
        self.retention_due_s = 0.0
        if config.raw_retention_s is not None:
            self._enable_raw_retention(config.raw_retention_s)

    def _enable_raw_retention(self, raw_s: float) -> None:
        """The rollup, the deletion rule, and when the first hour's blobs should be gone:
        the hour ends, is past raw retention, sealed by an audit started the settle margin
        later and rolled up; the GC retires it, an audit flags its blobs, the GC marks
        them, and an audit started past the grace proves them for the GC to delete."""
        config = self.config
        self.watched.retention = RetentionRule(self.memory, raw_s=raw_s, now_ns=self.clock.now_ns)
        self.rollup = SimRollup(
            self._faulty("rollup", {}),
            clock=self.clock,
            rng=random.Random(f"{config.seed}/rollup"),
            interval_s=config.rollup_interval_s,
            lag_s=config.rollup_lag_s,
            withhold_rate=config.rollup_withhold_rate,
            stats=self.report.stats,
        )
        retirable_s = max(
            raw_s,
            self.settings.settle_margin_s() + config.audit_interval_s,
            config.rollup_lag_s + config.rollup_interval_s,
        )
        self.retention_due_s = (
            FIRST_HOUR_LEFT_S
            + retirable_s
            + 3 * config.audit_interval_s
            + 2 * config.reconciler_interval_s
            + self.settings.gc.mark_grace_s
        )

    def _faulty(self, name: str, rates: dict[str, dict[Fault, float]]) -> ObjectStore:
        """The store as ``name`` sees it: S3-like retries over seeded faults over latency."""
        seed, config = self.config.seed, self.config
        delayed = DelayedStore(
            self.watched,
            rng=random.Random(f"{seed}/latency/{name}"),
            max_latency_s=config.max_latency_s,
            late_rate=config.late_rate,
            timeout_s=config.read_timeout_s,
            late_extra_s=config.connect_timeout_s,
        )
        faulty = FaultyStore(delayed, seed=hash_seed(f"{seed}/faults/{name}"), rates=rates)
        self.delayed.append(delayed)
        self.faulty.append(faulty)
        return S3LikeRetries(
            faulty,
            rng=random.Random(f"{seed}/retries/{name}"),
            backoff=Backoff(attempts=5, base_s=0.05, cap_s=0.5),
        )

    # --- agents -------------------------------------------------------------------------

    def batches(self) -> list[_Batch]:
        made = []
        for agent in range(self.config.agents):
            boot = uuid.UUID(int=random.Random(f"{self.config.seed}/boot/{agent}").getrandbits(128))
            for b in range(self.config.batches_per_agent):
                header = _Header(f"sim-agent-{agent}", boot, b * 10, b * 10 + 9, 10)
                made.append(_Batch(header, _frame(self.config.seed, agent, b, "original")))
        return made

    async def send(
        self, batch: _Batch, rng: random.Random, *, attempts: int = 6
    ) -> Accepted | None:
        """Send until an answer (or ``attempts`` 503s); returns the acknowledgement."""
        for _ in range(attempts):
            acceptor = self.acceptors[rng.randrange(len(self.acceptors))]
            try:
                outcome = await acceptor.accept(batch.header, batch.frame, batch.sha)
            except AcceptanceUnavailable:
                self.report.stats["answer_503"] += 1
                await self.clock.sleep(rng.uniform(0.2, 2.0))
                continue
            if isinstance(outcome, Accepted):
                self.report.stats[
                    "answer_200_duplicate" if outcome.duplicate else "answer_200"
                ] += 1
                if outcome.manifest.frame_sha256 != batch.sha:
                    self._violation(
                        f"200 for {batch.identity} names hash {outcome.manifest.frame_sha256[:12]}, sent {batch.sha[:12]}"
                    )
                self.acked.setdefault(batch.identity, set()).add(batch.sha)
                return outcome
            assert isinstance(outcome, IdentityConflictFound)
            self.report.stats["answer_409"] += 1
            self.conflict_views.append((batch.identity, outcome.accepted.frame_sha256))
            return None
        return None

    async def agent_batch(self, batch: _Batch, index: int) -> None:
        config = self.config
        rng = random.Random(f"{config.seed}/plan/{index}")
        pre_orphan = rng.random() < config.orphan_rate
        give_up = rng.random() < config.give_up_rate
        resend = rng.random() < config.resend_rate
        conflict = rng.random() < config.conflict_rate
        send_at = rng.uniform(0.0, config.send_window_s)
        logged = rng.random() < 0.5
        if pre_orphan:  # an earlier attempt wrote the blob, then its collector crashed
            await self._land_orphan(batch, logged=logged)
            self.report.stats["orphans_planted"] += 1
            if give_up:
                self.true_orphans.add(batch.sha)
        if give_up:
            return
        await self.clock.sleep(send_at)
        acked = await self.send(batch, rng)
        if resend:  # old content again, possibly after the GC marked or deleted it
            await self.clock.sleep(rng.uniform(0.0, config.send_window_s))
            self.report.stats["resends"] += 1
            await self.send(batch, rng)
        if conflict and acked is not None:
            twin = _Batch(batch.header, _frame(config.seed, index, 0, "conflict"))
            await self.clock.sleep(rng.uniform(0.0, config.send_window_s / 4))
            if await self.send(twin, rng) is not None:
                self._violation(f"conflicting frame for {batch.identity} was acknowledged")
        if acked is not None and self.rollup is not None:
            await self._after_raw_retention(batch, index)

    async def _after_raw_retention(self, batch: _Batch, index: int) -> None:
        """Around when raw retention deleted the first hour's blobs: a re-send (must be a
        duplicate, whether its blob is still there or not), or a conflicting twin (must
        be a 409; its quarantine record names the accepted blob, which must then stay)."""
        config = self.config
        rng = random.Random(f"{config.seed}/after-retention/{index}")
        resend = rng.random() < config.late_resend_rate
        conflict = rng.random() < config.late_conflict_rate
        at_s = self.retention_due_s + rng.uniform(-config.audit_interval_s, config.audit_interval_s)
        if not (resend or conflict):
            return
        await self.clock.sleep(at_s - self.clock.monotonic())
        if conflict:
            twin = _Batch(batch.header, _frame(config.seed, index, 0, "late conflict"))
            self.report.stats["late_conflicts"] += 1
            if await self.send(twin, rng, attempts=20) is not None:
                self._violation(f"late conflicting frame for {batch.identity} was acknowledged")
        if resend:
            gone = not await _exists(self.memory, keys.raw_blob_key(batch.sha))
            self.report.stats["late_resends_blob_gone" if gone else "late_resends"] += 1
            again = await self.send(batch, rng, attempts=20)
            if again is None:
                self._violation(f"late re-send of {batch.identity} got no 200 (blob gone: {gone})")
            elif not again.duplicate:
                self._violation(f"late re-send of {batch.identity} was accepted anew")

    async def _land_orphan(self, batch: _Batch, *, logged: bool) -> None:
        """The blob (no faults: the write landed); with ``logged``, its ``blob`` log row
        too, flushed by the collector before it crashed."""
        now = self.clock.now_ns()
        await self.watched.put(keys.raw_blob_key(batch.sha), batch.frame, if_none_match=True)
        if logged:
            log = IndexLogWriter(
                store=self.watched,
                clock=self.clock,
                rng=random.Random(f"{self.config.seed}/crashed/{batch.sha}"),
                writer_id="sim-crashed-collector",
            )
            log.append(blob_row(batch.sha, now))
            await log.flush()
            self.report.stats["orphans_logged"] += 1

    # --- the reconciler -------------------------------------------------------------------

    async def run_reconciler(self, agents_done: asyncio.Event) -> None:
        """The daemon from the start until ``settle_s`` after the agents are done."""
        task = asyncio.ensure_future(self.reconciler.run())
        await agents_done.wait()
        await self.clock.sleep(self.config.settle_s)
        if self.rollup is not None:  # at least until the first hour's blobs can be gone
            await self.clock.sleep(
                self.retention_due_s + self.config.settle_s - self.clock.monotonic()
            )
        await self.reconciler.stop(grace_s=60.0)
        try:
            await task
        except (StoreError, LeaseHeld) as exc:  # releasing the lease failed: harmless here
            self.report.stats[f"reconciler_exit_{type(exc).__name__}"] += 1
        for stage, count in _stage_errors(self.reconciler.metrics).items():
            self.report.stats[f"reconciler_stage_errors_{stage}"] += count

    def _violation(self, text: str) -> None:
        self.report.violations.append(f"t={self.clock.monotonic():.3f}s: {text}")


def _stage_errors(metrics: ReconcilerMetrics) -> dict[str, int]:
    counts: dict[str, int] = {}
    for metric in metrics.stage_errors.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.value:
                counts[str(next(iter(sample.labels.values()), ""))] = int(sample.value)
    return counts


async def _exists(store: ObjectStore, key: str) -> bool:
    try:
        await store.head(key)
    except StoreError:  # NotFound (a memory store fails no other way)
        return False
    return True


def hash_seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _frame(seed: int, agent: int, batch: int, variant: str) -> bytes:
    # The acceptance protocol never decodes frames; any bytes of frame length will do.
    return f"simulated frame seed={seed} agent={agent} batch={batch} {variant};".encode() * 3


async def _deleting_mark(store: MemoryStore, sha: str) -> bool:
    """Whether a ``deleting`` mark holds the blob: one whose state write had an unknown
    outcome waits for the lease it records to expire (`reconciler.gc_delete`), and the
    worlds' lease lasts 10 days."""
    try:
        body, _etag = await store.get(keys.gc_mark_key(sha))
    except NotFound:
        return False
    return records.GcMark.from_json(body).state == "deleting"


async def _final_audit(world: _World) -> None:
    """A fault-free full audit (the daemon's lease is re-taken by the same owner)."""
    ctx = await open_context(
        world.watched,
        settings=world.settings,
        clock=world.clock,
        rng=random.Random(f"{world.config.seed}/final-audit"),
        metrics=ReconcilerMetrics(clock=world.clock),
        owner=RECONCILER_OWNER,
    )
    try:
        audit = await run_full_audit(ctx)
    except Exception as exc:  # a crashing audit is a finding, not the end of the run
        world.report.violations.append(f"final audit failed: {type(exc).__name__}: {exc}")
        return
    if audit.status != "completed":
        world.report.violations.append(f"final audit did not complete: {audit}")


async def _run(config: SimConfig) -> SimReport:
    report = SimReport(config)
    world = _World(config, report)
    for log in world.logs:
        log.start()
    agents_done, rollup_stop = asyncio.Event(), asyncio.Event()
    reconciler = asyncio.ensure_future(world.run_reconciler(agents_done))
    rollup = asyncio.ensure_future(world.rollup.run(rollup_stop)) if world.rollup else None
    agents = [world.agent_batch(b, i) for i, b in enumerate(world.batches())]
    await asyncio.gather(*agents)
    agents_done.set()
    await reconciler
    rollup_stop.set()
    if rollup is not None:
        await rollup
    for log in world.logs:
        await log.stop(grace_s=60.0)
        report.stats["index_rows_dropped"] += log.stats.dropped_full + log.stats.dropped_failed
    for delayed in world.delayed:
        await delayed.drain()
    await _final_audit(world)
    report.stats["late_landings"] += sum(d.late_landings for d in world.delayed)
    report.stats["late_blob_deletes"] += sum(
        d.late_by_kind["delete raw-blobs"] for d in world.delayed
    )
    for faulty in world.faulty:
        for (op, fault), count in faulty.injected.items():
            report.stats[f"fault_{op}_{fault.value}"] += count
    present = {info.key async for info in world.memory.list(keys.RAW_BLOBS_PREFIX)}
    report.stats["orphans_true"] = len(world.true_orphans)
    report.stats["orphans_true_deleted"] = sum(
        keys.raw_blob_key(sha) not in present for sha in world.true_orphans
    )
    report.stats["orphans_true_held_deleting"] = sum(
        [
            keys.raw_blob_key(sha) in present and await _deleting_mark(world.memory, sha)
            for sha in world.true_orphans
        ]
    )
    report.violations += await check_store(
        world.memory,
        world.acked,
        world.conflict_views,
        retired=await retired_manifest_ids(world.memory),
    )
    report.violations += await retention_problems(world.memory)
    for reason, count in (await gc_deletions_by_reason(world.memory)).items():
        report.stats[f"gc_deleted_{reason.replace('-', '_')}"] += count
    return report


def simulate(config: SimConfig) -> SimReport:
    """Run one simulated world to the end on virtual time; see the module docstring."""
    return run_virtual(lambda: _run(config))


__all__ = ["SimConfig", "SimReport", "WatchedStore", "check_store", "simulate"]
