"""The simulated world on virtual time: the bucket, the collectors, the reconciler and,
with raw retention, the rollup (`SimWorld`); each sees the bucket through its own seeded
latency and faults.

The agents that send to the collectors are `chaos.sim.agents`; the run and its final
checks are `chaos.sim.simulation`.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable

from chaos.faulty_store import Fault, FaultyStore
from chaos.sim.checks import WatchedStore
from chaos.sim.config import SimConfig, SimReport, daemon_settings
from chaos.sim.retention import RetentionRule, SimRollup
from chaos.sim.runtime import DelayedStore, S3LikeRetries, SimClock
from collector.accept import BatchAcceptor
from collector.bundles.bundler import BundleLimits
from collector.bundles.options import BundleOptions
from config import Settings
from index.log_writer import IndexLogWriter
from protocol import keys
from protocol.records import AuditRecord
from reconciler.daemon import Reconciler
from reconciler.metrics import ReconcilerMetrics
from store.base import ObjectStore
from store.errors import StoreError
from store.lease import LeaseHeld
from store.memory import MemoryStore
from store.retry import Backoff

FIRST_HOUR_LEFT_S = 40
WORLD_START_NS = (1_760_000_000 // 3600 * 3600 + 3600 - FIRST_HOUR_LEFT_S) * keys.NS_PER_S
"""The world starts 40 s before an hour ends: it spans two hours, and the first one
settles (its end is older than the lookback), so the reconciler compacts it."""
RECONCILER_OWNER = "sim-reconciler"


def collector_fault_rates(rate: float) -> dict[str, dict[Fault, float]]:
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


def reconciler_fault_rates(rate: float) -> dict[str, dict[Fault, float]]:
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


def first_hour_blobs_gone_s(config: SimConfig, settings: Settings, raw_s: float) -> float:
    """When (virtual seconds from the start) the first hour's blobs should be gone: the
    hour ends, is past raw retention, sealed by an audit started the settle margin later
    and rolled up; the GC retires it, an audit flags its blobs, the GC marks them, and an
    audit started past the grace proves them for the GC to delete."""
    retirable_s = max(
        raw_s,
        settings.settle_margin_s() + config.audit_interval_s,
        config.rollup_lag_s + config.rollup_interval_s,
    )
    return (
        FIRST_HOUR_LEFT_S
        + retirable_s
        + 3 * config.audit_interval_s
        + 2 * config.reconciler_interval_s
        + settings.gc.mark_grace_s
    )


class SimWorld:
    """Everything in one world but its agents; every choice derives from the seed."""

    def __init__(self, config: SimConfig, report: SimReport) -> None:
        self.config = config
        self.report = report
        self.clock = SimClock(WORLD_START_NS)
        self.memory = MemoryStore("memory://simulation", clock=self.clock)
        self.settings = daemon_settings(config)
        self.watched = WatchedStore(
            self.memory,
            violations=report.violations,
            stats=report.stats,
            now_s=self.clock.monotonic,
            mark_grace_s=self.settings.gc.mark_grace_s,
        )
        self.delayed: list[DelayedStore] = []
        self.faulty: list[FaultyStore] = []
        self.acceptors: list[BatchAcceptor] = []
        self.logs: list[IndexLogWriter] = []
        for index in range(config.collectors):
            self.acceptors.append(self._collector(str(index))[0])
        self.spool_collector = self._collector("spool") if config.spool_agents else None
        """The local-spool collector's acceptor and store (`chaos.sim.spool`), or None;
        strict agents never send to it."""
        self.reconciler = Reconciler(
            store=self._store_seen_by(
                "reconciler", reconciler_fault_rates(config.reconciler_fault_rate)
            ),
            settings=self.settings,
            clock=self.clock,
            rng=random.Random(f"{config.seed}/reconciler"),
            metrics=ReconcilerMetrics(clock=self.clock),
            owner=RECONCILER_OWNER,
        )
        self._audit_done = asyncio.Event()
        self.audit_starts: list[int] = []
        """Start (store time) of every completed audit, in completion order."""
        self.watched.on_put = self._watch_audits
        self._marks_seen: set[str] = set()
        self._mark_seen = asyncio.Event()
        self._crashed = 0
        self.rollup: SimRollup | None = None
        self.retention_due_s = 0.0
        """With raw retention: when the first hour's blobs should be gone."""
        if config.raw_retention_s is not None:
            self._enable_raw_retention(config.raw_retention_s)

    def _collector(self, tag: str) -> tuple[BatchAcceptor, ObjectStore]:
        """A collector (``tag``: its index, or a name): its `BatchAcceptor` and
        `IndexLogWriter` (in ``logs``: started and stopped with the others), over one
        faulty store (returned too)."""
        config = self.config
        store = self._store_seen_by(f"collector-{tag}", collector_fault_rates(config.fault_rate))
        log = IndexLogWriter(
            store=store,
            clock=self.clock,
            rng=random.Random(f"{config.seed}/index-log/{tag}"),
            writer_id=f"sim-collector-{tag}",
            flush_rows=64,
            flush_max_age_s=config.flush_s,
            max_buffered_rows=1024,
            backoff=Backoff(attempts=3, base_s=0.05, cap_s=0.5),
            put_budget_s=config.index_put_budget_s,
            landing_s=config.connect_timeout_s + config.read_timeout_s,
        )
        self.logs.append(log)
        acceptor = BatchAcceptor(
            store=store,
            collector_id=f"sim-collector-{tag}",
            clock=self.clock,
            rng=random.Random(f"{config.seed}/acceptor/{tag}"),
            index_log=log,
            budget_s=config.budget_s,
            backoff=Backoff(attempts=8, base_s=0.05, cap_s=0.5),
            bundles=self.bundle_options(),
        )
        return acceptor, store

    def bundle_options(self) -> BundleOptions | None:
        """Group commit as a collector runs it once the store's feature gate is on
        (PROTOCOL §3.10), with the world's timeouts; None in a world without bundles."""
        config = self.config
        if not config.bundles:
            return None
        store_timeout_s = config.connect_timeout_s + config.read_timeout_s
        limits = BundleLimits(
            max_in_flight=config.bundle_max_in_flight,
            eager_frames=config.bundle_eager_frames,
            send_margin_s=BundleLimits.margin(
                store_timeout_s=store_timeout_s, budget_s=config.budget_s
            ),
        )
        return BundleOptions(limits=limits, enabled=lambda: True)

    def _watch_audits(self, key: str, body: bytes) -> None:
        if key.startswith(keys.GC_MARKS_PREFIX):  # and marks (`marked`)
            self._marks_seen.add(key)
            seen, self._mark_seen = self._mark_seen, asyncio.Event()
            seen.set()
            return
        record = key.startswith(keys.RECONCILER_AUDITS_PREFIX) and key.endswith(".json")
        if not record or b'"completed"' not in body:  # not a record: an audit's listing part
            return
        started = AuditRecord.from_json(body).started_at_unix_ns
        if started not in self.audit_starts:
            self.audit_starts.append(started)
            done, self._audit_done = self._audit_done, asyncio.Event()
            done.set()

    async def audit_started_after(self, after_ns: int, *, max_wait_s: float) -> bool:
        """Wait until an audit that started after ``after_ns`` has completed (False when
        none did within ``max_wait_s``)."""
        return await self._until(
            lambda: any(started > after_ns for started in self.audit_starts),
            lambda: self._audit_done,
            max_wait_s,
        )

    async def marked(self, sha: str, *, max_wait_s: float) -> bool:
        """Wait until the GC has marked the raw object of hash ``sha`` (False when it did
        not within ``max_wait_s``)."""
        key = keys.gc_mark_key(sha)
        return await self._until(
            lambda: key in self._marks_seen, lambda: self._mark_seen, max_wait_s
        )

    async def _until(
        self, holds: Callable[[], bool], news: Callable[[], asyncio.Event], max_wait_s: float
    ) -> bool:
        """Wait until ``holds()``, woken by the current event of ``news()`` (each is set
        once and replaced), for at most ``max_wait_s``; whether it held."""
        deadline = self.clock.monotonic() + max_wait_s
        while not holds():
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(news().wait(), left)
            except TimeoutError:
                return False
        return True

    def crashing_acceptor(self, *, bundles: BundleOptions | None = None) -> BatchAcceptor:
        """A collector that crashes right after answering: its log rows are never flushed.
        ``bundles``: its group commit."""
        config, index = self.config, self._crashed
        self._crashed += 1
        store = self._store_seen_by(f"crashing-{index}", collector_fault_rates(config.fault_rate))
        lost = IndexLogWriter(
            store=store,
            clock=self.clock,
            rng=random.Random(f"{config.seed}/crashing-log/{index}"),
            writer_id=f"sim-crashing-{index}",
        )  # never started nor flushed
        return BatchAcceptor(
            store=store,
            collector_id=f"sim-crashing-{index}",
            clock=self.clock,
            rng=random.Random(f"{config.seed}/crashing/{index}"),
            index_log=lost,
            budget_s=config.budget_s,
            backoff=Backoff(attempts=8, base_s=0.05, cap_s=0.5),
            bundles=bundles,
        )

    def _enable_raw_retention(self, raw_s: float) -> None:
        """The rollup, the deletion rule `WatchedStore` checks, and when the first hour's
        blobs should be gone (`first_hour_blobs_gone_s`)."""
        config = self.config
        self.watched.retention = RetentionRule(self.memory, raw_s=raw_s, now_ns=self.clock.now_ns)
        self.rollup = SimRollup(
            self._store_seen_by("rollup", {}),
            clock=self.clock,
            rng=random.Random(f"{config.seed}/rollup"),
            interval_s=config.rollup_interval_s,
            lag_s=config.rollup_lag_s,
            withhold_rate=config.rollup_withhold_rate,
            stats=self.report.stats,
        )
        self.retention_due_s = first_hour_blobs_gone_s(config, self.settings, raw_s)

    def _store_seen_by(self, name: str, rates: dict[str, dict[Fault, float]]) -> ObjectStore:
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
        faulty = FaultyStore(delayed, seed=_int_seed(f"{seed}/faults/{name}"), rates=rates)
        self.delayed.append(delayed)
        self.faulty.append(faulty)
        return S3LikeRetries(
            faulty,
            rng=random.Random(f"{seed}/retries/{name}"),
            backoff=Backoff(attempts=5, base_s=0.05, cap_s=0.5),
        )

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

    def violation(self, text: str) -> None:
        """Record a broken invariant, stamped with the virtual time it was seen."""
        self.report.violations.append(f"t={self.clock.monotonic():.3f}s: {text}")


def _stage_errors(metrics: ReconcilerMetrics) -> dict[str, int]:
    counts: dict[str, int] = {}
    for metric in metrics.stage_errors.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.value:
                counts[str(next(iter(sample.labels.values()), ""))] = int(sample.value)
    return counts


def _int_seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
