"""The chaos scenarios by name (``lm-chaos run --scenario NAME``)."""

from __future__ import annotations

from chaos.scenarios.base import Scenario, ScenarioContext
from chaos.scenarios.combined import ALL
from chaos.scenarios.failures import KILL, OUTAGE
from chaos.scenarios.gc_race import GC_RACE
from chaos.scenarios.ingest import CLOCK_SKEW, FAULTS, RACE
from chaos.scenarios.rollup_race import ROLLUP_RACE

SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (RACE, FAULTS, KILL, OUTAGE, CLOCK_SKEW, GC_RACE, ROLLUP_RACE, ALL)
}

__all__ = ["SCENARIOS", "Scenario", "ScenarioContext"]
