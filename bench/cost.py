"""`bench.cost`: S3 requests and dollars per accepted batch, end to end (PROTOCOL §3.7).

Real processes on MiniStack, each role behind its own counting proxy (`bench.counting`):

1. a long-running ``lm-reconciler run`` (default settings; its first pass audits the empty
   store), then an idle window of ``--idle-s`` that gives its fixed cost per hour;
2. ``--collectors`` ``lm-collector serve`` processes (default flush settings), their
   start-up probe counted apart;
3. ``--batches`` new batches (``--points`` points each) over the collectors at
   ``--concurrency`` (or paced at ``--rate`` batches/s): the **acknowledgement path** is
   every collector request outside ``index/`` and the readiness probe in that window,
   divided by the accepted batches (target: exactly 2 PUT-class, 0 GET-class); then
   ``--resend-fraction`` of them sent again, as an agent does after a lost answer (with
   ``X-Lightmetrics-Resend: 1``), ``--restart-resend-fraction`` of the batches of those
   without it (an agent that restarted and recovered them from its spool); then the
   collectors stop (SIGTERM flushes); their ``index/v1/log`` requests are the **flushes**;
4. the reconciler runs until the catalog holds every accepted batch, then stops: its
   requests over the whole run are the **steady** phase;
5. one ``lm-reconciler audit`` (a full audit of this store), one ``lm-reconciler gc``
   (``--no-gc`` disables the GC everywhere) and one ``lm-rollup run``;
6. the rollup's cost against history (`bench.cost_history`): 100 new batches on a store
   holding 1x and 10x history.

Printed: requests per accepted batch by phase and S3 class, $ per million batches
(PUT-class $0.005/1k, GET-class $0.0004/1k), the audit's amortization, the 1x/10x rollup
comparison, the settings, the rate achieved and the load average. Targets: <= 2.05
PUT-class and <= 2.5 GET-class requests per accepted batch end to end, exactly 2 on the
acknowledgement path, and no more rollup requests at 10x history than at 1x.

    .venv/bin/python -m bench.cost                     # 2 collectors, 2,000 batches, ~10-20 min
    .venv/bin/python -m bench.cost --quick          # 400 batches, no history: a smoke run
    .venv/bin/python -m bench.cost --bundles --concurrency 64 --history-base 0   # issue 33

With ``--bundles`` the targets are issue 33's: <= 1.25 PUT-class a batch end to end, with
the frames per raw PUT reached (raw PUTs: ``raw-blobs`` and ``raw-bundles`` PUTs of the
acknowledgement path). The rate table of bundles on/off is `bench.cost_bundles`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

from agent.load import LoadSpec, SyntheticLoad
from agent.truth import PlannedFrame
from agent.uploader import Outcome, Uploader, UploadPolicy
from bench._common import publish
from bench.cost_history import history_run
from bench.cost_report import Measured, render
from bench.cost_stack import CostStack, on_cost_stack, stop_child
from bench.counting import since
from config import Settings
from index import catalog
from protocol import keys
from protocol.batch_api import FRAME_CONTENT_TYPE, RESEND_HEADER
from reconciler.audit.records import latest_completed_audit
from store.base import ObjectStore
from store.retry import Backoff

WAIT_STEP_S = 0.5
RESEND_LOST = "collectors: re-sends after a lost answer (resend header)"
RESEND_RESTART = "collectors: re-sends after an agent restart (no header)"


def deployment_settings(gc: bool, flush_max_age_ms: int | None) -> dict[str, object]:
    """The settings every child runs with: the defaults, but for ``--flush-max-age-ms``
    and ``--gc`` (printed with the results)."""
    s = Settings()
    return {
        "ingest.index_flush_rows": s.ingest.index_flush_rows,
        "ingest.index_flush_max_age_ms": flush_max_age_ms or s.ingest.index_flush_max_age_ms,
        "ingest.index_buffer_rows": s.ingest.index_buffer_rows,
        "reconciler.loop_interval_s": s.reconciler.loop_interval_s,
        "reconciler.lookback_s": s.reconciler.lookback_s,
        "reconciler.lease_ttl_s": s.reconciler.lease_ttl_s,
        "reconciler.max_audit_interval_s": s.reconciler.max_audit_interval_s,
        "reconciler.catalog_grace_s": s.reconciler.catalog_grace_s,
        "gc.enabled": gc,
    }


def build_frames(batches: int, points: int, agents: int) -> list[PlannedFrame]:
    spec = LoadSpec(
        agents=agents,
        batches=-(-batches // agents),
        points_per_batch=points,
        seed=int(time.time()),
        start_ns=time.time_ns() // keys.NS_PER_S * keys.NS_PER_S,
        interval_ns=10_000_000,  # 10 ms: a run's points stay within a few minutes
        agent_prefix="cost",
    )
    return list(SyntheticLoad(spec).originals())[:batches]


async def send_all(
    uploader: Uploader, frames: list[PlannedFrame], *, concurrency: int, rate: float | None
) -> Counter[str]:
    """Send every frame once (each with the uploader's bounded retries); outcomes."""
    outcomes: Counter[str] = Counter()
    slots = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(frame: PlannedFrame) -> None:
        try:
            answer = await uploader.send(frame.frame, frame.identity, frame.frame_sha256)
            outcomes[answer.outcome.value] += 1
        finally:
            slots.release()

    async with asyncio.TaskGroup() as group:
        for index, frame in enumerate(frames):
            if rate:
                await asyncio.sleep(max(0.0, start + index / rate - loop.time()))
            await slots.acquire()
            group.create_task(one(frame))
    return outcomes


async def resend_all(
    urls: list[str], frames: list[PlannedFrame], *, header: bool, concurrency: int
) -> Counter[str]:
    """POST each (already accepted) frame again, round robin over ``urls``, with or without
    ``X-Lightmetrics-Resend: 1``: what an agent sends after a lost answer (it never saw the
    200, so the frame is unsettled: header) or after a restart recovered it from its spool
    (no header). Answers by kind."""
    answers: Counter[str] = Counter()
    slots = asyncio.Semaphore(concurrency)
    headers = {"Content-Type": FRAME_CONTENT_TYPE, **({RESEND_HEADER: "1"} if header else {})}

    async def one(session: aiohttp.ClientSession, url: str, frame: PlannedFrame) -> None:
        async with slots, session.post(f"{url}/v1/batches", data=frame.frame, headers=headers) as r:
            body = await r.json() if r.status == 200 else {}
            answers["duplicate" if body.get("duplicate") else f"HTTP {r.status}"] += 1

    async with aiohttp.ClientSession() as session, asyncio.TaskGroup() as group:
        for index, frame in enumerate(frames):
            group.create_task(one(session, urls[index % len(urls)], frame))
    return answers


async def wait_until(check: object, timeout_s: float, what: str) -> float:
    """Poll the async predicate ``check`` every `WAIT_STEP_S`; seconds waited."""
    started = time.monotonic()
    while not await check():  # type: ignore[operator]
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        await asyncio.sleep(WAIT_STEP_S)  # polling the store, bounded by the timeout
    return time.monotonic() - started


async def cataloged_manifests(store: ObjectStore) -> int:
    found: set[str] = set()
    async for info in catalog.list_all_files(store):
        rows = await catalog.read_file(store, info.key)
        found.update(row.key for row in rows if row.kind == "accepted")
    return len(found)


async def measure(args: argparse.Namespace, stack: CostStack) -> Measured:
    settings = deployment_settings(args.gc, args.flush_max_age_ms)
    result = Measured(args=vars(args).copy(), settings=settings)
    result.args.pop("work_dir", None)
    result.loadavg["start"] = os.getloadavg()
    stack.settings["LM_GC__ENABLED"] = "true" if args.gc else "false"
    if args.flush_max_age_ms:
        stack.settings["LM_INGEST__INDEX_FLUSH_MAX_AGE_MS"] = str(args.flush_max_age_ms)
    bucket = await stack.new_bucket("main")
    direct = stack.direct_store(bucket)
    proxies = {role: await stack.proxy(bucket, role) for role in ("collectors", "reconciler")}

    # 1. The long-running reconciler, its first pass, then an idle window.
    reconciler = stack.spawn(
        "reconciler", ["-m", "reconciler", "run"], stack.env(bucket, proxies["reconciler"].url)
    )
    reconciler_started = time.monotonic()

    async def first_audit_done() -> bool:
        return await latest_completed_audit(direct) is not None

    await wait_until(first_audit_done, 180, "the reconciler's first pass")
    if args.bundles:
        # The operator's way (PROTOCOL §3.10): the running reconciler is registered and no
        # collector has written yet, so nothing blocks; not counted (a one-off).
        enable = ["-m", "reconciler", "enable-bundles"]
        await stack.run_to_end("enable-bundles", enable, stack.direct_env(bucket), 120.0)
    idle_before = proxies["reconciler"].snapshot()
    await asyncio.sleep(args.idle_s)  # a measured window of the idle daemon
    result.phases["reconciler idle window"] = since(proxies["reconciler"].snapshot(), idle_before)
    result.idle_seconds = args.idle_s

    # 2. Collectors.
    before = proxies["collectors"].snapshot()
    collector_env = stack.env(bucket, proxies["collectors"].url)
    collectors = [
        await stack.start_collector(f"collector-{i + 1}", collector_env)
        for i in range(args.collectors)
    ]
    result.phases["collectors: start-up probe"] = since(proxies["collectors"].snapshot(), before)

    # 3. New batches, then re-sends.
    frames = build_frames(args.batches, args.points, args.agents)
    policy = UploadPolicy(
        concurrency=args.concurrency,
        request_timeout_s=60.0,
        backoff=Backoff(attempts=6, base_s=0.1, cap_s=2.0),
    )
    async with Uploader(urls=[c.url for c in collectors], token=None, policy=policy) as uploader:
        window = proxies["collectors"].snapshot()
        started = time.monotonic()
        outcomes = await send_all(uploader, frames, concurrency=args.concurrency, rate=args.rate)
        result.load_seconds = time.monotonic() - started
        result.phases["collectors: new batches"] = since(proxies["collectors"].snapshot(), window)
        chosen = random.Random(5).sample(frames, int(len(frames) * args.resend_fraction))
        restarted = int(len(frames) * args.restart_resend_fraction)
        urls = [c.url for c in collectors]
        for label, header, group in (
            (RESEND_LOST, True, chosen[restarted:]),
            (RESEND_RESTART, False, chosen[:restarted]),
        ):
            window = proxies["collectors"].snapshot()
            answers = await resend_all(urls, group, header=header, concurrency=args.concurrency)
            outcomes.update({f"{label}: {k}": n for k, n in answers.items()})
            result.phases[label] = since(proxies["collectors"].snapshot(), window)
            result.resent[label] = len(group)
    result.outcomes = dict(outcomes)
    result.accepted = outcomes[Outcome.ACCEPTED.value]
    window = proxies["collectors"].snapshot()
    await stack.stop_collectors()
    result.phases["collectors: shutdown"] = since(proxies["collectors"].snapshot(), window)

    # 4. The reconciler catalogs everything, then stops.
    async def all_cataloged() -> bool:
        return await cataloged_manifests(direct) >= result.accepted

    result.catalog_wait_s = await wait_until(all_cataloged, 300, "cataloging every batch")
    await asyncio.to_thread(stop_child, reconciler)
    stack.children.remove(reconciler)
    result.reconciler_seconds = time.monotonic() - reconciler_started
    result.phases["reconciler: run (whole life)"] = proxies["reconciler"].snapshot()

    # 5. One audit, one GC run, one rollup.
    for name, args_, timeout_s in (
        ("reconciler: one full audit", ["-m", "reconciler", "audit"], 600.0),
        ("reconciler: one GC run", ["-m", "reconciler", "gc"], 600.0),
        ("rollup: one run", ["-m", "rollup", "run"], 1800.0),
    ):
        if "gc" in args_ and not args.gc:
            result.notes.append(
                "GC not measured (--no-gc); the reconciler ran with gc.enabled = false"
            )
            continue
        proxy = await stack.proxy(bucket, name)
        env = stack.env(bucket, proxy.url, LM_LOGGING__LEVEL="info")
        label = name.split(": ")[1].replace(" ", "-")
        await stack.run_to_end(label, args_, env, timeout_s)
        result.phases[name] = proxy.snapshot()
    result.loadavg["after main run"] = os.getloadavg()

    # 6. The rollup against 1x and 10x history.
    if args.history_base:
        for factor in (1, 10):
            run = await history_run(
                stack,
                factor=factor,
                base_batches=args.history_base,
                base_hours=args.history_hours,
                new=args.history_new,
                points=10,
            )
            result.history.append(run)
            print(f"  history {factor}x: {run.classes} in {run.seconds:.1f} s", flush=True)
    result.loadavg["end"] = os.getloadavg()
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cost", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--collectors", type=int, default=2)
    parser.add_argument("--batches", type=int, default=2_000)
    parser.add_argument("--points", type=int, default=100, help="points per batch")
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate", type=float, default=None, help="pace new batches (per s)")
    parser.add_argument("--resend-fraction", type=float, default=0.05, help="of the batches")
    parser.add_argument(
        "--restart-resend-fraction",
        type=float,
        default=0.01,
        help="of the batches: the part of the re-sends sent without the resend header",
    )
    parser.add_argument(
        "--flush-max-age-ms", type=int, default=None, help="default: the setting's default"
    )
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument(
        "--bundles",
        action="store_true",
        help="turn the feature gate on (lm-reconciler enable-bundles) before the collectors "
        "start: group commit with the default [ingest] bundle settings (PROTOCOL §3.10)",
    )
    parser.add_argument(
        "--no-gc", dest="gc", action="store_false", help="disable the GC (default: as deployed)"
    )
    parser.add_argument("--history-base", type=int, default=2_000, help="1x history (0: skip)")
    parser.add_argument("--history-hours", type=int, default=20, help="hours of 1x history")
    parser.add_argument("--history-new", type=int, default=100)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--keep-work-dir", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument(
        "--quick", action="store_true", help="400 batches, 10 s idle, no history (a smoke run)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.idle_s, args.history_base = min(args.batches, 400), 10.0, 0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="lm-cost-"))
    try:
        result = asyncio.run(on_cost_stack(work_dir, lambda stack: measure(args, stack)))
    finally:
        if not args.keep_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    text, summary = render(result)
    publish(text, summary, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
