"""A local-spool collector and its agents in a simulated world (``SimConfig.spool_agents``;
PROTOCOL §3.4, and §3.10 "Writing", spool mode).

One collector of the world runs in ``local_spool`` mode (`SimSpool`): it answers a batch
once the frame is in its spool (`collector.local_spool.spool.LocalSpool`, in a directory of the run's
own), as `collector.app` does: 200, or 409 naming the identity's winner. A
`collector.local_spool.lander.SpoolLander` lands the spool every
``ingest.object_landing_interval_ms`` through the world's spool acceptor, with group
commit, over a faulty, delayed store. The rule checked here is the spool's: the frame
answered 200 is the one the store accepts and the one answered 409 is quarantined
(`chaos.sim.checks.check_store` judges `chaos.sim.agents.SimAgents.acked` and
``conflict_views``). It holds only if the manifest creates of one identity are sent one
after another in acknowledgement order, across bundles.

Each agent sends its batches at seeded moments. After a batch's 200, half the time a
conflicting twin of its identity follows within half a second (answered 409; it is
spooled to be quarantined): mostly before the next landing round, so both are pending in
one round and land in two windows. A third of the time the same frame comes again (200,
a duplicate). Twins and re-sends come within the retry horizon, as an agent's do, so the
landed memory still answers for the identity.

The collector restarts once, at a seeded moment within the send window: a crash, with
the lander cancelled mid-round (requests in flight land or not) and the spool opened again
over the same directory, its order rebuilt from the file names. Once every agent is done,
the spool is landed until empty, in a bounded number of rounds; frames still spooled then
are a violation.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import uuid
from pathlib import Path

from chaos.sim.agents import SimAgents
from chaos.sim.frames import SimHeader, sim_frame
from chaos.sim.world import SimWorld
from collector.local_spool.lander import SpoolLander
from collector.local_spool.spool import LocalSpool, SpoolFull
from protocol import keys, records
from store.errors import NotFound

BATCHES_PER_AGENT = 6
DRAIN_ROUNDS = 200
"""Landing rounds after the agents are done before frames still spooled are a violation
(each a landing interval apart: minutes of store faults)."""


class SimSpool:
    """The world's local-spool collector: intake, landing rounds and one restart."""

    def __init__(self, world: SimWorld, agents: SimAgents, directory: Path) -> None:
        assert world.spool_collector is not None
        self._world, self._agents, self._directory = world, agents, directory
        self._interval_s = world.settings.ingest.object_landing_interval_ms / 1000
        self._up = asyncio.Event()  # cleared while the collector restarts
        self._up.set()
        self._acked_here: set[keys.BatchIdentity] = set()
        self._spool = self._open()
        self._lander = self._lander_of(self._spool)

    def _open(self) -> LocalSpool:
        return LocalSpool(
            self._directory,
            max_pending_bytes=1 << 26,
            retry_horizon_s=self._world.settings.gc.retry_horizon_s,
            max_landed=100_000,
        )

    def _lander_of(self, spool: LocalSpool) -> SpoolLander:
        world = self._world
        assert world.spool_collector is not None
        acceptor, store = world.spool_collector
        return SpoolLander(
            spool=spool,
            acceptor=acceptor,
            store=store,
            clock=world.clock,
            interval_s=self._interval_s,
            send_window_s=world.settings.spool_send_window_s(),
        )

    async def run(self) -> None:
        """The agents and the landing rounds, one restart between; then landed to empty."""
        config = self._world.config
        rng = random.Random(f"{config.seed}/spool-collector")
        lander = asyncio.ensure_future(self._lander.run())
        agents = asyncio.gather(*(self._agent(group) for group in range(config.spool_agents)))
        await self._world.clock.sleep(rng.uniform(0.0, config.send_window_s))
        # The crash: the landing round stops wherever it was (requests in flight land or
        # not); admissions already writing finish first, as an answer is only ever given
        # once the frame is durable; new requests wait for the restarted collector.
        self._up.clear()
        await _stopped(lander)
        await self._spool.close()
        self._world.report.stats["spool_restarts"] += 1
        self._spool = self._open()
        self._lander = self._lander_of(self._spool)
        self._up.set()
        lander = asyncio.ensure_future(self._lander.run())
        await agents
        await _stopped(lander)
        await self._drain()
        await self._spool.close()
        await self._count_bundled()

    async def _count_bundled(self) -> None:
        """``spool_bundled``: acknowledged spooled batches whose manifest names a bundle."""
        for identity in self._acked_here:
            with contextlib.suppress(NotFound):
                body, _ = await self._world.memory.get(keys.accepted_manifest_key(identity))
                manifest = records.AcceptedManifest.from_json(body, reads_bundles=True)
                self._world.report.stats["spool_bundled"] += manifest.raw_offset is not None

    async def _drain(self) -> None:
        for _ in range(DRAIN_ROUNDS):
            if not self._spool.frames:
                return
            report = await self._lander.land_once()
            self._world.report.stats["spool_landed_at_the_end"] += report.landed
            await self._world.clock.sleep(self._interval_s)
        self._world.violation(
            f"the spool still holds {self._spool.frames} acknowledged frames "
            f"after {DRAIN_ROUNDS} landing rounds"
        )

    async def _agent(self, group: int) -> None:
        world, config = self._world, self._world.config
        rng = random.Random(f"{config.seed}/spool-agent/{group}")
        boot = uuid.UUID(int=rng.getrandbits(128))
        for i in range(BATCHES_PER_AGENT):
            await world.clock.sleep(rng.uniform(0.0, 2 * config.send_window_s / BATCHES_PER_AGENT))
            header = SimHeader(f"sim-spool-{group}", boot, i * 10, i * 10 + 9, 10)
            frame = sim_frame(header, config.seed, "spooled")
            if not await self._send(header, frame):
                continue
            follow_up = rng.random()
            if follow_up < 0.5:
                await world.clock.sleep(rng.uniform(0.0, 0.5))
                await self._send(header, sim_frame(header, config.seed, "spooled twin"))
                world.report.stats["spool_twins"] += 1
            elif follow_up < 0.5 + 1 / 3:
                await world.clock.sleep(rng.uniform(0.0, config.retry_horizon_s / 2))
                await self._send(header, frame)

    async def _send(self, header: SimHeader, frame: bytes) -> bool:
        """One POST to the spool collector, answered as `collector.app` answers it in
        ``local_spool`` mode; whether it was answered 200."""
        identity = header.identity
        sha = hashlib.sha256(frame).hexdigest()
        await self._up.wait()
        try:
            answer = await self._spool.add(identity, sha, frame)
        except SpoolFull:
            self._world.violation(f"the spool was full at {self._spool.frames} frames")
            return False
        if answer.conflict_sha256 is not None:
            self._agents.conflict_views.append((identity, answer.conflict_sha256))
            self._world.report.stats["spool_409"] += 1
            return False
        self._agents.acked.setdefault(identity, set()).add(sha)
        self._acked_here.add(identity)
        self._world.report.stats["spool_200"] += 1
        return True


async def _stopped(task: asyncio.Future[None]) -> None:
    """Cancel ``task`` (a lander's rounds) and wait until it has stopped."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
