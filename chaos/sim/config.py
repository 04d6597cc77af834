"""What one simulated world is (`SimConfig`), what came of it (`SimReport`), and the
settings its collectors, reconciler and GC run with (`daemon_settings`).

The simulation itself is `chaos.sim.simulation.simulate`; these live apart so the modules
that build the world (`chaos.sim.world`, `chaos.sim.agents`) need not import it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from config import (
    GcSettings,
    IngestSettings,
    ReconcilerSettings,
    RetentionSettings,
    Settings,
    StoreSettings,
)


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
    index_put_budget_s: float = 5.0
    """``ingest.index_put_budget_s``: with the default skew limit (10 s) within the lookback."""
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
    crash_landing_rate: float = 0.0
    """Batches whose earlier attempt left an orphan blob (the batch's frame, or a
    conflicting twin of it) that lands only after an audit nominated it for the GC: sent
    then through a collector that crashes before flushing its log rows, so its manifest
    (or quarantine record) is known to nothing but the store — the GC's targeted proof
    (PROTOCOL §3.5 rule 7) is what keeps the blob (`chaos.sim.agents`)."""
    resend_header_rate: float = 0.5
    """Of the later re-sends of a batch, the share that carries ``X-Lightmetrics-Resend``
    (the agent remembered sending it; the others restarted). Retries after a 503 always
    carry it, as the reference agent's do."""
    twin_sent_before_rate: float = 0.5
    """Of the conflicting twins, the share the agent had sent before without an answer,
    so their first send here carries the header: half of those left their blob as an
    orphan at the start (a collector crashed after the blob), half left nothing."""
    bundles: bool = False
    """Group commit on (PROTOCOL §3.10): the collectors bundle the frames that arrive
    while ``bundle_max_in_flight`` raw writes are in flight (the store's feature gate
    says ``bundles: true``). Off: frame blobs only, and the world is what it was."""
    bundle_max_in_flight: int = 2
    bundle_eager_frames: int = 0
    """With bundles: an open bundle of this many frames is written at once, slots busy
    or not (``ingest.bundle_eager_frames``; 0: the write slots alone)."""
    bundle_landings: int = 0
    """With bundles: groups of three new batches whose earlier attempt left an orphan
    bundle of the last two (a collector crashed after writing it), sent again once the
    GC has marked that bundle, at a seeded moment around its grace, by agents that
    restarted (no re-send header) to one busy collector that bundles them the same way:
    its bundle write is answered 412 and the §3.5 collector side runs on the bundle
    (`chaos.sim.agents`)."""
    agent_gone_rate: float = 0.0
    """Of the batches whose first send is answered 503, the share whose agent never sends
    them again (it crashed and lost them): their outcome stays unknown to everyone, and
    nothing may land for them later than the GC's grace allows."""
    quarantined_bundles: int = 0
    """With bundles: orphan bundles a quarantine record names once an audit nominated them,
    a fault (PROTOCOL §3.10: records name frame blobs only) that must keep the bundle
    (`chaos.sim.simulation.PlantedFaults`)."""
    bundles_unlike_index: int = 0
    """With bundles: orphan bundles whose frames disagree with their index, named by a
    manifest of an indexed frame once an audit nominated them: corrupt, never deleted
    (`chaos.sim.simulation.PlantedFaults`)."""
    bundles_retiring_apart: int = 0
    """With bundles and raw retention: bundles of two frames of the first hour, the
    second's manifest landing late, once raw retention nominated the bundle for the first
    (`chaos.sim.simulation.PlantedFaults`)."""
    race_rate: float = 0.0
    """With bundles: batches whose identity two collectors race, in two different
    bundles: sent at the same moment to two collectors, the same frame (an agent that
    gave up on the first too soon) or half the time a conflicting one (`chaos.sim.agents`)."""
    spool_agents: int = 0
    """With bundles: agents of one local-spool collector (PROTOCOL §3.4), whose batches are
    followed by a conflicting twin (answered 409) or sent again, while the collector lands
    its spool in bundles (§3.10 spool mode) and restarts once (`chaos.sim.spool`)."""
    spool_send_window_s: float = 9.0
    """With spool agents: how long after its bundle's write a landing's manifest create may
    be sent (the lander's ``send_window_s``); the GC's mark grace is then at least the
    settle margin plus this (PROTOCOL §3.10), so windows hold up to 4 frames."""


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


def daemon_settings(config: SimConfig) -> Settings:
    """The settings of the world's collectors, reconciler and GC: short horizons, a
    reconciler lease that outlives the run, and a mark grace just past the longest a
    collector's request can take."""
    settings = Settings(
        store=StoreSettings(
            url="memory://simulation",
            connect_timeout_s=config.connect_timeout_s,
            read_timeout_s=config.read_timeout_s,
        ),
        ingest=IngestSettings(
            request_budget_s=config.budget_s,
            collector_id="sim",
            index_put_budget_s=config.index_put_budget_s,
        ),
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
    if not config.spool_agents:
        return settings
    # A spool landing sends its creates up to the send window after the bundle's write, and
    # PROTOCOL §3.10 keeps them within the mark grace less the settle margin.
    grace_s = max(settings.gc.mark_grace_s, settings.settle_margin_s() + config.spool_send_window_s)
    gc = settings.gc.model_copy(update={"mark_grace_s": grace_s})
    return settings.model_copy(update={"gc": gc})
