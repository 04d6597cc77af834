"""Run the differential test's expressions against two Prometheus HTTP APIs and count, per
category, how many ran and how many agree (issue 32: "The test prints how many
expressions it ran per category and how many agree").

Each expression runs as an instant query at every time of `queries.INSTANT_TIMES` and,
unless it is instant-only, as one range query (`queries.RANGE`); it agrees when every one
of those answers is equal (`compare.differences`). Requests go out a few at a time
(`CONCURRENCY`), each with a bounded timeout; an HTTP answer that is not JSON is a
difference, never a crash of the run.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.collector.promql.diff.compare import differences
from tests.collector.promql.diff.queries import CATEGORIES, INSTANT_TIMES, QUERIES, RANGE, Query

CONCURRENCY = 4
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Target:
    """One Prometheus HTTP API: its base URL and the headers every request carries."""

    base_url: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Report:
    ran: Counter[str] = field(default_factory=Counter)
    agreed: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[Query, str, list[str]]] = field(default_factory=list)

    def table(self, title: str) -> str:
        lines = [f"{title}: {sum(self.agreed.values())} of {sum(self.ran.values())} agree"]
        lines += [
            f"  {category:<12} ran {self.ran[category]:>4}  agreed {self.agreed[category]:>4}"
            for category in CATEGORIES
            if category in self.ran
        ]
        for query, request, problems in self.failures[:20]:
            lines.append(f"  DIFFERS [{query.category}] {query.expr} ({request}): {problems[:3]}")
        return "\n".join(lines)


def requests_of(query: Query) -> list[tuple[str, dict[str, str]]]:
    """(path, params) of every request one expression makes."""
    found = [("/api/v1/query", {"query": query.expr, "time": at}) for at in INSTANT_TIMES]
    if not query.instant_only:
        found.append(("/api/v1/query_range", {"query": query.expr, **RANGE}))
    return found


async def ask(
    session: aiohttp.ClientSession, target: Target, path: str, params: Mapping[str, str]
) -> dict[str, Any]:
    """One API answer as JSON (POSTed form, as Grafana sends it); a body that is not
    Prometheus JSON becomes an error answer naming the HTTP status."""
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with session.post(
        f"{target.base_url}{path}", data=dict(params), headers=dict(target.headers), timeout=timeout
    ) as answer:
        text = await answer.text()
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        body = None
    if not isinstance(body, dict) or "status" not in body:
        return {"status": "error", "errorType": f"http {answer.status}", "error": text[:300]}
    return body


async def answers(
    session: aiohttp.ClientSession, target: Target, query: Query
) -> list[dict[str, Any]]:
    return [await ask(session, target, path, params) for path, params in requests_of(query)]


async def run_queries(
    queries: Sequence[Query], reference: Target, ours: Target, *, concurrency: int = CONCURRENCY
) -> Report:
    """Every expression against both targets; the per-category tally and what differed."""
    report = Report()
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as session:

        async def one(query: Query) -> None:
            async with gate:
                want, got = await asyncio.gather(
                    answers(session, reference, query), answers(session, ours, query)
                )
            report.ran[query.category] += 1
            failed = False
            for (path, params), a, b in zip(requests_of(query), want, got, strict=True):
                problems = differences(a, b)
                if problems:
                    where = f"{path} " + (f"time={params['time']}" if "time" in params else "range")
                    report.failures.append((query, where, problems))
                    failed = True
            if not failed:
                report.agreed[query.category] += 1

        await asyncio.gather(*(one(query) for query in queries))
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.collector.promql.diff.runner REFERENCE_URL OURS_URL``: every
    expression against two running APIs holding the fleet (ours with ``LM_TOKEN`` as its
    bearer token); prints the per-category tally, exits 1 unless all agree."""
    import argparse
    import os

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("reference_url")
    parser.add_argument("ours_url")
    args = parser.parse_args(argv)
    token = os.environ.get("LM_TOKEN")
    ours = Target(args.ours_url, {"Authorization": f"Bearer {token}"} if token else {})
    report = asyncio.run(run_queries(QUERIES, Target(args.reference_url), ours))
    print(report.table("reference against ours"))
    return 0 if report.agreed == report.ran else 1


if __name__ == "__main__":
    raise SystemExit(main())
