"""Counting S3 requests for cost benchmarks: a counting proxy, request classes, prices.

`CountingProxy` is the chaos harness's `chaos.proxy.FaultProxy` in its calm phase (no
fault, every request forwarded unchanged) that also counts each request by its operation
and the *area* of the key it touches (`area_of`: ``raw-blobs``, ``accepted``,
``index-log``, ``reconciler/audits``, ...). One proxy per process role (collectors,
reconciler, rollup, ...) makes the counts attributable without asking the processes.

S3 prices requests by class: **PUT-class** = PUT, COPY, POST, LIST (`PUT_CLASS`);
**GET-class** = GET, HEAD and everything else (DELETE is free on S3, counted GET-class
here to be conservative). Prices: $0.005 per 1,000 PUT-class and $0.0004 per 1,000
GET-class requests (S3 Standard, us-east-1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from aiohttp import web

from chaos.faults import classify
from chaos.proxy import FaultProxy

PUT_CLASS = frozenset({"put", "put_if_none_match", "put_if_match", "post", "list"})
PRICE_PER_1K = {"PUT": 0.005, "GET": 0.0004}
Tally = Counter[tuple[str, str]]
"""Requests by ``(operation, area)``."""


def request_class(op: str) -> str:
    """``"PUT"`` or ``"GET"``: how S3 bills an operation of `chaos.faults.classify`."""
    return "PUT" if op in PUT_CLASS else "GET"


def area_of(key: str) -> str:
    """The part of the layout a key (or a LIST prefix) belongs to (PROTOCOL §3)."""
    parts = key.split("/")
    top = parts[0]
    if top == "index" and len(parts) > 2:
        return f"index-{parts[2]}"  # index-log, index-catalog, index-unreadable
    if top in ("reconciler", "gc", "rollup") and len(parts) > 2 and parts[2]:
        name = parts[2].removesuffix(".json")
        return f"{top}/{name}"
    if top == "work":
        return "work-markers"
    return top or "(root)"


def by_class(tally: Tally) -> dict[str, int]:
    totals = {"PUT": 0, "GET": 0}
    for (op, _area), count in tally.items():
        totals[request_class(op)] += count
    return totals


def dollars(put: float, get: float) -> float:
    return put * PRICE_PER_1K["PUT"] / 1000 + get * PRICE_PER_1K["GET"] / 1000


def select(tally: Tally, areas: Iterable[str], *, exclude: bool = False) -> Tally:
    """The part of ``tally`` in ``areas`` (or outside them, with ``exclude``)."""
    wanted = set(areas)
    return Counter({k: v for k, v in tally.items() if (k[1] in wanted) != exclude})


def describe(tally: Tally) -> str:
    """``op area: n`` for each entry, largest first (for the detail lines)."""
    return ", ".join(f"{op} {area}: {n}" for (op, area), n in tally.most_common())


class CountingProxy(FaultProxy):
    """A calm `FaultProxy` (no faults) that counts requests by ``(operation, area)``."""

    def __init__(self, *, upstream: str, bucket: str, prefix: str) -> None:
        super().__init__(upstream=upstream, seed=0, bucket=bucket, prefix=prefix)
        self.tally: Tally = Counter()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        op, key = classify(request.method, request.rel_url, request.headers, self.root)
        self.tally[(op, area_of(key))] += 1
        return await super()._handle(request)

    def snapshot(self) -> Tally:
        return Counter(self.tally)


def since(now: Tally, before: Mapping[tuple[str, str], int]) -> Tally:
    """What was counted between two snapshots."""
    return Counter({k: n - before.get(k, 0) for k, n in now.items() if n - before.get(k, 0)})
