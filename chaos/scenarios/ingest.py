"""Scenarios about acceptance itself: race, faults, clock-skew."""

from __future__ import annotations

import aiohttp

from chaos.cluster import Timing
from chaos.load import LoadShape
from chaos.proxy import CALM, FaultRule, Phase
from chaos.scenarios.base import Scenario, ScenarioContext
from chaos.scenarios.phases import CONDITIONAL, QUICK, STORMS, K, light


async def drive_race(ctx: ScenarioContext) -> None:
    """Twin fleets send the same batches at once through different collectors; S3 answers
    some conditional writes 409 as it does under contention."""
    phase = Phase("race", (FaultRule({K.CONFLICT_409: 0.08}, ops=CONDITIONAL, latency=QUICK),))
    ctx.planned(0.0, "phase", name=phase.name)
    ctx.set_phase(phase)
    await ctx.until(ctx.length_s)


async def drive_faults(ctx: ScenarioContext, *, exclude: tuple[str, ...] = ()) -> None:
    """Storms of one kind each (503, lost answers, timeouts, 500s, resets, 409s,
    latency), a few seconds long, with calm in between, in a seeded order."""
    at = 0.0
    schedule = []
    scale = min(ctx.length_s, 40.0)  # short rounds get short storms, several of them
    names = sorted(set(STORMS) - set(exclude))
    order: list[str] = []
    while at < ctx.length_s:
        if not order:  # every storm once, in a seeded order, then again
            order = ctx.rng.sample(names, len(names))
        name = order.pop()
        phase = Phase(name, STORMS[name])
        length = ctx.rng.uniform(0.08, 0.2) * scale
        calm = ctx.rng.uniform(0.02, 0.08) * scale
        schedule.append((at, phase, length))
        ctx.planned(at, "phase", name=phase.name, length_s=round(length, 2))
        at += length + calm
    for at, phase, length in schedule:
        if not await ctx.until(at):
            return
        ctx.set_phase(phase)
        if not await ctx.until(at + length):
            return
        ctx.set_phase(CALM)


async def drive_skewed(ctx: ScenarioContext) -> None:
    """Light faults while two collectors' clocks are hours off the store's. Half-way, each
    collector's ``/readyz`` is asked and recorded (event ``collector_readiness``): a skewed
    one must say its clock is skewed (PROTOCOL §3.8), and answer every batch 503."""
    ctx.planned(0.0, "phase", name="light")
    ctx.set_phase(light())
    await ctx.until(ctx.length_s / 2)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as session:
        for name, process in sorted(ctx.cluster.collectors.items()):
            try:
                async with session.get(f"{process.url}/readyz") as answer:
                    state = await answer.json(content_type=None)
                    status = answer.status
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                ctx.errors.append(f"{name}: /readyz did not answer: {exc!r}")
                continue
            ctx.cluster.event(
                "collector_readiness",
                name=name,
                skew_s=ctx.cluster.skews.get(name, 0.0),
                status=status,
                clock_skewed=state.get("clock_skewed"),
            )
    await ctx.until(ctx.length_s)


RACE = Scenario(
    "race",
    "many agents; twin fleets send identical batches at once through 3 collectors; "
    "duplicates, identity conflicts, 409 ConditionalRequestConflict",
    drive_race,
    load=LoadShape(
        lanes=3,
        twins=3,
        agents=6,
        batches=5,
        duplicate_rate=0.25,
        conflict_rate=0.12,
        concurrency=6,
    ),
    gc=False,
)
FAULTS = Scenario(
    "faults",
    "seeded storms of 500, 503 SlowDown, 409, resets, timeouts, lost answers, late "
    "applies and latency, per operation and key prefix",
    drive_faults,
    load=LoadShape(lanes=3, twins=1, agents=4, batches=6),
)
CLOCK_SKEW = Scenario(
    "clock-skew",
    "collectors 90 minutes behind and 45 minutes ahead of the store: they fail /readyz and "
    "answer every batch 503 (PROTOCOL §3.8), the agents go on through the third; no "
    "manifest's accepted_at disagrees with the store's clock; GC with short horizons",
    drive_skewed,
    skews_s=(-5400.0, 0.0, 2700.0),
    load=LoadShape(lanes=3, twins=1, agents=4, batches=6),
    timing=Timing(),
)
