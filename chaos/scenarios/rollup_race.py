"""rollup-race: two rollup runs at once, faults on the commit, a crash mid-commit, then a
delete and a compaction.

Run A starts, and at a seeded moment is paused (SIGSTOP of its process group: a stopped
VM, a long GC pause) for longer than its owner lease. Run B takes the lease over
(epoch + 1) and is SIGKILLed inside its commit, at a seeded point: right after its
snapshot write, just before its pointer swap, or just after it (through a proxy of its
own that fires on that request). A then resumes as a stale owner and must stop without
committing anything. All the while the proxy loses answers to pointer and snapshot
writes, answers some 409, and refuses half of the lease renewals. The convergence run
then has to settle what the crash left, with exact totals. After the race, still under
the faults, one committed series is deleted (``lm-rollup delete``) and the dataset
compacted (``lm-rollup compact``): the totals then exclude exactly what the committed
deletes mask, and no later run brings a masked row back. Without a
rollup the scenario still drives ingest under the same faults, and its rollup checks
are reported skipped.
"""

from __future__ import annotations

import asyncio
import signal
import time

from chaos.load import LoadShape
from chaos.proxy import CALM
from chaos.scenarios.base import CommitCrash, Scenario, ScenarioContext
from chaos.scenarios.phases import combined, light
from protocol.keys import ROLLUP_OWNER_KEY
from protocol.records import LeaseRecord, RecordError
from store.errors import StoreError


async def drive_rollup_race(ctx: ScenarioContext, *, phases: bool = True) -> None:
    ttl = ctx.cluster.timing.rollup_lease_ttl_s
    start_at = ctx.rng.uniform(0.05, 0.2) * ctx.length_s
    pause_after = ctx.rng.uniform(0.0, 10.0)
    crash = CommitCrash(ctx.rng.choice(("snapshot", "pointer-before", "pointer-after")))
    ctx.planned(start_at, "rollup_race", pause_a_after_s=round(pause_after, 2), crash_b=crash.point)
    if phases:
        ctx.set_phase(light())
    if not await ctx.until(start_at):
        return
    if ctx.rollup_reason is not None:
        ctx.counts["rollup_race_skipped"] += 1
        await ctx.until(ctx.length_s)
        return
    if phases:
        ctx.set_phase(combined("rollup-commit"))
    tag = f"{ctx.round_index}-{int(start_at)}"
    a_name, b_name = f"rollup-A-{tag}", f"rollup-B-{tag}"
    a = asyncio.create_task(ctx.rollup_run(a_name))
    # Pause A once it holds the lease (Spark takes a while to get there), a little later.
    await _until_owned(ctx, a_name, timeout_s=120.0)
    await asyncio.sleep(pause_after)
    # A is paused (a GC pause, a stopped VM) past its lease; B takes over and commits.
    paused = ctx.cluster.signal_rollup(a_name, signal.SIGSTOP)
    try:
        if paused:
            ctx.counts["rollup_owner_pauses"] += 1
            await asyncio.sleep(ttl + 1.0)
        b_code = await ctx.rollup_run(b_name, crash_in_commit=crash)
    finally:
        if paused:
            ctx.cluster.signal_rollup(a_name, signal.SIGCONT)
    a_code = await a
    ctx.cluster.event("rollup_race_done", exit_codes=[a_code, b_code])
    await _delete_and_compact(ctx, tag)
    if phases:
        ctx.set_phase(CALM)
    await ctx.until(ctx.length_s)


async def _delete_and_compact(ctx: ScenarioContext, tag: str) -> None:
    """Still under the commit faults: delete one committed series (``lm-rollup delete``),
    then compact (``lm-rollup compact``). Either may fail on the faults (exit 2, nothing
    or everything committed); the auditor checks the tables against the truth minus what
    the committed deletes mask, and the convergence run must never bring rows back."""
    chosen = await _a_committed_series(ctx)
    if chosen is None:
        return
    metric, labels = chosen
    flags = ["--metric", metric]
    for name, value in sorted(labels.items()):
        flags += ["--label", f"{name}={value}"]
    ctx.counts["rollup_deletes_tried"] += 1
    code, _ = await ctx.cluster.rollup_command("delete", *flags, "--reason", f"chaos {tag}")
    ctx.counts["rollup_deletes_committed"] += code == 0
    ctx.counts["rollup_compactions_tried"] += 1
    code, _ = await ctx.cluster.rollup_command("compact")
    ctx.counts["rollup_compactions_committed"] += code == 0


async def _a_committed_series(ctx: ScenarioContext) -> tuple[str, dict[str, str]] | None:
    """The metric and labels of the first ``rollup_1m`` row committed, if any."""
    from rollup.read.reader import scan
    from rollup.table.storage import arrow_filesystem

    store = ctx.cluster.direct_store()
    assert ctx.cluster.ministack is not None
    try:
        filesystem, root = arrow_filesystem(
            ctx.cluster.store_url, endpoint_url=ctx.cluster.ministack.endpoint_url
        )
        rows = await scan(
            store, "rollup_1m", filesystem=filesystem, root=root, columns=["metric", "labels"]
        )
    except (StoreError, OSError):
        return None
    finally:
        await store.close()
    if not rows.num_rows:
        return None
    first = rows.slice(0, 1).to_pylist()[0]
    return first["metric"], dict(first["labels"] or [])


async def _until_owned(ctx: ScenarioContext, name: str, *, timeout_s: float) -> None:
    """Wait (bounded) until some run holds an unexpired owner lease, or run ``name`` ended."""
    store = ctx.cluster.direct_store()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            info = ctx.cluster.rollups.get(name)
            if info is None or info.process.poll() is not None:
                return
            try:
                body, _ = await store.get(ROLLUP_OWNER_KEY)
                lease = LeaseRecord.from_json(body)
                if lease.expires_at_unix_ns > time.time_ns():
                    return
            except (StoreError, RecordError):
                pass  # none yet, or the store is restarting (an outage in "all")
            await asyncio.sleep(0.5)  # polling the store, bounded by the deadline
    finally:
        await store.close()


ROLLUP_RACE = Scenario(
    "rollup-race",
    "two rollup runs (a paused owner taken over), lost pointer answers, 409s, and a "
    "SIGKILL inside a commit; the next run settles it",
    drive_rollup_race,
    load=LoadShape(lanes=2, twins=0, agents=4, batches=6),
    uses_rollup=True,
)
