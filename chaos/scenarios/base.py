"""What a scenario is, and the context its driver acts through.

A `Scenario` names its cluster (collectors, their clock skews, whether the reconciler
runs GC), its agent load (`LoadShape`), its timing, and a driver: an async function that,
while the agents send, changes fault phases, kills and restarts processes, cuts the
store off, or races rollup runs, until the round's deadline. Every random choice comes
from ``ctx.rng`` (seeded by the run's seed, the scenario and the round), and is written
to ``ctx.plan`` before it happens, so the report shows the schedule a seed replays.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from chaos.cluster import Cluster, Timing
from chaos.load import AckBook, LoadShape
from chaos.proxy import CALM, CONDITIONAL_PUTS, Phase, Trigger
from protocol.keys import ROLLUP_MANIFESTS_PREFIX, ROLLUP_POINTER_KEY

Driver = Callable[["ScenarioContext"], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class CommitCrash:
    """Where a rollup run dies inside its commit: ``snapshot`` (its snapshot written,
    the pointer not yet tried), ``pointer-before`` (the pointer write never sent) or
    ``pointer-after`` (the pointer swapped, the answer never read)."""

    point: Literal["snapshot", "pointer-before", "pointer-after"]

    def trigger(self, action: Callable[[], Awaitable[None]]) -> Trigger:
        if self.point == "snapshot":
            return Trigger(
                frozenset({"put_if_none_match"}), ROLLUP_MANIFESTS_PREFIX, action, "after"
            )
        when: Literal["before", "after"] = "before" if self.point == "pointer-before" else "after"
        return Trigger(CONDITIONAL_PUTS, ROLLUP_POINTER_KEY, action, when)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    drive: Driver
    collectors: int = 3
    skews_s: tuple[float, ...] = ()
    gc: bool = True
    load: LoadShape = field(default_factory=LoadShape)
    timing: Timing = field(default_factory=Timing)
    uses_rollup: bool = False
    """The driver itself runs rollups (rollup-race, all); every scenario's convergence
    runs one when the rollup is enabled."""


@dataclass
class ScenarioContext:
    cluster: Cluster
    rng: random.Random
    book: AckBook
    start: float
    deadline: float
    rollup_reason: str | None
    """``None`` when rollups may run; else why not (not available, or disabled)."""
    round_index: int = 0
    plan: list[dict[str, Any]] = field(default_factory=list)
    outage_windows: list[tuple[float, float]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    down: set[str] = field(default_factory=set)
    ports: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _outage: bool = False
    _after_outage: Phase | None = None

    # --- time ----------------------------------------------------------------------------

    @property
    def length_s(self) -> float:
        return self.deadline - self.start

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    async def until(self, offset_s: float) -> bool:
        """Sleep until ``offset_s`` into the round; False once past the deadline."""
        target = min(self.start + offset_s, self.deadline)
        delay = target - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        return time.monotonic() < self.deadline

    def planned(self, at_s: float, action: str, **detail: Any) -> None:
        self.plan.append(
            {"round": self.round_index, "at_s": round(at_s, 3), "action": action, **detail}
        )

    # --- faults and failures -------------------------------------------------------------

    def set_phase(self, phase: Phase) -> None:
        """Switch the proxy's phase; during an outage the switch waits for its end."""
        assert self.cluster.proxy is not None
        if self._outage and not phase.outage:
            self._after_outage = phase
            return
        self.cluster.proxy.set_phase(phase)
        self.counts[f"phase:{phase.name}"] += 1
        self.cluster.event("phase", name=phase.name)

    async def outage(self, seconds: float, *, restart_store: bool) -> None:
        """The store is unreachable for ``seconds`` (every request reset); with
        ``restart_store`` MiniStack is also restarted inside the window."""
        assert self.cluster.proxy is not None and self.cluster.ministack is not None
        if self._outage:
            return  # one outage at a time
        self._after_outage = self.cluster.proxy.phase
        started = time.monotonic()
        self.set_phase(Phase("outage", outage=True))
        self._outage = True
        self.counts["outages"] += 1
        try:
            if restart_store:
                await asyncio.to_thread(self.cluster.ministack.restart)
                self.counts["store_restarts"] += 1
                self.cluster.event("store_restarted")
            left = started + seconds - time.monotonic()
            if left > 0:
                await asyncio.sleep(left)
        finally:
            self.outage_windows.append((started, time.monotonic()))
            self._outage = False
            self.set_phase(self._after_outage or CALM)

    async def kill_collector(self, name: str, *, down_s: float) -> None:
        process = self.cluster.collectors.get(name)
        if process is None:
            return
        self.ports[name] = int(process.url.rsplit(":", 1)[1])
        self.down.add(name)
        await self.cluster.kill_collector(name)
        self.counts["collector_kills"] += 1
        await asyncio.sleep(down_s)
        await self.restart_collector(name)

    async def restart_collector(self, name: str) -> None:
        if name in self.down:
            # Same port: the agents' URL lists stay valid.
            await self.cluster.start_collector(name, port=self.ports[name])
            self.down.discard(name)

    async def kill_reconciler(self, *, down_s: float, gc: bool) -> None:
        await self.cluster.kill_reconciler()
        self.counts["reconciler_kills"] += 1
        await asyncio.sleep(down_s)
        await self.cluster.start_reconciler(gc=gc)

    async def rollup_run(
        self,
        name: str,
        *,
        kill_after_s: float | None = None,
        crash_in_commit: CommitCrash | None = None,
        timeout_s: float = 400.0,
        settings: dict[str, str] | None = None,
    ) -> int | None:
        """One ``lm-rollup run`` through the proxy (``settings``: extra ``LM_*``),
        SIGKILLed after ``kill_after_s``, or inside its commit (`CommitCrash`) through a
        proxy of its own."""
        if self.rollup_reason is not None:
            return None
        endpoint = None
        if crash_in_commit is not None:
            proxy = await self.cluster.private_proxy()
            proxy.trigger(crash_in_commit.trigger(lambda: self._crash(name)))
            endpoint = proxy.url
        self.cluster.start_rollup(name, endpoint_url=endpoint, settings=settings)
        self.counts["rollup_runs"] += 1
        if kill_after_s is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._wait_exit(name)), kill_after_s)
            except TimeoutError:
                await self.cluster.kill_rollup(name)
                self.counts["rollup_kills"] += 1
        return await self.cluster.wait_rollup(name, timeout_s)

    async def _crash(self, name: str) -> None:
        await self.cluster.kill_rollup(name)
        self.counts["rollup_crashes_in_commit"] += 1

    async def _wait_exit(self, name: str) -> None:
        info = self.cluster.rollups[name]
        await asyncio.to_thread(info.process.wait)
