"""The agents of a simulated world (`SimAgents`), and what they were told.

Every batch is sent at a seeded moment to a random collector, retried after a 503; some
are re-sent much later (old content again: after GC may have marked it), some get a
conflicting twin, some were "pre-landed" as orphan blobs (a collector that crashed after
the blob: half of them flushed its ``blob`` log row first, half did not, so only an
audit's listing finds those), some are never sent again (true orphans). With raw
retention, around when the first hour's blobs should be gone, some acknowledged batches
are re-sent or get a conflicting twin once more.

``X-Lightmetrics-Resend`` (PROTOCOL §3.2) as the reference agent sends it: on every retry
after a 503; on a share of the later re-sends (``resend_header_rate``: the agent
remembered the frame); and on the first send here of a share of the conflicting twins
(``twin_sent_before_rate``: sent before without an answer; half of them left their blob
as an orphan at the start, which the GC may be deleting when the twin comes again), so
the re-send conflict path (manifest read first, then step 1 for the submitted frame)
runs against blobs absent, present, marked and being deleted.

With bundles (``SimConfig.bundles``): races of one identity on two collectors at once
(`SimAgents._race`), agents gone after a 503, and orphan bundles written again
(`SimAgents.bundle_landing`), each drawing from streams of its own.

What the agents were told (`SimAgents.acked`, `SimAgents.conflict_views`) and the true
orphans they left are what `chaos.sim.simulation` checks the settled store against.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
import uuid
from dataclasses import dataclass

from chaos.sim.frames import SimHeader, sim_frame
from chaos.sim.world import SimWorld
from collector.accept import AcceptanceUnavailable, Accepted, IdentityConflictFound
from index.log_writer import IndexLogWriter
from index.rows import IndexRow, blob_row
from protocol import keys, records
from protocol.bundle import encode_bundle
from store.base import ObjectStore
from store.errors import StoreError


@dataclass(frozen=True, slots=True)
class _Batch:
    header: SimHeader
    frame: bytes

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.frame).hexdigest()

    @property
    def identity(self) -> keys.BatchIdentity:
        return self.header.identity


class SimAgents:
    """The agents sending to one world's collectors (see the module docstring)."""

    def __init__(self, world: SimWorld) -> None:
        self._world = world
        # identity -> every hash acknowledged (200) for it, and the conflicts seen
        self.acked: dict[keys.BatchIdentity, set[str]] = {}
        self.conflict_views: list[tuple[keys.BatchIdentity, str]] = []
        self.true_orphans: set[str] = set()
        """Hashes of blobs planted as orphans whose batch is never sent."""
        self.answered_503: set[str] = set()
        """Hashes of frames a send of which was answered 503 (its outcome unknown)."""

    def batches(self) -> list[_Batch]:
        config = self._world.config
        made = []
        for agent in range(config.agents):
            boot = uuid.UUID(int=random.Random(f"{config.seed}/boot/{agent}").getrandbits(128))
            for b in range(config.batches_per_agent):
                header = SimHeader(f"sim-agent-{agent}", boot, b * 10, b * 10 + 9, 10)
                made.append(_Batch(header, sim_frame(header, config.seed, "original")))
        return made

    async def send(
        self,
        batch: _Batch,
        rng: random.Random,
        *,
        attempts: int = 6,
        resend: bool = False,
        first: int | None = None,
        persistent: bool = False,
    ) -> Accepted | None:
        """Send until an answer (or ``attempts`` 503s); returns the acknowledgement.
        ``resend``: the first attempt carries the re-send header (every retry does).
        ``first``: the collector of the first attempt (else a random one, as for the rest).
        ``persistent``: never gone after a 503 (``agent_gone_rate``): a check judging the
        answer needs every attempt (a 503 is allowed under faults, PROTOCOL §3.2 step 2)."""
        world = self._world
        # Its own stream: the worlds without stay as they were. ``persistent`` only skips
        # the draw (a fresh Random per call), so no other stream moves.
        if world.config.agent_gone_rate and not persistent:
            gone_rng = random.Random(f"{world.config.seed}/gone/{batch.sha}/{resend}")
            if gone_rng.random() < world.config.agent_gone_rate:
                attempts = 1
        for _ in range(attempts):
            if first is None:
                acceptor = world.acceptors[rng.randrange(len(world.acceptors))]
            else:
                acceptor, first = world.acceptors[first], None
            if resend:
                world.report.stats["sends_with_resend_header"] += 1
            try:
                outcome = await acceptor.accept(batch.header, batch.frame, batch.sha, resend=resend)
            except AcceptanceUnavailable:
                world.report.stats["answer_503"] += 1
                self.answered_503.add(batch.sha)
                resend = True  # the agent sent it before: its retries carry the header
                await world.clock.sleep(rng.uniform(0.2, 2.0))
                continue
            if isinstance(outcome, Accepted):
                world.report.stats[
                    "answer_200_duplicate" if outcome.duplicate else "answer_200"
                ] += 1
                if outcome.manifest.frame_sha256 != batch.sha:
                    world.violation(
                        f"200 for {batch.identity} names hash {outcome.manifest.frame_sha256[:12]}, sent {batch.sha[:12]}"
                    )
                self.acked.setdefault(batch.identity, set()).add(batch.sha)
                return outcome
            assert isinstance(outcome, IdentityConflictFound)
            world.report.stats["answer_409"] += 1
            if resend:
                world.report.stats["answer_409_resend_header"] += 1
            self.conflict_views.append((batch.identity, outcome.accepted.frame_sha256))
            return None
        return None

    async def run_batch(self, batch: _Batch, index: int) -> None:
        """Everything that happens to one batch, as its seeded plan says."""
        world, config = self._world, self._world.config
        rng = random.Random(f"{config.seed}/plan/{index}")
        pre_orphan = rng.random() < config.orphan_rate
        give_up = rng.random() < config.give_up_rate
        resend = rng.random() < config.resend_rate
        conflict = rng.random() < config.conflict_rate
        send_at = rng.uniform(0.0, config.send_window_s)
        logged = rng.random() < 0.5
        # (No draw when off: the worlds without crash landings stay as they were.)
        if config.crash_landing_rate and rng.random() < config.crash_landing_rate:
            await self._crash_landing(batch, rng, twin=rng.random() < 0.5)
            return
        if config.race_rate:  # its own stream, as for the header below
            race_rng = random.Random(f"{config.seed}/race/{index}")
            if race_rng.random() < config.race_rate:
                await world.clock.sleep(send_at)
                await self._race(batch, race_rng)
                return
        # The header and the twin's history draw from their own stream: the plan above
        # is what it was before they existed.
        agent_rng = random.Random(f"{config.seed}/agent/{index}")
        resend_header = agent_rng.random() < config.resend_header_rate
        twin_sent_before = agent_rng.random() < config.twin_sent_before_rate
        if conflict and not give_up and twin_sent_before and agent_rng.random() < 0.5:
            # The twin's earlier attempt wrote its blob, then its collector crashed.
            await self._land_orphan(self._twin(batch), logged=agent_rng.random() < 0.5)
            world.report.stats["twin_orphans_planted"] += 1
        if pre_orphan:  # an earlier attempt wrote the blob, then its collector crashed
            await self._land_orphan(batch, logged=logged)
            world.report.stats["orphans_planted"] += 1
            if give_up:
                self.true_orphans.add(batch.sha)
        if give_up:
            return
        await world.clock.sleep(send_at)
        acked = await self.send(batch, rng)
        if resend:  # old content again, possibly after the GC marked or deleted it
            await world.clock.sleep(rng.uniform(0.0, config.send_window_s))
            world.report.stats["resends"] += 1
            await self.send(batch, rng, resend=resend_header)
        if conflict and acked is not None:
            await world.clock.sleep(rng.uniform(0.0, config.send_window_s / 4))
            twin = self._twin(batch)
            if await self.send(twin, rng, resend=twin_sent_before) is not None:
                world.violation(f"conflicting frame for {batch.identity} was acknowledged")
        if acked is not None and world.rollup is not None:
            await self._after_raw_retention(batch, index)

    async def _race(self, batch: _Batch, rng: random.Random) -> None:
        """Two collectors race one identity (PROTOCOL §3.10: in two different bundles when
        both are busy): the batch to one, at the same moment the same frame (an agent that
        gave up on its first attempt too soon) or a conflicting one to another. Whatever
        the interleaving, at most one frame of the identity is acknowledged."""
        world = self._world
        other = self._twin(batch) if rng.random() < 0.5 else batch
        first = rng.randrange(len(world.acceptors))
        second = (first + 1 + rng.randrange(max(1, len(world.acceptors) - 1))) % len(
            world.acceptors
        )
        world.report.stats["races" if other is batch else "races_conflicting"] += 1
        await asyncio.gather(
            self.send(batch, random.Random(rng.random()), first=first),
            self.send(other, random.Random(rng.random()), first=second),
        )

    async def bundle_landing(self, group: int) -> None:
        """An orphan bundle that lands again (``SimConfig.bundle_landings``): the frames of
        three new batches, the last two of which an earlier attempt wrote as a bundle (its
        collector crashed; but for the landings before a mark, half the time after flushing
        the bundle's ``blob`` row), are sent again at once to a collector with one write slot: the first frame takes the
        slot as a frame blob, the other two wait and are written as the same bundle (412).
        Half the time that is once the GC has marked the bundle, at a seeded moment within
        its grace plus the retry horizon (the §3.5 collector side runs on the bundle while
        the GC may be deleting it); else as soon as an audit has nominated it (within half
        a second: before the GC marks it, mostly), through a collector that crashes before flushing its log rows, so only rule
        7's reading of every frame's manifest keeps the bundle. Half the time the middle
        batch was accepted before, elsewhere: its frame in the bundle is a duplicate (dead
        bytes), and the last frame alone names the bundle."""
        world, config = self._world, self._world.config
        rng = random.Random(f"{config.seed}/bundle-landing/{group}")
        boot = uuid.UUID(int=rng.getrandbits(128))
        batches = []
        for i in range(3):
            header = SimHeader(f"sim-landing-{group}", boot, i * 10, i * 10 + 9, 10)
            batches.append(_Batch(header, sim_frame(header, config.seed, "bundle landing")))
        before_mark, accepted_before = rng.random() < 0.5, rng.random() < 0.5
        await world.clock.sleep(rng.uniform(0.0, config.send_window_s))
        if accepted_before:
            await self.send(batches[1], random.Random(rng.random()))
        planted = encode_bundle([b.frame for b in batches[1:]])
        planted_ns = world.clock.now_ns()
        await world.watched.put(planted.key, planted.data, if_none_match=True)
        world.report.stats["bundle_landings_planted"] += 1
        if rng.random() < 0.5 and not before_mark:
            await self._log_crashed(blob_row(planted.sha256, planted_ns, bundle=True), planted.key)
        horizon_s = config.retry_horizon_s
        max_wait_s = config.send_window_s + 4 * config.audit_interval_s
        if before_mark:
            horizon_ns = int(horizon_s * keys.NS_PER_S)
            if not await world.audit_started_after(planted_ns + horizon_ns, max_wait_s=max_wait_s):
                return
            await world.clock.sleep(rng.uniform(0.0, 0.5))
            world.report.stats["bundle_landings_before_mark"] += 1
        else:
            if not await world.marked(planted.sha256, max_wait_s=max_wait_s):
                return
            grace_s = world.settings.gc.mark_grace_s
            await world.clock.sleep(rng.uniform(0.0, grace_s + horizon_s))
        world.report.stats["bundle_landings_sent"] += 1
        bundles = world.bundle_options()
        assert bundles is not None
        one_slot = dataclasses.replace(
            bundles, limits=dataclasses.replace(bundles.limits, max_in_flight=1)
        )
        acceptor = world.crashing_acceptor(bundles=one_slot)

        async def land(batch: _Batch) -> None:
            try:
                outcome = await acceptor.accept(batch.header, batch.frame, batch.sha)
            except AcceptanceUnavailable:
                world.report.stats["bundle_landings_503"] += 1
                return
            if isinstance(outcome, Accepted):
                self.acked.setdefault(batch.identity, set()).add(batch.sha)
            else:
                self.conflict_views.append((batch.identity, outcome.accepted.frame_sha256))

        await asyncio.gather(*(land(b) for b in batches))

    def _twin(self, batch: _Batch) -> _Batch:
        """The conflicting twin of ``batch``: another frame of its identity."""
        return _Batch(batch.header, sim_frame(batch.header, self._world.config.seed, "conflict"))

    async def _crash_landing(self, batch: _Batch, rng: random.Random, *, twin: bool) -> None:
        """An earlier attempt left an orphan blob — the batch's own frame, or (``twin``) a
        conflicting frame of its identity while the batch itself is accepted normally —
        which lands only once an audit has nominated it for the GC, through a collector
        that crashes before flushing its log rows: its manifest (or quarantine record) is
        known to the store alone (PROTOCOL §3.5 rule 7)."""
        world, config = self._world, self._world.config
        planted = _Batch(batch.header, sim_frame(batch.header, config.seed, "crash landing"))
        if not twin:
            planted = batch
        landed_ns = world.clock.now_ns()
        await self._land_orphan(planted, logged=False)
        world.report.stats["crash_landings_planted"] += 1
        if twin:
            await world.clock.sleep(rng.uniform(0.0, config.send_window_s / 4))
            if await self.send(batch, rng) is None:
                return
        horizon_ns = int(config.retry_horizon_s * keys.NS_PER_S)
        if not await world.audit_started_after(
            landed_ns + horizon_ns, max_wait_s=config.send_window_s + 4 * config.audit_interval_s
        ):
            return
        acceptor = world.crashing_acceptor()
        try:
            outcome = await acceptor.accept(planted.header, planted.frame, planted.sha)
        except AcceptanceUnavailable:
            world.report.stats["crash_landings_503"] += 1
            return
        world.report.stats["crash_landings"] += 1
        if isinstance(outcome, Accepted):
            if twin:
                world.violation(f"conflicting crash landing for {batch.identity} was acknowledged")
            self.acked.setdefault(planted.identity, set()).add(planted.sha)
        else:
            self.conflict_views.append((planted.identity, outcome.accepted.frame_sha256))

    async def _after_raw_retention(self, batch: _Batch, index: int) -> None:
        """Around when raw retention deleted the first hour's blobs: a re-send (must be a
        duplicate, whether its blob is still there or not), or a conflicting twin (must
        be a 409; its quarantine record names the accepted blob, which must then stay)."""
        world, config = self._world, self._world.config
        rng = random.Random(f"{config.seed}/after-retention/{index}")
        resend = rng.random() < config.late_resend_rate
        conflict = rng.random() < config.late_conflict_rate
        agent_rng = random.Random(f"{config.seed}/agent-after-retention/{index}")
        resend_header = agent_rng.random() < config.resend_header_rate
        twin_sent_before = agent_rng.random() < config.twin_sent_before_rate
        at_s = world.retention_due_s + rng.uniform(
            -config.audit_interval_s, config.audit_interval_s
        )
        if not (resend or conflict):
            return
        await world.clock.sleep(at_s - world.clock.monotonic())
        if conflict:
            twin = _Batch(batch.header, sim_frame(batch.header, config.seed, "late conflict"))
            world.report.stats["late_conflicts"] += 1
            if await self.send(twin, rng, attempts=20, resend=twin_sent_before) is not None:
                world.violation(f"late conflicting frame for {batch.identity} was acknowledged")
        if resend:
            gone = await _raw_object_gone(world.memory, batch)
            world.report.stats["late_resends_blob_gone" if gone else "late_resends"] += 1
            # PROTOCOL §4.1: raw retention keeps the manifests, so a re-send is still a
            # duplicate; the agent keeps trying until it is answered (see ``persistent``).
            again = await self.send(batch, rng, attempts=20, resend=resend_header, persistent=True)
            if again is None:
                world.violation(f"late re-send of {batch.identity} got no 200 (raw gone: {gone})")
            elif not again.duplicate:
                world.violation(f"late re-send of {batch.identity} was accepted anew")

    async def _land_orphan(self, batch: _Batch, *, logged: bool) -> None:
        """The blob (no faults: the write landed); with ``logged``, its ``blob`` log row
        too, flushed by the collector before it crashed."""
        world = self._world
        now = world.clock.now_ns()
        await world.watched.put(keys.raw_blob_key(batch.sha), batch.frame, if_none_match=True)
        if logged:
            await self._log_crashed(blob_row(batch.sha, now), batch.sha)
            world.report.stats["orphans_logged"] += 1

    async def _log_crashed(self, row: IndexRow, name: str) -> None:
        """``row`` flushed by a collector before it crashed."""
        world = self._world
        log = IndexLogWriter(
            store=world.watched,
            clock=world.clock,
            rng=random.Random(f"{world.config.seed}/crashed/{name}"),
            writer_id="sim-crashed-collector",
        )
        log.append(row)
        await log.flush()


async def _raw_object_gone(store: ObjectStore, batch: _Batch) -> bool:
    """Whether the raw object (frame blob or bundle, PROTOCOL §3.10) the accepted manifest
    of ``batch``'s identity names is absent (a memory store fails only with NotFound)."""
    try:
        body, _etag = await store.get(keys.accepted_manifest_key(batch.identity))
        await store.head(records.AcceptedManifest.from_json(body, reads_bundles=True).raw_blob_key)
    except StoreError:
        return True
    return False
