"""`CountingStore`: an `ObjectStore` wrapper counting requests for in-process benchmarks.

`bench.counting.CountingProxy` counts what a child process sends over HTTP; this counts
what code running in the benchmark's own process asks of its store (the reconciler's
audit and GC driven by `bench.raw_retention`), in the same vocabulary, so
`bench.counting.by_class`, `dollars` and `describe` apply: a `bench.counting.Tally` by
``(operation, area)`` with the operations of `chaos.faults.classify` (``get``, ``head``,
``put``, ``put_if_none_match``, ``put_if_match``, ``list``, ``delete``).

What one call costs on S3: ``get``/``get_if_none_match``/``head``/``delete`` one request;
``put`` one, named by its condition; ``list`` one page per 1,000 keys returned, at least
one (S3's ListObjectsV2 page size, which `store.s3.S3Store` uses); ``sign_delete`` none
(signing is local) and ``send_signed_delete`` one DELETE. Store-level retries (a 503 the
store repeats) are not seen here: on a calm server there are none, and `bench.raw_retention`
cross-checks the count against the S3 client's own on MiniStack.

`CountingStore.scope` also counts, apart, the requests made *within* a named scope: by the
code under a ``with`` block and by every task that code starts (a task copies the context
it is created in), never by tasks started before it. `bench.gc` counts one GC run's
requests that way while the daemon's background audit and lease renewal use the same
store.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar
from typing import Any

from bench.counting import Tally, area_of
from store.base import ConditionalGet, ObjectInfo, ObjectStore, SignedDelete

LIST_PAGE_KEYS = 1000
_SCOPE: ContextVar[str | None] = ContextVar("bench_counting_scope", default=None)


class CountingStore:
    """Forwards every call to ``inner`` and counts it in `tally`. ``inner`` keeps its name
    so `store.time.store_clock` finds the wrapped store's clock offset through it."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.tally: Tally = Counter()
        self.scoped: dict[str, Tally] = {}
        """Requests made within each `scope`, by name (also counted in `tally`)."""

    def snapshot(self) -> Tally:
        return Counter(self.tally)

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[Tally]:
        """Count the requests made within the block (and by the tasks it starts) in
        ``scoped[name]`` too; yields that tally. Scopes do not nest: the inner one wins."""
        tally = self.scoped.setdefault(name, Counter())
        token = _SCOPE.set(name)
        try:
            yield tally
        finally:
            _SCOPE.reset(token)

    def _count(self, op: str, key: str) -> None:
        self.tally[(op, area_of(key))] += 1
        if (name := _SCOPE.get()) is not None and name in self.scoped:
            self.scoped[name][(op, area_of(key))] += 1

    async def get(self, key: str) -> tuple[bytes, str]:
        self._count("get", key)
        return await self.inner.get(key)

    async def get_if_none_match(self, key: str, etag: str) -> tuple[bytes, str] | None:
        self._count("get", key)  # one GET, answered 304 or 200
        if not isinstance(self.inner, ConditionalGet):
            raise TypeError(f"{self.inner!r} has no conditional GET")
        return await self.inner.get_if_none_match(key, etag)

    async def head(self, key: str) -> ObjectInfo:
        self._count("head", key)
        return await self.inner.head(key)

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        op = "put_if_none_match" if if_none_match else "put_if_match" if if_match else "put"
        self._count(op, key)
        return await self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)

    async def put_file(
        self, key: str, path: str, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        op = "put_if_none_match" if if_none_match else "put_if_match" if if_match else "put"
        self._count(op, key)
        return await self.inner.put_file(key, path, if_none_match=if_none_match, if_match=if_match)

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        self._count("list", prefix)
        returned = 0
        async for info in self.inner.list(prefix, start_after):
            returned += 1
            if returned % LIST_PAGE_KEYS == 1 and returned > 1:
                self._count("list", prefix)  # the next page
            yield info

    async def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        self._count("list", prefix)
        async for folder in self.inner.common_prefixes(prefix):
            yield folder

    async def delete(self, key: str) -> None:
        self._count("delete", key)
        await self.inner.delete(key)

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        return await self.inner.sign_delete(key, expires_in_s=expires_in_s)  # sends nothing

    async def send_signed_delete(self, request: SignedDelete) -> None:
        self._count("delete", request.key)
        await self.inner.send_signed_delete(request)

    async def close(self) -> None:
        await self.inner.close()


def attach_wire_count(client: Any) -> Counter[str]:
    """Count the S3 client's own requests (signed DELETEs bypass it: aiohttp)."""
    counts: Counter[str] = Counter()

    def after(model: Any, **_: Any) -> None:
        counts[model.name] += 1

    client.meta.events.register("after-call.s3", after)
    client.meta.events.register("after-call-error.s3", after)
    return counts
