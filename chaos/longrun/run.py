"""The long run that shows it (issue 31): one simulated world, days long, on virtual time.

`run_longrun(config)` (`chaos.longrun.config.LongRunConfig`; `FULL` is two simulated
days, `CI` a day and three hours in under a minute) builds `chaos.longrun.world`'s
world and runs the real code over it: collectors (`BatchAcceptor`, `IndexLogWriter`)
killed and restarted, some dying in a flush; the reconciler daemon
(`reconciler.daemon.Reconciler.run`: steady passes every loop interval, an audit every
``audit_interval_s``, compaction, log retention, the GC and raw retention with short
horizons); a rollup stand-in that counts rows by the index's own rule
(`chaos.longrun.ledger_rollup`). Agents send at a steady rate and re-send 5-20 minutes
after acceptance; orphan blobs are planted every hour.

When the run ends it measures (`chaos.longrun.figures`): how long each batch waited
for the catalog after its log row landed, how long those whose rows were lost waited for
an audit, how soon planted orphans and retired blobs were deleted, how often the GC found
a catalog file gone under a merge it read (from the ``gc_catalog_read_covered`` events it
logs), ``lm_reconciler_gc_stalled_total``, and whether log segments and
``catalog-created/`` entries stay bounded. Then, with everything settled, a fault-free
full audit and the end-state checks of the short simulation (`chaos.sim.checks`,
`chaos.sim.retention`, `chaos.auditor.gc_log_violations`), and the live checks of
`chaos.sim.checks.WatchedStore` throughout (no referenced blob is ever deleted).

`LongRunReport.ok`: no violation and no shortfall. ``lm-chaos longrun [--ci]`` runs it
and prints the figures.

While it runs, structlog is routed to a counter (`LogTally`): events are counted, not
printed (two days of a daemon's logs would cost more than the run).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog

from chaos.auditor import gc_log_violations
from chaos.longrun.config import CI, FULL, LongRunConfig
from chaos.longrun.figures import Figures, measure, render, shortfalls
from chaos.longrun.watch import sample_bounds
from chaos.longrun.world import LongRunWorld
from chaos.sim.checks import check_store
from chaos.sim.retention import ledger_manifest_ids, retention_problems, retired_manifest_ids
from chaos.sim.runtime import run_virtual
from chaos.sim.world import RECONCILER_OWNER
from reconciler.audit.run import run_full_audit
from reconciler.context import open_context
from reconciler.gc.log import read_gc_log
from reconciler.metrics import ReconcilerMetrics
from store.errors import StoreError
from store.lease import LeaseHeld

__all__ = ["CI", "FULL", "LongRunConfig", "LongRunReport", "run_longrun"]


@dataclass
class LogTally:
    """A structlog processor that counts events by name and drops them."""

    events: Counter[str] = field(default_factory=Counter)
    covered_gone: int = 0
    """Sum of ``compacted_meanwhile`` over ``gc_catalog_read_covered`` events."""
    errors: list[str] = field(default_factory=list)
    """The first few error events, for the report."""

    def __call__(self, _logger: Any, method: str, event_dict: Any) -> Any:
        event = str(event_dict.get("event"))
        self.events[event] += 1
        if event == "gc_catalog_read_covered":
            self.covered_gone += int(event_dict.get("compacted_meanwhile", 0))
        if method in ("error", "exception", "critical") and len(self.errors) < 20:
            detail = {k: v for k, v in event_dict.items() if k not in ("event", "exc_info")}
            self.errors.append(f"{event} {detail}")
        raise structlog.DropEvent


@contextlib.contextmanager
def counted_log_events() -> Iterator[LogTally]:
    """Route structlog to a `LogTally` (info and up) while the context lasts. The
    processor list is changed in place, as `structlog.testing.capture_logs` does, so
    loggers bound before keep working."""
    tally = LogTally()
    config = structlog.get_config()
    processors = config["processors"]
    saved, wrapper = list(processors), config["wrapper_class"]
    processors.clear()
    processors.append(tally)
    structlog.configure(
        processors=processors, wrapper_class=structlog.make_filtering_bound_logger(logging.INFO)
    )
    try:
        yield tally
    finally:
        processors.clear()
        processors.extend(saved)
        structlog.configure(processors=processors, wrapper_class=wrapper)


@dataclass
class LongRunReport:
    config: LongRunConfig
    violations: list[str] = field(default_factory=list)
    shortfalls: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    figures: Figures = field(default_factory=Figures)
    log_events: Counter[str] = field(default_factory=Counter)
    log_errors: list[str] = field(default_factory=list)
    rollup_failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    """This process's CPU time over the run (the wall time also counts a loaded machine)."""

    @property
    def ok(self) -> bool:
        return not self.violations and not self.shortfalls

    def render(self) -> str:
        lines = [render(self.figures, self.config, wall_s=self.wall_s, cpu_s=self.cpu_s)]
        counted = ("collector_kills", "collector_lost_flushes", "resends", "send_retries")
        lines.append("; ".join(f"{name}: {self.stats[name]}" for name in counted))
        lines.append(
            f"audits completed: {self.log_events['audit_finished']}; GC runs: "
            f"{self.log_events['gc_run_finished']}; stage errors: "
            f"{ {k: v for k, v in self.stats.items() if k.startswith('stage_errors')} }"
        )
        lines += [f"rollup stand-in run failed (retried): {text}" for text in self.rollup_failures]
        lines += [f"VIOLATION {text}" for text in self.violations[:20]]
        lines += [f"SHORTFALL {text}" for text in self.shortfalls]
        lines.append("PASS" if self.ok else "FAIL")
        return "\n".join(lines)


