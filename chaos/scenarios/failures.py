"""Scenarios about processes and the store going away: kill, outage."""

from __future__ import annotations

import asyncio

from chaos.load import LoadShape
from chaos.scenarios.base import Scenario, ScenarioContext
from chaos.scenarios.phases import light


async def drive_kill(
    ctx: ScenarioContext,
    *,
    rollups: bool = True,
    phases: bool = True,
    reconciler_share: float = 0.25,
) -> None:
    """SIGKILL collectors, the reconciler and rollup runs at seeded moments; restart them.

    ``reconciler_share`` of the kills hit the reconciler (a killed holder's lease must
    expire before its successor works, so frequent kills starve the GC)."""
    if phases:
        ctx.set_phase(light())
    names = sorted(ctx.cluster.collectors)
    events = []
    at = ctx.rng.uniform(1.0, 4.0)
    while at < ctx.length_s - 2.0:
        roll = ctx.rng.random()
        if roll >= reconciler_share and (roll < 0.85 or not rollups):
            target = ctx.rng.choice(names)
            events.append((at, "kill_collector", target, ctx.rng.uniform(0.3, 3.0)))
        elif roll < reconciler_share or ctx.rollup_reason is not None:
            events.append((at, "kill_reconciler", "reconciler", ctx.rng.uniform(0.5, 4.0)))
        else:
            events.append((at, "kill_rollup", "rollup", ctx.rng.uniform(3.0, 40.0)))
        at += ctx.rng.uniform(2.0, 8.0)
    for at, action, target, seconds in events:
        ctx.planned(at, action, target=target, seconds=round(seconds, 2))
    pending: list[asyncio.Task[object]] = []
    for at, action, target, seconds in events:
        if not await ctx.until(at):
            break
        if action == "kill_collector":
            if target not in ctx.down:
                pending.append(asyncio.create_task(ctx.kill_collector(target, down_s=seconds)))
        elif action == "kill_reconciler":
            await ctx.kill_reconciler(down_s=seconds, gc=True)
        else:
            name = f"rollup-killed-{ctx.round_index}-{int(at)}"
            pending.append(asyncio.create_task(ctx.rollup_run(name, kill_after_s=seconds)))
    await asyncio.gather(*pending)
    await ctx.until(ctx.length_s)


async def drive_outage(ctx: ScenarioContext, *, phases: bool = True) -> None:
    """The store is unreachable for a window (MiniStack restarted inside it), then a
    second, shorter window; nothing may be acknowledged inside either."""
    if phases:
        ctx.set_phase(light())
    length = ctx.length_s
    first_at = ctx.rng.uniform(0.15, 0.35) * length
    first_s = min(10.0, max(3.0, length / 5))
    second_at = first_at + first_s + ctx.rng.uniform(0.2, 0.3) * length
    second_s = min(4.0, max(2.0, length / 10))
    ctx.planned(first_at, "outage", seconds=round(first_s, 2), restart_store=True)
    ctx.planned(second_at, "outage", seconds=round(second_s, 2), restart_store=False)
    if await ctx.until(first_at):
        await ctx.outage(first_s, restart_store=True)
    if second_at + second_s < length and await ctx.until(second_at):
        await ctx.outage(second_s, restart_store=False)
    await ctx.until(length)


KILL = Scenario(
    "kill",
    "SIGKILL of collectors, the reconciler and rollup runs at seeded moments, then restart",
    drive_kill,
    load=LoadShape(lanes=3, twins=1, agents=4, batches=6),
)
OUTAGE = Scenario(
    "outage",
    "the store unreachable for a window (MiniStack restarted inside it), then a shorter one",
    drive_outage,
    load=LoadShape(lanes=3, twins=0, agents=4, batches=6),
)
