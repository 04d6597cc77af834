"""Deterministic in-process simulation of acceptance, the index, the reconciler and its GC.

One call, `simulate(config)` (`chaos.sim_config.SimConfig`), builds a world on virtual
time (`chaos.sim_runtime`, `chaos.sim_world`):

- a `MemoryStore` (the bucket), watched by `WatchedStore`, which checks the GC's safety
  at the moment each operation is applied: no raw blob is deleted while an accepted
  manifest or quarantine record names it, no manifest or quarantine record is created
  without its (submitted) blob, no quarantine record says its accepted blob is present
  while it is missing, and no record lands on a raw object whose GC mark is older than
  the grace with no veto (rule 3's premise);
- ``collectors`` `BatchAcceptor`s, each with its `IndexLogWriter` (rows buffered and
  flushed as log segments every ``flush_s``), each through a seeded `DelayedStore`
  (latency; requests in flight land even if their caller gave up) and a seeded
  `FaultyStore` (409, 503, lost answers, unknown outcomes, hangs);
- agents (`chaos.sim_agents`): every batch is sent at a seeded moment to a random
  collector, retried after a 503; some are re-sent much later (old content again: after
  GC may have marked it), some get a conflicting twin, some were "pre-landed" as orphan
  blobs (a collector that crashed after the blob: half of them flushed its ``blob`` log
  row first, half did not, so only an audit's listing finds those), some are never sent
  again (true orphans); retries and some re-sends carry ``X-Lightmetrics-Resend``, as do
  some twins the agent had sent before (their blob absent, or an orphan the GC may be
  deleting), so the re-send conflict path runs too;
- the reconciler daemon (`reconciler.daemon.Reconciler.run`, through its own faulty
  store): steady passes over the log every ``reconciler_interval_s``, full audits when
  due, catalog compaction (the world starts shortly before an hour ends, so the first
  hour settles and is compacted), and the GC through `reconciler.gc.run.run_gc` with short
  horizons, from the start until ``settle_s`` after the last agent is done.

With ``raw_retention_s`` (PROTOCOL §4.1; `chaos.sim_retention`): a simulated rollup
commits ledgers of the cataloged batches (with a seeded lag; a few batches never, so
their hour can never retire), and the world runs until the first hour's blobs can have
been retired and deleted; around then some acknowledged batches are re-sent (a
duplicate, whether the blob is still there or not) or get a conflicting twin (a 409,
whose quarantine record must then keep the accepted blob). `WatchedStore` checks each
deletion against raw retention's rule, and the end state for retired blobs only.

With ``bundles`` (PROTOCOL §3.10): the collectors run group commit, so frames that
arrive while a collector's raw writes are in flight share one bundle; agents may race one
identity on two collectors (``race_rate``), may be gone after a 503 (``agent_gone_rate``),
and orphan bundles may be written again once the GC marked them (``bundle_landings``);
the report counts how each bundled frame ended (`chaos.sim_checks.bundle_states`).
Without, nothing of this draws from the seed.

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
import random

from chaos.auditor import gc_log_violations
from chaos.sim_agents import SimAgents
from chaos.sim_checks import bundle_states, check_store
from chaos.sim_config import SimConfig, SimReport
from chaos.sim_retention import gc_deletions_by_reason, retention_problems, retired_manifest_ids
from chaos.sim_runtime import run_virtual
from chaos.sim_world import RECONCILER_OWNER, SimWorld
from protocol import keys, records
from reconciler.audit.run import run_full_audit
from reconciler.context import open_context
from reconciler.gc.log import read_gc_log
from reconciler.metrics import ReconcilerMetrics
from store.errors import NotFound
from store.memory import MemoryStore


def simulate(config: SimConfig) -> SimReport:
    """Run one simulated world to the end on virtual time; see the module docstring."""
    return run_virtual(lambda: _run(config))


async def _run(config: SimConfig) -> SimReport:
    report = SimReport(config)
    world = SimWorld(config, report)
    agents = SimAgents(world)
    for log in world.logs:
        log.start()
    agents_done, rollup_stop = asyncio.Event(), asyncio.Event()
    reconciler = asyncio.ensure_future(world.run_reconciler(agents_done))
    rollup = asyncio.ensure_future(world.rollup.run(rollup_stop)) if world.rollup else None
    await asyncio.gather(
        *[agents.run_batch(b, i) for i, b in enumerate(agents.batches())],
        *[agents.bundle_landing(group) for group in range(config.bundle_landings)],
    )
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
    _count_faults(world)
    await _count_true_orphans(world, agents.true_orphans)
    report.violations += await check_store(
        world.memory,
        agents.acked,
        agents.conflict_views,
        retired=await retired_manifest_ids(world.memory),
    )
    report.violations += await retention_problems(world.memory)
    report.violations += gc_log_violations(
        await read_gc_log(world.memory),
        horizon_s=world.settings.gc.retry_horizon_s,
        grace_s=world.settings.gc.mark_grace_s,
    )
    for reason, count in (await gc_deletions_by_reason(world.memory)).items():
        report.stats[f"gc_deleted_{reason.replace('-', '_')}"] += count
    if config.bundles:
        report.stats += await bundle_states(
            world.memory, world.watched.bundled, agents.answered_503
        )
    return report


async def _final_audit(world: SimWorld) -> None:
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


def _count_faults(world: SimWorld) -> None:
    """Requests that landed after their caller gave up, and every fault injected."""
    stats = world.report.stats
    stats["late_landings"] += sum(d.late_landings for d in world.delayed)
    stats["late_blob_deletes"] += sum(d.late_by_kind["delete raw-blobs"] for d in world.delayed)
    for faulty in world.faulty:
        for (op, fault), count in faulty.injected.items():
            stats[f"fault_{op}_{fault.value}"] += count


async def _count_true_orphans(world: SimWorld, true_orphans: set[str]) -> None:
    """How many true orphans the GC deleted, and how many a ``deleting`` mark still holds."""
    stats = world.report.stats
    present = {info.key async for info in world.memory.list(keys.RAW_BLOBS_PREFIX)}
    stats["orphans_true"] = len(true_orphans)
    stats["orphans_true_deleted"] = sum(
        keys.raw_blob_key(sha) not in present for sha in true_orphans
    )
    stats["orphans_true_held_deleting"] = sum(
        [
            keys.raw_blob_key(sha) in present and await _deleting_mark(world.memory, sha)
            for sha in true_orphans
        ]
    )


async def _deleting_mark(store: MemoryStore, sha: str) -> bool:
    """Whether a ``deleting`` mark holds the blob: one whose state write had an unknown
    outcome waits for the lease it records to expire (`reconciler.gc.delete`), and the
    worlds' lease lasts 10 days."""
    try:
        body, _etag = await store.get(keys.gc_mark_key(sha))
    except NotFound:
        return False
    return records.GcMark.from_json(body).state == "deleting"


__all__ = ["SimConfig", "SimReport", "simulate"]