def run_longrun(config: LongRunConfig) -> LongRunReport:
    """Run the long world to its end on virtual time; see the module docstring."""
    report = LongRunReport(config)
    started, cpu = time.monotonic(), time.process_time()
    with counted_log_events() as tally:
        run_virtual(lambda: _run(config, report, tally))
    report.wall_s = time.monotonic() - started
    report.cpu_s = time.process_time() - cpu
    report.log_events = tally.events
    report.log_errors = tally.errors
    return report


async def _run(config: LongRunConfig, report: LongRunReport, tally: LogTally) -> None:
    world = LongRunWorld(config, violations=report.violations, stats=report.stats)
    end = config.duration_s
    stop = asyncio.Event()
    reconciler = asyncio.ensure_future(world.reconciler.run())
    rollup = asyncio.ensure_future(world.rollup.run(stop))
    sampler = asyncio.ensure_future(world.sample(stop))
    await asyncio.gather(
        world.run_agents(end - config.quiet_s),
        world.plant_orphans(end),
        world.kill_collectors(end - config.quiet_s),
        world.lose_flushes(end - config.quiet_s),
    )
    await world.clock.sleep(end - world.clock.monotonic())
    world.watch.samples.append(
        await sample_bounds(world.memory, at_s=end, now_ns=world.clock.now_ns())
    )
    report.figures = measure(
        world.watch,
        config,
        end_s=end,
        collisions=tally.covered_gone,
        collision_runs=tally.events["gc_catalog_read_covered"],
        stalled=_total(world.reconciler.metrics.gc_stalled),
    )
    report.shortfalls = shortfalls(report.figures, config)
    await world.reconciler.stop(grace_s=600.0)
    try:
        await reconciler
    except (StoreError, LeaseHeld) as exc:  # releasing the lease failed: harmless here
        report.stats[f"reconciler_exit_{type(exc).__name__}"] += 1
    stop.set()
    await rollup
    report.rollup_failures = world.rollup.failures
    await sampler
    await world.stop_collectors()
    for delayed in world.delayed:
        await delayed.drain()
    for metric in world.reconciler.metrics.stage_errors.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.value:
                report.stats[f"stage_errors_{sample.labels['stage']}"] += int(sample.value)
    await _final_checks(world, report)


async def _final_checks(world: LongRunWorld, report: LongRunReport) -> None:
    """A fault-free full audit, then the end-state invariants (see the module docstring)."""
    ctx = await open_context(
        world.watched,
        settings=world.settings,
        clock=world.clock,
        rng=random.Random(f"{world.config.seed}/final-audit"),
        metrics=ReconcilerMetrics(clock=world.clock),
        owner=RECONCILER_OWNER,
    )
    audit = await run_full_audit(ctx)
    if audit.status != "completed":
        report.violations.append(f"final audit did not complete: {audit}")
    report.violations += await check_store(
        world.memory,
        world.acked,
        [],
        retired=await retired_manifest_ids(world.memory),
        rolled_up=await ledger_manifest_ids(world.memory),
    )
    report.violations += await retention_problems(world.memory)
    report.violations += gc_log_violations(
        await read_gc_log(world.memory),
        horizon_s=world.settings.gc.retry_horizon_s,
        grace_s=world.settings.gc.mark_grace_s,
    )


def _total(counter: Any) -> int:
    return int(
        sum(
            sample.value
            for metric in counter.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        )
    )
