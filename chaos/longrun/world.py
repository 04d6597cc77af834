"""The long simulated world (`LongRunWorld`): the bucket, collectors that are killed and
restarted, the reconciler daemon, the rollup stand-in, and what drives them — agents at a
steady rate with re-sends, hourly orphans, kills and lost flushes.

Each collector process (`CollectorProcess`) is a `BatchAcceptor` and its `IndexLogWriter`
over a `ProcessGate`: once the process is killed every request it would still make hangs
(a dead process sends nothing; requests already sent land, as `DelayedStore` lets them),
the requests it was serving are cancelled (the agent sees its connection reset and
retries elsewhere), and its buffered log rows are gone. A *lost flush* is a kill at the
moment the writer cuts a segment, before its PUT is sent: the rows of that flush never
reach the store. A killed process is replaced at once by a new one (a new writer id).

Kills come every U(``kill_every_s``) and take the first collector seen holding unflushed
rows, so that a kill loses some; lost flushes every U(``lost_flush_every_s``).

Every process sees the bucket through seeded latency and requests that time out as an S3
client's do (`chaos.longrun.stores.RequestTimeouts`); collectors also through faults
(`chaos.sim.world.collector_fault_rates`) and late landings, the reconciler and the rollup
through none (the claims about the steady pass assume its own requests succeed: the short
simulation, `chaos.sim.simulation`, is where the reconciler meets faults). The world's
timeline is `chaos.longrun.watch.LongRunWatch`; the run and its figures are
`chaos.longrun.run`.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from collections import Counter
from dataclasses import dataclass

from chaos.faulty_store import Fault, FaultyStore
from chaos.longrun.config import LongRunConfig, longrun_settings
from chaos.longrun.ledger_rollup import IndexRollup, LedgerIds
from chaos.longrun.stores import ProcessGate, RequestTimeouts
from chaos.longrun.watch import LongRunWatch, PlantedOrphan, sample_bounds
from chaos.sim.checks import WatchedStore
from chaos.sim.frames import SimHeader
from chaos.sim.retention import RetentionRule
from chaos.sim.runtime import DelayedStore, S3LikeRetries, SimClock
from chaos.sim.world import RECONCILER_OWNER, collector_fault_rates
from collector.accept import AcceptanceUnavailable, Accepted, BatchAcceptor, IdentityConflictFound
from index.log_writer import IndexLogWriter
from index.rows import blob_row
from protocol import keys
from protocol.frame_encode import encode_frame, points_table
from reconciler.daemon import Reconciler
from reconciler.metrics import ReconcilerMetrics
from store.base import ObjectStore
from store.memory import MemoryStore
from store.retry import Backoff

WORLD_START_NS = 1_760_000_000 // 3600 * 3600 * keys.NS_PER_S + 3600 * keys.NS_PER_S
"""An hour's start: the world's hours are whole."""
Outcome = Accepted | IdentityConflictFound


class CollectorProcess:
    """One incarnation of a collector (see the module docstring)."""

    def __init__(self, world: LongRunWorld, slot: int, incarnation: int) -> None:
        config, settings = world.config, world.settings
        self.name = f"lr-collector-{slot}-{incarnation}"
        self.gate = ProcessGate(
            world.collector_stores[slot], on_lost_flush=lambda: world.lost_flush(slot)
        )
        seed = config.seed
        self.writer = IndexLogWriter(
            store=self.gate,
            clock=world.clock,
            rng=random.Random(f"{seed}/index-log/{self.name}"),
            writer_id=self.name,
            flush_rows=64,
            flush_max_age_s=config.flush_s,
            max_buffered_rows=1024,
            backoff=Backoff(attempts=3, base_s=0.05, cap_s=0.5),
            put_budget_s=settings.ingest.index_put_budget_s,
            landing_s=settings.store.connect_timeout_s + settings.store.read_timeout_s,
        )
        self.acceptor = BatchAcceptor(
            store=self.gate,
            collector_id=self.name,
            clock=world.clock,
            rng=random.Random(f"{seed}/acceptor/{self.name}"),
            index_log=self.writer,
            budget_s=settings.ingest.request_budget_s,
            backoff=Backoff(attempts=8, base_s=0.05, cap_s=0.5),
        )
        self._requests: set[asyncio.Task[Outcome]] = set()
        self.writer.start()

    async def accept(self, batch: SimBatch, *, resend: bool) -> Outcome | None:
        """The collector's answer; None for a 503 or a connection reset (killed)."""
        task = asyncio.ensure_future(
            self.acceptor.accept(batch.header, batch.frame, batch.sha, resend=resend)
        )
        self._requests.add(task)
        try:
            await asyncio.wait({task})
        finally:
            self._requests.discard(task)
        if task.cancelled() or isinstance(task.exception(), AcceptanceUnavailable):
            return None
        return task.result()  # any other error is the simulation's to see

    def kill(self) -> int:
        """Kill the process: requests cancelled, nothing sent any more. The rows its
        writer still buffered (lost)."""
        self.gate.dead = True
        for task in self._requests:
            task.cancel()
        return self.writer.buffered

    async def stop(self) -> None:
        """Graceful stop (the end of the run); a dead process's writer is only reaped."""
        await self.writer.stop(grace_s=0.1 if self.gate.dead else 60.0)


