"""Deterministic in-process simulation of acceptance, the index, the reconciler and its GC.

One call, `simulate(config)` (`chaos.sim.config.SimConfig`), builds a world on virtual
time (`chaos.sim.runtime`, `chaos.sim.world`):

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
- agents (`chaos.sim.agents`): every batch is sent at a seeded moment to a random
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

With ``raw_retention_s`` (PROTOCOL §4.1; `chaos.sim.retention`): a simulated rollup
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
the report counts how each bundled frame ended (`chaos.sim.checks.bundle_states`);
``quarantined_bundles``, ``bundles_unlike_index`` and ``bundles_retiring_apart`` plant
faults no correct writer leaves (`PlantedFaults`), for the GC mutants only they flag.
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
import hashlib
import random
import tempfile
import uuid
from pathlib import Path

from chaos.auditor import gc_log_violations
from chaos.sim.agents import SimAgents
from chaos.sim.checks import bundle_states, check_store
from chaos.sim.config import SimConfig, SimReport
from chaos.sim.frames import SimHeader, sim_frame
from chaos.sim.retention import gc_deletions_by_reason, retention_problems, retired_manifest_ids
from chaos.sim.runtime import run_virtual
from chaos.sim.spool import SimSpool
from chaos.sim.world import FIRST_HOUR_LEFT_S, RECONCILER_OWNER, SimWorld
from protocol import keys, records
from protocol._bundle_index import pack_tail
from protocol.bundle import encode_bundle
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
    with tempfile.TemporaryDirectory(prefix="lm-sim-spool-") as spool_dir:
        return await _run_in(config, Path(spool_dir))


async def _run_in(config: SimConfig, spool_dir: Path) -> SimReport:
    report = SimReport(config)
    world = SimWorld(config, report)
    agents = SimAgents(world)
    spool = SimSpool(world, agents, spool_dir) if config.spool_agents else None
    for log in world.logs:
        log.start()
    agents_done, rollup_stop = asyncio.Event(), asyncio.Event()
    reconciler = asyncio.ensure_future(world.run_reconciler(agents_done))
    rollup = asyncio.ensure_future(world.rollup.run(rollup_stop)) if world.rollup else None
    faults = PlantedFaults(world)
    await asyncio.gather(
        *[agents.run_batch(b, i) for i, b in enumerate(agents.batches())],
        *[agents.bundle_landing(group) for group in range(config.bundle_landings)],
        *[faults.quarantined_bundle(group) for group in range(config.quarantined_bundles)],
        *[faults.bundle_unlike_its_index(group) for group in range(config.bundles_unlike_index)],
        *[faults.bundle_retiring_apart(group) for group in range(config.bundles_retiring_apart)],
        *([spool.run()] if spool is not None else []),
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
        planted=faults.records,
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


class PlantedFaults:
    """Records and bundles no correct writer leaves, planted as faults (a buggy writer, bit
    rot), each against a GC mutant of issue 33 that only such a world flags: a bundle is
    written (an orphan, its collector crashed; or with raw retention, one of the first
    hour), and once the GC marked it a record naming it lands through a collector that
    crashed before flushing its log rows, so that only the GC's targeted proof (PROTOCOL
    §3.5 rule 7) can keep the bundle: within the first half of the mark's grace, or, when an
    audit that lists the record would keep the bundle from the proof, just after the audit
    that started past the grace (before the GC's proof; the writer breaks rule 3's premise
    too, counted, `chaos.sim.checks.WatchedStore.past_the_grace`). ``records``: the planted
    records the end state excuses (they are the faults)."""

    def __init__(self, world: SimWorld) -> None:
        self._world = world
        self.records: set[str] = set()

    async def quarantined_bundle(self, group: int) -> None:
        """``SimConfig.quarantined_bundles``: a quarantine record of the bundle's last frame
        names the bundle as its accepted blob (not well-formed, PROTOCOL §3.10: a record
        names frame blobs only); the proof must keep the bundle (an
        ``unparseable-quarantine`` problem). Its submitted frame is a frame blob, present.
        An audit that lists the record reports it and the GC then deletes nothing (as rule 5
        does), so the record reaches rule 7's quarantine LIST only when it lands after the
        listing of the audit that started past the mark's grace, before the GC's proof: past
        the grace without a veto (the writer breaks rule 3's premise too, counted as
        ``planted_past_the_grace``, not a violation)."""
        world, seed = self._world, self._world.config.seed
        rng = random.Random(f"{seed}/quarantined-bundle/{group}")
        headers = self._headers("sim-quarantined", group, rng, 2)
        bundle = encode_bundle([sim_frame(h, seed, "quarantined bundle") for h in headers])
        if not await self._orphan_marked(bundle.key, bundle.data, rng, within_grace=False):
            return
        if not await self._past_the_grace(bundle.key, rng, "quarantined_bundles_gone"):
            return
        last = headers[-1]
        twin = sim_frame(last, seed, "quarantined twin")
        twin_sha = hashlib.sha256(twin).hexdigest()
        await world.watched.put(keys.raw_blob_key(twin_sha), twin, if_none_match=True)
        identity = last.identity
        conflict = records.IdentityConflict(
            agent_id=last.agent_id,
            boot_id=str(last.boot_id),
            seq_start=last.seq_start,
            seq_end=last.seq_end,
            accepted_manifest_key=keys.accepted_manifest_key(identity),
            accepted_raw_blob_key=bundle.key,
            accepted_frame_sha256=bundle.entries[-1].frame_sha256,
            submitted_raw_blob_key=keys.raw_blob_key(twin_sha),
            submitted_frame_sha256=twin_sha,
            observed_at_unix_ns=world.clock.now_ns(),
            collector_id="sim-buggy-writer",
        )
        self.records.add(conflict.quarantine_key)
        world.watched.past_the_grace.add(conflict.quarantine_key)
        await world.watched.put(conflict.quarantine_key, conflict.to_json(), if_none_match=True)
        world.report.stats["quarantined_bundles_named"] += 1

    async def bundle_unlike_its_index(self, group: int) -> None:
        """``SimConfig.bundles_unlike_index``: a bundle whose middle frame is another valid
        frame of the same length (another identity) than the one its index entry names (the
        index's CRC intact), and a well-formed manifest of the entry's frame naming the
        bundle at that entry's range. The proof parses the frames themselves: the bundle is
        ``corrupt-blob``, never deleted. The bundle is written to the store beneath the
        watch (`chaos.sim.checks.WatchedStore` parses every bundle written)."""
        world, seed = self._world, self._world.config.seed
        rng = random.Random(f"{seed}/bundle-unlike-index/{group}")
        headers = self._headers("sim-unlike-index", group, rng, 4)
        frames = [sim_frame(h, seed, "unlike its index") for h in headers]
        indexed = encode_bundle(frames[:3])
        data = b"".join([frames[0], frames[3], frames[2]]) + pack_tail(list(indexed.entries))
        key = keys.raw_bundle_key(hashlib.sha256(data).hexdigest())
        if not await self._orphan_marked(key, data, rng, watched=False):
            return
        manifest = records.AcceptedManifest.of_frame(
            frames[1],
            accepted_at_unix_ns=world.clock.now_ns(),
            collector_id="sim-crashing-writer",
            bundle=(key, indexed.entries[1].offset),
        )
        await world.watched.put(manifest.manifest_key, manifest.to_json(), if_none_match=True)
        self.records.add(manifest.manifest_key)
        world.report.stats["bundles_unlike_index_named"] += 1

    async def bundle_retiring_apart(self, group: int) -> None:
        """``SimConfig.bundles_retiring_apart`` (with raw retention): a bundle of two frames
        written in the first hour whose first frame's manifest lands with it (known to the
        store alone: the audit catalogs it, the rollup includes it) and whose second
        frame's manifest (its create's outcome unknown to the writer) lands late, accepted
        in the same hour, once raw retention nominated the bundle for its first frame: just
        after the audit that started past the mark's grace, before the GC's proof (any
        earlier, the audit lists it and raw retention no longer nominates the bundle). The
        writer breaks PROTOCOL §3.2 (a create sent after its deadline) and rule 3's premise
        (counted as ``planted_past_the_grace``): raw retention must keep the bundle, its
        second frame never rolled up."""
        world, config, seed = self._world, self._world.config, self._world.config.seed
        if config.raw_retention_s is None:
            return
        rng = random.Random(f"{seed}/bundle-retiring-apart/{group}")
        headers = self._headers("sim-retiring-apart", group, rng, 2)
        frames = [sim_frame(h, seed, "retiring apart") for h in headers]
        bundle = encode_bundle(frames)
        await world.clock.sleep(rng.uniform(0.0, FIRST_HOUR_LEFT_S / 2))
        accepted_ns = world.clock.now_ns()
        manifests = [
            records.AcceptedManifest.of_frame(
                frame,
                accepted_at_unix_ns=accepted_ns,
                collector_id="sim-crashing-writer",
                bundle=(bundle.key, entry.offset),
            )
            for frame, entry in zip(frames, bundle.entries, strict=True)
        ]
        await world.watched.put(bundle.key, bundle.data, if_none_match=True)
        await world.watched.put(manifests[0].manifest_key, manifests[0].to_json())
        world.report.stats["planted_bundles"] += 1
        max_wait_s = world.retention_due_s + config.settle_s - world.clock.monotonic()
        if not await world.marked(bundle.sha256, max_wait_s=max_wait_s):
            return
        if not await self._past_the_grace(bundle.key, rng, "bundles_retiring_apart_gone"):
            return
        world.watched.past_the_grace.add(manifests[1].manifest_key)
        await world.watched.put(manifests[1].manifest_key, manifests[1].to_json())
        world.report.stats["bundles_retiring_apart_late"] += 1

    async def _past_the_grace(self, key: str, rng: random.Random, gone_stat: str) -> bool:
        """Waits (bounded) for the audit that starts past the marked bundle's grace, then a
        seeded moment; whether the bundle is still there and its GC's second proof not yet
        begun (else counted as ``gone_stat``: the proof came first, and the bundle went or
        is going, rightly). A record planted once the GC deleted the bundle, or once its
        mark says ``deleting`` (the second proof's reads may be done: PROTOCOL §3.5), is not
        what the proof must see; it is a fault of another kind."""
        world = self._world
        past_ns = world.clock.now_ns() + int(world.settings.gc.mark_grace_s * keys.NS_PER_S)
        max_wait_s = 4 * world.config.audit_interval_s
        if not await world.audit_started_after(past_ns, max_wait_s=max_wait_s):
            return False
        await world.clock.sleep(rng.uniform(0.0, 0.2))
        try:
            await world.memory.head(key)
        except NotFound:
            world.report.stats[gone_stat] += 1
            return False
        if await _deleting_mark(world.memory, keys.parse_raw_object_key(key)[1]):
            world.report.stats[gone_stat] += 1
            return False
        return True

    def _headers(self, agent: str, group: int, rng: random.Random, n: int) -> list[SimHeader]:
        boot = uuid.UUID(int=rng.getrandbits(128))
        return [SimHeader(f"{agent}-{group}", boot, i * 10, i * 10 + 9, 10) for i in range(n)]

    async def _orphan_marked(
        self,
        key: str,
        data: bytes,
        rng: random.Random,
        *,
        watched: bool = True,
        within_grace: bool = True,
    ) -> bool:
        """The orphan bundle written at a seeded moment, then a wait until the GC marked it
        (an audit nominated it), and with ``within_grace`` a seeded moment within the
        first half of the mark's grace (False: no mark within the run)."""
        world, config = self._world, self._world.config
        sha = keys.parse_raw_object_key(key)[1]
        await world.clock.sleep(rng.uniform(0.0, config.send_window_s))
        await (world.watched if watched else world.memory).put(key, data, if_none_match=True)
        world.report.stats["planted_bundles"] += 1
        max_wait_s = config.send_window_s + 4 * config.audit_interval_s
        if not await world.marked(sha, max_wait_s=max_wait_s):
            return False
        if within_grace:
            await world.clock.sleep(rng.uniform(0.0, world.settings.gc.mark_grace_s / 2))
        return True


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
