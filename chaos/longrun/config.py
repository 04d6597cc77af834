"""What one long simulated world is (`LongRunConfig`), its two sizes (`FULL`: two simulated
days, the run recorded in ``chaos/RESULTS.md``; `CI`: the test's, under a minute of wall
time), the minimum counts each must reach so that no check passes on 0 of 0 (`Minimums`),
and the settings its collectors, reconciler and GC run with (`longrun_settings`).

The world is `chaos.longrun.run`'s; the choices here follow issue 31: a steady rate for
days, compaction on, an audit every ``audit_interval_s``, the GC and raw retention with a
short horizon, re-sends 5-20 minutes after acceptance, collector kills and lost flushes,
orphans planted every hour.
"""

from __future__ import annotations

from dataclasses import dataclass

from chaos.sim.config import SimConfig, daemon_settings
from config import Settings

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class Minimums:
    """Counts below which a run proves nothing (it fails instead of passing on 0 of 0)."""

    steady_batches: int
    """Batches whose log row reached the store, judged against the steady-pass bound."""
    lost_row_batches: int
    """Batches whose rows were lost (kills, lost flushes): cataloged by an audit."""
    orphans_due: int
    """Planted orphans whose deadline (deletable + two audit intervals) passed in the run."""
    collisions: int
    """Catalog files the GC found gone, covered by a merged file it read."""
    retired_due: int
    """Retired raw blobs whose day passed in the run."""
    segments_deleted: int
    """Log segments deleted by retention (0: the run is shorter than the retention)."""


@dataclass(frozen=True, slots=True)
class LongRunConfig:
    seed: int
    duration_s: float = 2 * DAY_S
    collectors: int = 3
    agents: int = 4
    batch_interval_s: float = 30.0
    """One batch every this long, from the agents in turn, to a random collector."""
    resend_rate: float = 0.3
    resend_after_s: tuple[float, float] = (300.0, 1200.0)
    """A re-send of an acknowledged batch comes this long after its acceptance."""
    quiet_s: float = 1800.0
    """No new batch in the run's last this-long (re-sends and cataloging settle)."""
    loop_interval_s: float = 60.0
    audit_interval_s: float = 7200.0
    lookback_s: float = 30.0
    retry_horizon_s: float = 600.0
    raw_retention_s: float = 3600.0
    catalog_grace_s: float = 30.0
    gc_concurrency: int = 8
    """``gc.concurrency``, also how many catalog files the GC reads at once."""
    orphans_per_hour: int = 3
    kill_every_s: tuple[float, float] = (3600.0, 3 * 3600.0)
    """A collector is killed (its buffered rows and requests lost) every U(a, b)."""
    lost_flush_every_s: tuple[float, float] = (3600.0, 4 * 3600.0)
    """A collector dies in a flush, before its segment's PUT is sent, every U(a, b)."""
    fault_rate: float = 0.04
    """The collectors' store faults (`chaos.sim.world.collector_fault_rates`)."""
    late_rate: float = 0.02
    """The collectors' writes that land after their caller gave up."""
    flush_s: float = 1.0
    rollup_interval_s: float = 300.0
    sample_every_s: float = 1800.0
    minimums: Minimums = Minimums(
        steady_batches=4000,
        lost_row_batches=5,
        orphans_due=50,
        collisions=20,
        retired_due=1000,
        segments_deleted=1000,
    )

    @property
    def segment_retention_s(self) -> float:
        """The shortest the settings allow: the GC's retry horizon plus a day."""
        return self.retry_horizon_s + DAY_S


FULL = LongRunConfig(seed=31)
CI = LongRunConfig(
    seed=31,
    duration_s=DAY_S + 3 * 3600.0,
    batch_interval_s=180.0,
    loop_interval_s=600.0,
    retry_horizon_s=300.0,
    raw_retention_s=1800.0,
    rollup_interval_s=1800.0,
    orphans_per_hour=2,
    kill_every_s=(1800.0, 3 * 3600.0),
    lost_flush_every_s=(1800.0, 3 * 3600.0),
    sample_every_s=3600.0,
    minimums=Minimums(
        steady_batches=300,
        lost_row_batches=3,
        orphans_due=30,
        collisions=5,
        retired_due=20,
        segments_deleted=30,
    ),
)
"""A day and three hours at a sixth of the rate and a tenth of the loop passes, with the
same audit interval: the same world in well under a minute of wall time (~16 s of CPU);
long enough for log segments to outlive their retention (the horizon plus a day) and be
deleted, and for the first retired hours' day to pass."""


def longrun_settings(config: LongRunConfig) -> Settings:
    """`chaos.sim.config.daemon_settings` of the matching short world (short horizons, a
    lease that outlives the run, a mark grace just past a collector's longest request),
    with the long world's intervals, the GC's concurrency and the shortest segment
    retention the settings allow; validated again as a whole."""
    base = daemon_settings(
        SimConfig(
            seed=config.seed,
            reconciler_interval_s=config.loop_interval_s,
            audit_interval_s=config.audit_interval_s,
            lookback_s=config.lookback_s,
            catalog_grace_s=config.catalog_grace_s,
            flush_s=config.flush_s,
            retry_horizon_s=config.retry_horizon_s,
            gc_concurrency=config.gc_concurrency,
            raw_retention_s=config.raw_retention_s,
        )
    )
    document = base.model_dump()
    document["reconciler"]["segment_retention_s"] = config.segment_retention_s
    return Settings.model_validate(document)