@dataclass(frozen=True, slots=True)
class SimBatch:
    header: SimHeader
    frame: bytes
    sha: str

    @property
    def identity(self) -> keys.BatchIdentity:
        return self.header.identity


def make_batch(agent_id: str, boot_id: uuid.UUID, seq_start: int, seed: int) -> SimBatch:
    """A valid frame of 10 points (the GC's proof reads a blob's identity from its header)."""
    header = SimHeader(agent_id, boot_id, seq_start, seq_start + 9, 10)
    table = points_table(
        [1_760_000_000 * keys.NS_PER_S + i for i in range(10)],
        ["longrun"] * 10,
        [float(i) for i in range(10)],
        [{"seed": str(seed)}] * 10,
    )
    frame = encode_frame(agent_id=agent_id, boot_id=boot_id, seq_start=seq_start, points=table)
    return SimBatch(header, frame, hashlib.sha256(frame).hexdigest())


class LongRunWorld:
    """Everything in one long world; every choice derives from the seed."""

    def __init__(self, config: LongRunConfig, *, violations: list[str], stats: Counter[str]):
        self.config = config
        self.stats = stats
        self.violations = violations
        self.settings = longrun_settings(config)
        self.clock = SimClock(WORLD_START_NS)
        self.memory = MemoryStore("memory://longrun", clock=self.clock)
        self.watched = WatchedStore(
            self.memory, violations=violations, stats=stats, now_s=self.clock.monotonic
        )
        self.watch = LongRunWatch(now_s=self.clock.monotonic)
        self.watched.on_put = self.watch.on_put
        self.watched.on_delete = self.watch.on_delete
        self.watched.retention = RetentionRule(
            self.memory,
            raw_s=config.raw_retention_s,
            now_ns=self.clock.now_ns,
            ledger_ids=LedgerIds(self.memory),
        )
        self.delayed: list[DelayedStore] = []
        self.faulty: list[FaultyStore] = []
        self.collector_stores = [
            self._store_seen_by(f"collector-{i}", collector_fault_rates(config.fault_rate))
            for i in range(config.collectors)
        ]
        self._incarnations = [0] * config.collectors
        self.collectors = [CollectorProcess(self, i, 0) for i in range(config.collectors)]
        self.dead: list[CollectorProcess] = []
        """Killed processes, reaped at the end."""
        self.reconciler = Reconciler(
            store=self._store_seen_by("reconciler", {}, late=False),
            settings=self.settings,
            clock=self.clock,
            rng=random.Random(f"{config.seed}/reconciler"),
            metrics=ReconcilerMetrics(clock=self.clock),
            owner=RECONCILER_OWNER,
        )
        self.acked: dict[keys.BatchIdentity, set[str]] = {}
        """What the agents were acknowledged: identity -> hashes (one, or a violation)."""
        self.rollup = IndexRollup(
            self._store_seen_by("rollup", {}, late=False),
            clock=self.clock,
            rng=random.Random(f"{config.seed}/rollup"),
            interval_s=config.rollup_interval_s,
            stats=stats,
        )

    def _store_seen_by(
        self, name: str, rates: dict[str, dict[Fault, float]], *, late: bool = True
    ) -> ObjectStore:
        """S3-like retries over seeded faults over seeded latency (and late landings)."""
        seed, config, settings = self.config.seed, self.config, self.settings
        delayed = DelayedStore(
            self.watched,
            rng=random.Random(f"{seed}/latency/{name}"),
            max_latency_s=0.2,
            late_rate=config.late_rate if late else 0.0,
            timeout_s=settings.store.read_timeout_s,
            late_extra_s=settings.store.connect_timeout_s,
        )
        faulty = FaultyStore(delayed, seed=_seed_of(f"{seed}/faults/{name}"), rates=rates)
        self.delayed.append(delayed)
        self.faulty.append(faulty)
        timed = RequestTimeouts(
            faulty, timeout_s=settings.store.connect_timeout_s + settings.store.read_timeout_s
        )
        return S3LikeRetries(
            timed,
            rng=random.Random(f"{seed}/retries/{name}"),
            backoff=Backoff(attempts=5, base_s=0.05, cap_s=0.5),
        )

    # --- collector deaths -----------------------------------------------------------------

    def kill(self, slot: int, *, reason: str = "kills") -> None:
        """Kill the collector in ``slot`` and start a new one in its place."""
        old = self.collectors[slot]
        self.stats[f"collector_{reason}"] += 1
        self.stats["rows_buffered_at_kill"] += old.kill()
        self.dead.append(old)
        self._incarnations[slot] += 1
        self.collectors[slot] = CollectorProcess(self, slot, self._incarnations[slot])

    def lost_flush(self, slot: int) -> None:
        self.kill(slot, reason="lost_flushes")

    async def kill_collectors(self, until_s: float) -> None:
        """Every U(``kill_every_s``), kill the first collector seen holding unflushed log
        rows (a kill between two flushes of an idle collector would lose nothing), or
        after ten minutes without one, any."""
        rng = random.Random(f"{self.config.seed}/kills")
        while (at := self.clock.monotonic() + rng.uniform(*self.config.kill_every_s)) < until_s:
            await self.clock.sleep(at - self.clock.monotonic())
            for _ in range(2400):
                busy = [i for i, c in enumerate(self.collectors) if c.writer.buffered]
                if busy:
                    break
                await self.clock.sleep(0.25)
            self.kill(rng.choice(busy) if busy else rng.randrange(len(self.collectors)))

    async def lose_flushes(self, until_s: float) -> None:
        rng = random.Random(f"{self.config.seed}/lost-flushes")
        while (at := self.clock.monotonic() + rng.uniform(*self.config.lost_flush_every_s)) < (
            until_s
        ):
            await self.clock.sleep(at - self.clock.monotonic())
            self.collectors[rng.randrange(len(self.collectors))].gate.lose_next_flush = True

    # --- agents, orphans ------------------------------------------------------------------

    async def send(self, batch: SimBatch, rng: random.Random, *, resend: bool) -> Outcome | None:
        """Send until a collector answers (a 503 or a reset: retried elsewhere, with the
        re-send header, as the reference agent does)."""
        for _ in range(30):
            collector = self.collectors[rng.randrange(len(self.collectors))]
            outcome = await collector.accept(batch, resend=resend)
            if outcome is not None:
                return outcome
            self.stats["send_retries"] += 1
            resend = True
            await self.clock.sleep(rng.uniform(0.5, 3.0))
        self.stats["sends_given_up"] += 1
        return None

    async def run_agents(self, until_s: float) -> None:
        """One batch every ``batch_interval_s`` until ``until_s``, from the agents in turn;
        a share of the acknowledged ones is re-sent 5-20 minutes later (half of those with
        the re-send header: the agent remembered sending it), and must be a duplicate."""
        config = self.config
        boots = [
            uuid.UUID(int=random.Random(f"{config.seed}/boot/{a}").getrandbits(128))
            for a in range(config.agents)
        ]
        batches: list[asyncio.Task[None]] = []
        index = 0
        while (at := index * config.batch_interval_s) < until_s:
            await self.clock.sleep(at - self.clock.monotonic())
            agent = index % config.agents
            batch = make_batch(
                f"lr-agent-{agent}", boots[agent], index // config.agents * 10, config.seed
            )
            batches.append(asyncio.ensure_future(self._one_batch(batch, index)))
            index += 1
        await asyncio.gather(*batches)

    async def _one_batch(self, batch: SimBatch, index: int) -> None:
        config = self.config
        rng = random.Random(f"{config.seed}/batch/{index}")
        outcome = await self.send(batch, rng, resend=False)
        if isinstance(outcome, IdentityConflictFound):  # no agent sends another frame
            self.violations.append(f"t={self.clock.monotonic():.3f}s: 409 for {batch.identity}")
        if not isinstance(outcome, Accepted):
            return
        self.acked.setdefault(batch.identity, set()).add(batch.sha)
        if rng.random() >= config.resend_rate:
            return
        await self.clock.sleep(rng.uniform(*config.resend_after_s))
        self.stats["resends"] += 1
        again = await self.send(batch, rng, resend=rng.random() < 0.5)
        if not isinstance(again, Accepted) or not again.duplicate:
            self.violations.append(
                f"t={self.clock.monotonic():.3f}s: re-send of {batch.identity} was answered "
                f"{again!r}, not as a duplicate"
            )

    async def plant_orphans(self, until_s: float) -> None:
        """``orphans_per_hour`` orphan blobs every hour, each at a seeded moment in it:
        an earlier attempt's blob whose collector crashed; half of them flushed the
        ``blob`` log row first."""
        config = self.config
        rng = random.Random(f"{config.seed}/orphans")
        boot = uuid.UUID(int=rng.getrandbits(128))
        hour, planted = 0, 0
        while True:
            for offset in sorted(rng.uniform(0, 3600.0) for _ in range(config.orphans_per_hour)):
                at = hour * 3600.0 + offset
                if at >= until_s:
                    return
                await self.clock.sleep(at - self.clock.monotonic())
                batch = make_batch("lr-orphans", boot, planted * 10, config.seed)
                planted += 1
                await self._land_orphan(batch, logged=rng.random() < 0.5)
            hour += 1

    async def _land_orphan(self, batch: SimBatch, *, logged: bool) -> None:
        now_ns = self.clock.now_ns()
        await self.watched.put(keys.raw_blob_key(batch.sha), batch.frame, if_none_match=True)
        if logged:
            log = IndexLogWriter(
                store=self.watched,
                clock=self.clock,
                rng=random.Random(f"{self.config.seed}/crashed/{batch.sha}"),
                writer_id="lr-crashed-collector",
            )
            log.append(blob_row(batch.sha, now_ns))
            await log.flush()
        self.watch.orphans.append(PlantedOrphan(batch.sha, self.clock.monotonic(), logged))

    async def sample(self, stop: asyncio.Event) -> None:
        """`sample_bounds` every ``sample_every_s`` until ``stop``."""
        while not stop.is_set():
            self.watch.samples.append(
                await sample_bounds(
                    self.memory, at_s=self.clock.monotonic(), now_ns=self.clock.now_ns()
                )
            )
            try:
                await asyncio.wait_for(stop.wait(), self.config.sample_every_s)
            except TimeoutError:
                pass

    async def stop_collectors(self) -> None:
        for process in self.collectors:
            process.gate.lose_next_flush = False  # the run is over: a graceful stop
        for process in [*self.collectors, *self.dead]:
            await process.stop()
            self.stats["index_rows_dropped"] += (
                process.writer.stats.dropped_full + process.writer.stats.dropped_failed
            )


def _seed_of(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
