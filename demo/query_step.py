"""The demo's live query step: ``GET /v1/query`` on a designated query collector.

After the rollup, a third collector starts with ``[query] designated = true``: it follows
the store's index log and keeps the recent batches in memory (`collector.query.sources`).
The demo sends it one new batch (not rolled up yet) and asks ``/v1/query`` for one
host by minute: the committed minutes of the latest snapshot merged with the new
batch's points. The answer is printed with its ``complete`` flag: ``false`` here, since the hour
the batches were accepted in has not been sealed by an audit that started after it
ended (README "Live queries").
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from collector.launch import start_collector
from demo import promql_step
from protocol.batch_api import BATCHES_PATH, FRAME_CONTENT_TYPE
from protocol.frame_encode import encode_frame, points_table

DEADLINE_S = 30.0
METRIC, LABEL = "memory_used_bytes", "host=host-0000"
SHOWN_ROWS = 4
LIVE_TIMES = range(3)


def run(
    store_dir: Path, logs_dir: Path, start_ns: int, step: Callable[[str], None], *, points: int
) -> list[str]:
    """Run the step, then the PromQL step (`demo.promql_step`) on the same collector;
    ``points``: the committed points the agents were acknowledged for, deletes taken off.
    Return the problems found (empty when every check holds)."""
    step("starting a designated query collector ([query] designated = true)")
    collector = start_collector(
        work_dir=logs_dir,
        name="query-collector",
        env={
            "LM_STORE__URL": f"file://{store_dir}",
            "LM_INGEST__COLLECTOR_ID": "demo-query-collector",
            "LM_QUERY__DESIGNATED": "true",
            "LM_QUERY__POLL_INTERVAL_S": "0.5",
            "LM_QUERY__REFRESH_INTERVAL_S": "1",
            **promql_step.engine_env(),
        },
    )
    try:
        problems = asyncio.run(_ask(collector.url, start_ns, step))
        if problems:
            return problems
        live = len(LIVE_TIMES)
        return asyncio.run(promql_step.check(collector.url, start_ns, points + live, step))
    finally:
        collector.stop()


async def _ask(url: str, start_ns: int, step: Callable[[str], None]) -> list[str]:
    now = time.time_ns()
    params = {
        "metric": METRIC,
        "label": LABEL,
        "step": "1m",
        # Unix seconds, as Prometheus's API (PROTOCOL §2); the minute after now included.
        "from": str(start_ns // 1_000_000_000),
        "to": str(now // 1_000_000_000 + 60),
    }
    async with aiohttp.ClientSession() as session:
        frame = _live_frame(now)
        async with session.post(
            url + BATCHES_PATH, data=frame, headers={"Content-Type": FRAME_CONTENT_TYPE}
        ) as response:
            if response.status != 200:
                return [f"the live batch was answered {response.status}"]
        step(f"GET /v1/query?{'&'.join(f'{k}={v}' for k, v in params.items())}")
        answer = await _wait_for_live(session, url, params)
    if answer is None:
        return [f"/v1/query did not show the new batch within {DEADLINE_S}s"]
    sources = answer["sources"]
    print(
        f"    complete: {json.dumps(answer['complete'])}  snapshot_version: "
        f"{answer['snapshot_version']}  sealed_through_ns: {answer['sealed_through_ns']}  "
        f"live_through_ns: {answer['live_through_ns']}"
    )
    print(
        f"    sources: {sources['snapshot_rows']} rows from the snapshot, "
        f"{sources['live_rows']} live points from {sources['live_batches']} batch(es) not yet in it"
    )
    columns = answer["columns"]
    shown = ("window_start", "series", "count", "min", "max", "last")
    rows = answer["rows"]
    # Sorted by series: the new batch's series (region="live") first, then the committed.
    picked = rows if len(rows) <= SHOWN_ROWS else [rows[0], None, *rows[-(SHOWN_ROWS - 1) :]]
    for row in picked:
        if row is None:
            print("    ...")
            continue
        cells = dict(zip(columns, row, strict=True))
        print("    " + "  ".join(str(cells[c]) for c in shown))
    if not answer["complete"]:
        print(
            "    (not complete: the hour these batches were accepted in is not yet sealed "
            "by an audit that started after it ended)"
        )
    problems = []
    if answer["snapshot_version"] is None or sources["snapshot_rows"] < 1:
        problems.append(f"/v1/query did not read the committed snapshot: {sources}")
    return problems


async def _wait_for_live(
    session: aiohttp.ClientSession, url: str, params: dict[str, str]
) -> dict[str, Any] | None:
    """Ask until the answer includes the new batch (flush + poll interval), bounded."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        async with session.get(f"{url}/v1/query", params=params) as response:
            if response.status == 200:
                answer: dict[str, Any] = await response.json()
                if answer["sources"]["live_rows"] >= 1:
                    return answer
        await asyncio.sleep(0.25)  # polling interval, bounded by the deadline
    return None


def _live_frame(now_ns: int) -> bytes:
    """One new batch of the demo series, accepted after the rollup ran."""
    points = points_table(
        [now_ns - 1_000_000_000 * i for i in LIVE_TIMES],
        [METRIC] * 3,
        [1.0e9, 1.5e9, 2.0e9],
        [{"host": "host-0000", "region": "live"}] * 3,
    )
    return encode_frame(
        agent_id="demo-live-agent", boot_id=uuid.uuid4(), seq_start=0, points=points
    )
