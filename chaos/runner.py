"""`run_scenario`: one ``lm-chaos run``, from an empty bucket to the report.

A run is one or more rounds on one bucket (a long run is cut into rounds of about
``round_s`` so that it is audited along the way, not only at the end). Each round:

1. start the scenario's collectors and the reconciler daemon (through the proxy);
2. start the agents (`chaos.load`) and the scenario's driver, until the round's deadline;
3. heal: calm proxy, every killed process back, agents stop and drain their spools;
4. converge: collectors stopped with SIGTERM (index log buffers flushed), the reconciler
   stopped, then ``lm-reconciler audit`` (a full audit: whatever the log did not
   deliver is cataloged) and, when the rollup is enabled, ``lm-rollup run``, both
   straight to the store, repeated (bounded) until they succeed;
5. audit every invariant (`chaos.auditor`, `chaos.rollup_check`) against the store, and
   count the GC coverage of the planted orphans (`chaos.auditor.gc_coverage`).

Failures of the machinery (a driver that raises, a convergence step that never
succeeds) are reported as the run's ``error`` (exit 1), apart from invariant violations.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog

from chaos.auditor import audit, gc_coverage, store_counts
from chaos.clock_checks import check_stamps
from chaos.cluster import Cluster
from chaos.load import AckBook, LoadDriver, LoadShape
from chaos.proxy import CALM
from chaos.report import AuditRound, RunReport
from chaos.rollup_check import rollup_checks, rollup_unavailable, skipped
from chaos.scenarios import SCENARIOS
from chaos.scenarios.base import Scenario, ScenarioContext
from index.features import registered
from index.versions import process_id
from protocol.clock import SystemClock

log = structlog.get_logger("chaos.runner")
MIN_ROUND_S = 5.0


@dataclass(frozen=True)
class ChaosOptions:
    scenario: str
    seed: int
    duration_s: float
    work_dir: Path
    rollup: Literal["auto", "off"] = "auto"
    round_s: float = 300.0
    bundles: bool = False
    """``lm-reconciler enable-bundles`` before the first collector starts (PROTOCOL §3.10):
    the collectors (``[ingest] bundle``, on by default) then write group-commit bundles."""
    progress: Callable[[str], None] | None = None
    """Called with one line per audited round (the CLI prints it)."""


async def run_scenario(options: ChaosOptions) -> RunReport:
    scenario = SCENARIOS[options.scenario]
    started = time.monotonic()
    report = RunReport(options.scenario, options.seed, options.duration_s, str(options.work_dir))
    if options.rollup == "off":
        rollup_reason: str | None = "skipped: rollup disabled for this run (--rollup off)"
    else:
        unavailable = rollup_unavailable()
        rollup_reason = f"skipped: {unavailable}" if unavailable else None
    report.rollup = rollup_reason or "enabled"
    cluster = Cluster(options.work_dir, options.seed, timing=scenario.timing)
    book = AckBook()
    counts: Counter[str] = Counter()
    registration = contextlib.AsyncExitStack()
    try:
        await cluster.start()
        # lm-chaos reads records (its auditor): it registers (PROTOCOL §3.10) for the run.
        gate_store = cluster.direct_store()
        registration.push_async_callback(gate_store.close)
        gate = registered(gate_store, SystemClock(), role="chaos", process_id=process_id())
        await registration.enter_async_context(gate)
        if options.bundles:
            await _enable_bundles(cluster, report)
        # Seconds of chaos still to run: start-up and convergence are not counted.
        left = options.duration_s
        index = 0
        while True:
            length = left if left < 1.5 * options.round_s else options.round_s
            length = max(MIN_ROUND_S, length)
            ctx = await _run_round(cluster, scenario, options, book, index, length, rollup_reason)
            counts.update(ctx.counts)
            report.plan += ctx.plan
            audited = await _converge_and_audit(cluster, ctx, book, rollup_reason, started)
            report.driver_errors += ctx.errors
            report.rounds.append(audited)
            if options.progress is not None:
                options.progress(
                    f"round {index}: {length:.0f}s of chaos, {len(book.acks)} acks so far, "
                    f"{audited.store.get('accepted_manifests', 0)} manifests, "
                    f"{audited.violations} violation(s), {time.monotonic() - started:.0f}s elapsed"
                )
            index += 1
            left -= length
            if left < MIN_ROUND_S:
                break
    except Exception as exc:
        log.error("chaos_run_failed", error=repr(exc))
        report.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
    finally:
        with contextlib.suppress(Exception):  # the store may be gone with the cluster
            await registration.aclose()
        await cluster.stop()
        if cluster.proxy is not None:
            report.faults = {**cluster.fault_counters(), "events": dict(sorted(counts.items()))}
        report.events = cluster.events
        report.batches = book.to_dict()
        report.elapsed_s = time.monotonic() - started
    return report


def bundle_load(shape: LoadShape) -> LoadShape:
    """``--bundles``' load: each lane's agents send 4x as many batches at once (at least
    16), so frames meet in flight and share bundles (at the scenarios' own shapes a
    10-minute run bundled 2 % of its batches)."""
    return dataclasses.replace(shape, concurrency=max(16, 4 * shape.concurrency))


async def _enable_bundles(cluster: Cluster, report: RunReport) -> None:
    """The operator's command on the fresh bucket (only lm-chaos is registered, no
    collector has written a log segment): it must turn bundles on, else the run fails."""
    code, output = await cluster.reconciler_command("enable-bundles", direct=True)
    if code != 0:
        raise RuntimeError(f"lm-reconciler enable-bundles exited {code}: {output[-500:]}")
    report.bundles = True
    cluster.event("bundles_enabled")
    # One raw write in flight per collector: the agents send a few batches at a time, so
    # with the default two write slots frames seldom wait for one and bundles are rare
    # (a 10-minute run at the default bundled 20 of 1,524 batches); with one slot every
    # frame that arrives during a raw PUT joins the next bundle. And a bundle of 3 goes
    # at once beside it (`ingest.bundle_eager_frames`; the default 8 seldom gathers
    # here), so bundle writes also overlap.
    cluster.collector_settings["LM_INGEST__BUNDLE_MAX_IN_FLIGHT"] = "1"
    cluster.collector_settings["LM_INGEST__BUNDLE_EAGER_FRAMES"] = "3"


async def _run_round(
    cluster: Cluster,
    scenario: Scenario,
    options: ChaosOptions,
    book: AckBook,
    index: int,
    length_s: float,
    rollup_reason: str | None,
) -> ScenarioContext:
    skews = [
        scenario.skews_s[n] if n < len(scenario.skews_s) else 0.0
        for n in range(scenario.collectors)
    ]
    await asyncio.gather(
        *(cluster.start_collector(f"collector-{n + 1}", skew_s=s) for n, s in enumerate(skews))
    )
    await cluster.start_reconciler(gc=scenario.gc)
    now = time.monotonic()
    ctx = ScenarioContext(
        cluster=cluster,
        rng=random.Random(f"{options.seed}/{scenario.name}/round-{index}"),
        book=book,
        start=now,
        deadline=now + length_s,
        rollup_reason=rollup_reason,
        round_index=index,
    )
    load = LoadDriver(
        work_dir=options.work_dir / "agents",
        seed=options.seed,
        shape=bundle_load(scenario.load) if options.bundles else scenario.load,
        urls=sorted(cluster.collector_urls),
        book=book,
        name=f"r{index}",
    )
    cluster.event("round_started", round=index, length_s=round(length_s, 1))
    load.start()
    driver = asyncio.create_task(scenario.drive(ctx))
    try:
        await asyncio.wait({driver}, timeout=length_s)
        await load.stop()  # the agents stop at the deadline, whatever the driver does
        # The driver stops at the deadline too, but may have a rollup run or a restart in
        # hand: bounded slack.
        await asyncio.wait_for(driver, timeout=600.0)
    except Exception as exc:
        # The round still heals, converges and is audited; the run reports the error.
        log.error("chaos_driver_failed", error=repr(exc))
        ctx.errors.append(f"round {index}: driver failed: {type(exc).__name__}: {exc}")
    finally:
        ctx.set_phase(CALM)
        for name in sorted(ctx.down):
            await ctx.restart_collector(name)
        if cluster.reconciler is None:
            await cluster.start_reconciler(gc=scenario.gc)
        await load.stop()
        await load.drain()
    return ctx


async def _fresh_full_audit(cluster: Cluster, convergence: dict[str, Any]) -> None:
    """``lm-reconciler audit`` until a completed audit *started* after every writer
    stopped. One call is not enough: it resumes an audit interrupted earlier, which keeps
    its old start and does not revisit groups it had done, so records written since then
    in those groups are not repaired by it."""
    writers_stopped_ns = time.time_ns()
    for attempt in range(1, 6):
        code, output = await cluster.reconciler_command("audit", direct=True)
        convergence["reconciler_audit_attempts"] = attempt
        record = _last_json_line(output)
        if code == 0 and record is not None:
            if int(record.get("started_at_unix_ns", 0)) >= writers_stopped_ns:
                return
            convergence["resumed_audits"] = convergence.get("resumed_audits", 0) + 1
            continue
        log.warning("chaos_audit_retry", exit_code=code, output=output[-500:])
    raise RuntimeError(f"lm-reconciler audit never completed a fresh audit: {output[-1000:]}")


def _last_json_line(output: str) -> dict[str, Any] | None:
    for line in reversed(output.strip().splitlines()):
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict) and parsed.get("schema") == "lightmetrics.audit.v1":
            return parsed
    return None


async def _converge_and_audit(
    cluster: Cluster,
    ctx: ScenarioContext,
    book: AckBook,
    rollup_reason: str | None,
    run_started: float,
) -> AuditRound:
    await cluster.stop_collectors()
    died = await cluster.stop_reconciler()
    if died is not None:  # a daemon that cannot run (settings, crash) leaves GC untested
        log_tail = cluster.work_dir / "logs" / "reconciler.log"
        tail = log_tail.read_text(errors="replace")[-500:] if log_tail.exists() else ""
        ctx.errors.append(f"round {ctx.round_index}: the reconciler exited ({died}): {tail}")
    convergence: dict[str, Any] = {}
    await _fresh_full_audit(cluster, convergence)
    if rollup_reason is None:
        for attempt in range(1, 5):
            name = f"rollup-converge-{ctx.round_index}-{attempt}"
            # A long lease: a loaded machine can starve renewals past a short one.
            cluster.start_rollup(
                name, direct=True, settings={"LM_ROLLUP__OWNER_LEASE_TTL_S": "120"}
            )
            code_or_none = await cluster.wait_rollup(name, 600.0)
            convergence["rollup_attempts"] = attempt
            if code_or_none == 0:
                break
            # 3: a killed run's owner lease has not expired yet; 4: stopped, try again.
            await asyncio.sleep(cluster.timing.rollup_lease_ttl_s / 2)
        else:
            raise RuntimeError("lm-rollup run never succeeded during convergence")
    store = cluster.direct_store()
    try:
        view, checks = await audit(
            store,
            book,
            ctx.outage_windows,
            gc_timing=(cluster.timing.retry_horizon_s, cluster.timing.mark_grace_s),
        )
        checks.append(
            check_stamps(
                view.manifests.values(),
                max_clock_skew_s=cluster.timing.max_clock_skew_s,
                grace_s=cluster.timing.mark_grace_s,
            )
        )
        if rollup_reason is None:
            assert cluster.ministack is not None
            checks += await rollup_checks(
                store,
                view,
                book,
                store_url=cluster.store_url,
                endpoint_url=cluster.ministack.endpoint_url,
            )
        else:
            checks += skipped(rollup_reason)
    finally:
        await store.close()
    cluster.event(
        "round_audited", round=ctx.round_index, violations=sum(c.violation_count for c in checks)
    )
    counts = store_counts(view)
    counts.update(
        gc_coverage(view, book, now_ns=time.time_ns(), horizon_s=cluster.timing.retry_horizon_s)
    )
    return AuditRound(ctx.round_index, time.monotonic() - run_started, checks, counts, convergence)
