"""Counting S3 requests for cost benchmarks: a counting proxy, request classes, prices.

`CountingProxy` is the chaos harness's `chaos.proxy.FaultProxy` in its calm phase (no
fault, every request forwarded unchanged) that also counts each request by its operation
and the *area* of the key it touches (`area_of`: ``raw-blobs``, ``accepted``,
``index-log``, ``reconciler/audits``, ...). One proxy per process role (collectors,
reconciler, rollup, ...) makes the counts attributable without asking the processes.

In-process benchmarks count at the store instead (`store.counting.CountingStore`), in the
same vocabulary: the request classes (`PUT_CLASS`, `request_class`, `by_class`), `area_of`
and `Tally` are `store.counting`'s, so one place says how S3 bills a request. Prices:
$0.005 per 1,000 PUT-class and $0.0004 per 1,000 GET-class requests (S3 Standard,
us-east-1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web

from chaos.faults import classify
from chaos.proxy import FaultProxy
from store.counting import PUT_CLASS, Tally, area_of, by_class, request_class

PRICE_PER_1K = {"PUT": 0.005, "GET": 0.0004}


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


def attach_wire_count(client: Any) -> Counter[str]:
    """Count an S3 client's own requests by operation (signed DELETEs bypass it: aiohttp),
    to cross-check a `store.counting.CountingStore` on MiniStack."""
    counts: Counter[str] = Counter()

    def after(model: Any, **_: Any) -> None:
        counts[model.name] += 1

    client.meta.events.register("after-call.s3", after)
    client.meta.events.register("after-call-error.s3", after)
    return counts


__all__ = [
    "PRICE_PER_1K",
    "PUT_CLASS",
    "CountingProxy",
    "Tally",
    "area_of",
    "attach_wire_count",
    "by_class",
    "describe",
    "dollars",
    "request_class",
    "select",
    "since",
]
