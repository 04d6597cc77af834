"""``lm-demo``: the whole ingest path on the embedded filesystem store, in a fresh directory.

1. starts two collector processes over one ``file://`` store (active-active);
2. runs a synthetic fleet through both (round-robin), with injected duplicates;
3. sends one deliberate identity conflict (same identity, different points) → 409;
   with ``--receivers``, also Prometheus remote_write requests to one collector and
   their re-sends to the other (`demo.receivers_step`): accepted once, then duplicates;
4. stops the collectors (SIGTERM: their index log buffers are flushed) and checks the
   store: exactly one accepted manifest per identity acknowledged, each with its raw
   blob; prints the layout (acceptance records, blobs, index log segments);
5. loses what a crash would lose and runs the reconciler (`demo.reconcile_step`): the
   audit catalogs exactly the records a deleted log segment named, the orphan blob is
   collected, no log segment waits, zero problems; prints the layout again (now with
   the catalog files and the rollup's work markers);
6. runs the rollup (`demo.rollup_step`, a local Spark session): the ``rollup_1m`` totals
   must equal what the agents were acknowledged for, ``lm-rollup verify`` must pass, and
   a query prints some rows (``--no-rollup`` skips this step; it needs the ``rollup``
   extra and Java, which ``scripts/demo`` installs);
7. reads with SQL and deletes one series (`demo.lifecycle_step`): ``lm-rollup sql``
   prints points per metric, ``lm-rollup delete`` commits a tombstone, the query no
   longer returns the series, totals drop by exactly its points, verify still passes;
8. starts a designated query collector (`demo.query_step`), sends it one new batch and
   prints one ``GET /v1/query`` answer — the latest snapshot merged with that batch —
   with its ``complete`` flag, then asks its PromQL engine (`demo.promql_step`) for
   ``sum(count_over_time(...))``, which must equal the points acknowledged (skipped with
   ``--no-rollup``);
9. prints what happened and where the data lies.

Exit code 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from agent.fleet import FleetResult, RunOptions, SpoolSettings, run_fleet
from agent.load import LoadSpec
from collector.launch import start_collector
from config import SettingsError, configure_logging
from config.cli import add_settings_flags, settings_flags_given, settings_from_flags
from demo import lifecycle_step, query_step, receivers_step, reconcile_step, rollup_step
from protocol import keys, records
from protocol.batch_api import BATCHES_PATH, FRAME_CONTENT_TYPE
from protocol.frame_encode import encode_frame, points_table
from store.fs import FileSystemStore

LAYOUT = (
    (keys.ACCEPTED_PREFIX, "accepted manifests (acceptance records)"),
    (keys.QUARANTINE_PREFIX, "quarantine records (identity conflicts)"),
    (keys.RAW_BLOBS_PREFIX, "raw blobs (the frames)"),
    (keys.INDEX_LOG_PREFIX, "index log segments (written by the collectors)"),
    (keys.INDEX_CATALOG_PREFIX, "catalog files (written by the reconciler)"),
    (keys.ROLLUP_WORK_PREFIX, "rollup work markers (one per catalog file)"),
    (keys.RECONCILER_PREFIX, "reconciler state (lease, checkpoint, audits, orphan lists)"),
    ("gc/v1/", "GC marks, vetoes and deletion log"),
    (keys.ROLLUP_PREFIX, "rollup dataset (tables, ledger, snapshots)"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lm-demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, help="work directory (default: a new ./lm-demo-<time>)")
    parser.add_argument("--agents", type=int, default=6)
    parser.add_argument("--batches", type=int, default=40, help="batches per agent")
    parser.add_argument("--points-per-batch", type=int, default=250)
    parser.add_argument("--duplicate-rate", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--no-rollup", action="store_true", help="skip the rollup step (no Spark, no Java)"
    )
    parser.add_argument(
        "--receivers",
        action="store_true",
        help="also ingest Prometheus remote_write requests (POST /api/v1/write)",
    )
    add_settings_flags(
        parser, config_help="settings file (the demo and its processes use [logging])"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if settings_flags_given(args):  # else as before: structlog's defaults
            configure_logging(settings_from_flags(args).logging)
    except SettingsError as exc:
        print(f"lm-demo: configuration error:\n{exc}", file=sys.stderr)
        return 2
    work_dir = args.dir or Path.cwd() / time.strftime("lm-demo-%Y%m%d-%H%M%S")
    if work_dir.exists() and any(work_dir.iterdir()):
        print(f"lm-demo: {work_dir} is not empty; pass a new --dir", file=sys.stderr)
        return 2
    work_dir.mkdir(parents=True, exist_ok=True)
    store_dir = work_dir / "store"
    spec = LoadSpec(
        agents=args.agents,
        batches=args.batches,
        points_per_batch=args.points_per_batch,
        duplicate_rate=args.duplicate_rate,
        seed=args.seed,
        start_ns=(time.time_ns() // 3_600_000_000_000) * 3_600_000_000_000,
        interval_ns=1_000_000_000,
    )
    step(f"work directory {work_dir}")
    collectors = [
        start_collector(
            work_dir=work_dir / "logs",
            name=f"collector-{i}",
            env={
                "LM_STORE__URL": f"file://{store_dir}",
                "LM_INGEST__COLLECTOR_ID": f"demo-collector-{i}",
            },
        )
        for i in (1, 2)
    ]
    try:
        for collector in collectors:
            step(f"collector pid {collector.pid} listening on {collector.url}")
        result, conflict = asyncio.run(_drive(work_dir, [c.url for c in collectors], spec))
        receiver_problems = (
            asyncio.run(
                receivers_step.send(
                    [c.url for c in collectors], result.truth, step, start_ns=spec.start_ns
                )
            )
            if args.receivers
            else []
        )
    finally:
        codes = [c.stop() for c in collectors]
    step(f"collectors stopped with exit codes {codes}")
    problems = receiver_problems + asyncio.run(_report(store_dir, result, conflict))
    problems += reconcile_step.run(store_dir, step)
    asyncio.run(_print_layout(store_dir))
    if not args.no_rollup:
        totals = result.truth.totals()
        rolled = rollup_step.run(store_dir, work_dir / "logs", totals, step)
        deleted = 0
        if not rolled:
            lifecycle_problems, deleted = lifecycle_step.run(store_dir, spec.start_ns, step)
            rolled = lifecycle_problems
        problems += rolled
        if not problems:
            problems += query_step.run(
                store_dir, work_dir / "logs", spec.start_ns, step, points=totals.points - deleted
            )
    if any(codes):
        problems.append(f"a collector exited with {codes}")
    print()
    if problems:
        for problem in problems:
            print(f"PROBLEM: {problem}")
        return 1
    print(
        "All checks passed: every acknowledged batch has exactly one accepted manifest and its "
        "raw blob; the reconciler cataloged every record and collected only the orphan"
        + (
            "."
            if args.no_rollup
            else "; rollup_1m totals equal what the agents sent and every hour verifies; "
            "a deleted series is gone from every read and verify still proves every batch once."
        )
    )
    return 0


def step(message: str) -> None:
    print(f"==> {message}", flush=True)


async def _drive(
    work_dir: Path, urls: list[str], spec: LoadSpec
) -> tuple[FleetResult, dict[str, Any]]:
    step(
        f"sending {spec.total_batches} batches x {spec.points_per_batch} points from {spec.agents} agents through {len(urls)} collectors"
    )
    result = await run_fleet(
        urls=urls,
        token=None,
        spool=SpoolSettings(directory=work_dir / "agent-spool"),
        spec=spec,
        options=RunOptions(max_rounds=5, round_delay_s=0.5),
    )
    print(result.summary.render_table())
    step("sending one deliberate identity conflict (an accepted identity with different points)")
    conflict = await _send_conflict(urls[1], result)
    print(f"    answer: {conflict['status']} {conflict['body'].get('error')}")
    return result, conflict


async def _send_conflict(url: str, result: FleetResult) -> dict[str, Any]:
    """POST different points under an identity that was already accepted."""
    identity = next(iter(result.truth.accepted))
    count = identity.seq_end - identity.seq_start + 1
    points = points_table(
        [time.time_ns()] * count, ["demo_conflict"] * count, [42.0] * count, [None] * count
    )
    frame = encode_frame(
        agent_id=identity.agent_id,
        boot_id=identity.boot_id,
        seq_start=identity.seq_start,
        points=points,
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url + BATCHES_PATH, data=frame, headers={"Content-Type": FRAME_CONTENT_TYPE}
        ) as response,
    ):
        return {"status": response.status, "body": await response.json(), "identity": identity}


async def _report(store_dir: Path, result: FleetResult, conflict: dict[str, Any]) -> list[str]:
    store = FileSystemStore(store_dir)
    problems: list[str] = []
    manifests: dict[keys.BatchIdentity, records.AcceptedManifest] = {}
    async for info in store.list(keys.ACCEPTED_PREFIX):
        manifest = records.AcceptedManifest.from_json((await store.get(info.key))[0])
        manifests[manifest.identity] = manifest
    per_prefix = await _print_layout(store_dir)
    by_collector = Counter(m.collector_id for m in manifests.values())
    step(f"accepted manifests by collector: {dict(sorted(by_collector.items()))}")
    acknowledged = result.truth.accepted
    for identity, truth in acknowledged.items():
        stored = manifests.get(identity)
        if stored is None:
            problems.append(f"acknowledged {identity} has no accepted manifest")
            continue
        manifest = stored
        if manifest.frame_sha256 != truth.frame_sha256:
            problems.append(
                f"{identity}: manifest hash {manifest.frame_sha256} != acknowledged {truth.frame_sha256}"
            )
        blob, _ = await store.get(manifest.raw_blob_key)
        if hashlib.sha256(blob).hexdigest() != manifest.frame_sha256:
            problems.append(f"{identity}: raw blob does not hash to {manifest.frame_sha256}")
    if len(manifests) != len(acknowledged):
        problems.append(
            f"{len(manifests)} accepted manifests but {len(acknowledged)} identities acknowledged"
        )
    if conflict["status"] != 409:
        problems.append(f"the deliberate conflict was answered {conflict['status']}, not 409")
    quarantined = per_prefix.get(keys.QUARANTINE_PREFIX, 0)
    if quarantined < 1:
        problems.append("no quarantine record for the deliberate conflict")
    totals = result.truth.totals()
    step(
        f"acknowledged: {totals.batches} batches, {totals.points} points (value sum {totals.value_sum:.3f}); "
        f"{result.summary.duplicates} duplicates answered; {quarantined} identity conflict(s) quarantined"
    )
    await store.close()
    return problems


async def _print_layout(store_dir: Path) -> Counter[str]:
    """Print how many objects lie under each part of the layout (PROTOCOL §3); return the
    counts by prefix."""
    store = FileSystemStore(store_dir)
    per_prefix: Counter[str] = Counter()
    try:
        async for info in store.list(""):
            prefix = next((p for p, _label in LAYOUT if info.key.startswith(p)), None)
            per_prefix[prefix or "/".join(info.key.split("/")[:2]) + "/"] += 1
    finally:
        await store.close()
    step(f"objects in {store_dir}, by part of the layout")
    labels = dict(LAYOUT)
    for prefix, count in sorted(per_prefix.items()):
        print(f"    {count:6d}  {prefix:34s} {labels.get(prefix, '')}".rstrip())
    return per_prefix


if __name__ == "__main__":
    sys.exit(main())
