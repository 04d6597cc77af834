"""all: every kind of trouble in one run, concurrently, on one bucket.

Skewed collectors (one 62 minutes behind), twin fleets, GC with short horizons, and
side by side: storms of faults, kills, outages, planted orphans re-sent as old content,
and rollup races. Long runs (``--minutes 30``) repeat this in rounds, each audited.
"""

from __future__ import annotations

import asyncio

from chaos.cluster import Timing
from chaos.load import LoadShape
from chaos.scenarios.base import Scenario, ScenarioContext
from chaos.scenarios.failures import drive_kill, drive_outage
from chaos.scenarios.gc_race import drive_gc_race
from chaos.scenarios.ingest import drive_faults
from chaos.scenarios.rollup_race import drive_rollup_race


async def drive_all(ctx: ScenarioContext) -> None:
    await asyncio.gather(
        drive_faults(ctx),
        drive_kill(ctx, rollups=False, phases=False, reconciler_share=0.05),
        drive_outage(ctx, phases=False),
        drive_gc_race(ctx, phases=False),
        drive_rollup_race(ctx, phases=False),
    )


ALL = Scenario(
    "all",
    "storms, kills, outages, skewed clocks, GC races and rollup races at once",
    drive_all,
    skews_s=(0.0, 0.0, -3720.0),
    # Moderate volume: the store grows for the whole run, and every GC run and audit
    # reads all of it.
    load=LoadShape(lanes=2, twins=1, agents=3, batches=4, wave_pause_s=3.0),
    timing=Timing(retry_horizon_s=3.0),
    uses_rollup=True,
)
