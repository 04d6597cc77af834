"""The demo's PromQL step: a PromQL query through the query collector's Prometheus API.

The designated query collector of `demo.query_step` runs a real Prometheus as its PromQL
engine (``[query.promql] prometheus``, PROTOCOL §5), which holds no data and reads
everything through the collector's remote read: the latest snapshot plus the live
window, deletes masked. The demo asks ``GET /api/v1/query`` for
``sum(count_over_time({__name__=~".+"}[1d]))`` at the end of the demo's day and checks it
against what the agents were acknowledged for: every point sent, minus the points of the
series the lifecycle step deleted, plus the live batch's.

Without a ``prometheus`` binary (``scripts/demo`` installs Debian's) the step says so and
is skipped.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable
from typing import Any

import aiohttp

DEADLINE_S = 60.0
DAY_S = 86_400
QUERY = 'sum(count_over_time({__name__=~".+"}[1d]))'


def engine_env() -> dict[str, str]:
    """The query collector's settings for a supervised engine, if one is installed."""
    binary = shutil.which("prometheus")
    return {"LM_QUERY__PROMQL__PROMETHEUS": binary} if binary else {}


async def check(
    url: str, start_ns: int, expected_points: int, step: Callable[[str], None]
) -> list[str]:
    """Ask the PromQL query; return the problems found."""
    if not engine_env():
        step(
            "PromQL through /api/v1/query: skipped (no prometheus binary; scripts/demo installs it)"
        )
        return []
    at = start_ns // 1_000_000_000 + DAY_S  # every demo point lies in the day after start
    params = {"query": QUERY, "time": str(at)}
    step(f"GET /api/v1/query?query={QUERY}&time={at}  (PromQL, a real Prometheus engine)")
    answer = await _ask(url, params)
    if answer is None:
        return [f"/api/v1/query did not answer 200 within {DEADLINE_S:g}s"]
    if answer.get("status") != "success" or answer.get("warnings"):
        return [f"/api/v1/query answered {json.dumps(answer)[:300]}"]
    result = answer["data"]["result"]
    got = int(float(result[0]["value"][1])) if result else 0
    print(
        f"    {got} samples (acknowledged, less the deleted series, plus the live batch: {expected_points})"
    )
    if got != expected_points:
        return [f"PromQL counted {got} samples; the agents were acknowledged for {expected_points}"]
    return []


async def _ask(url: str, params: dict[str, str]) -> dict[str, Any] | None:
    """Ask until the engine is up (it starts with the collector), bounded by the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            async with session.get(f"{url}/api/v1/query", params=params) as response:
                if response.status == 200:
                    answer: dict[str, Any] = await response.json()
                    return answer
                if response.status != 503:  # 503: the engine is still starting
                    return {"status": response.status, "body": await response.text()}
            await asyncio.sleep(0.5)  # polling interval, bounded by the deadline
    return None
