"""`CountingStore`: any `ObjectStore` with its requests counted, for tests and benchmarks.

What one call costs on S3, and how it is counted: ``get``/``get_if_none_match``/
``get_range``/``head``/``delete`` one request (a ranged GET is a ``get``); ``put`` and
``put_file`` one, named by its condition (a multipart ``put_file`` is more on the wire,
counted as the one PUT it stands for); ``list`` one page
per 1,000 keys returned, at least one (S3's ListObjectsV2 page size, which
`store.s3.S3Store` uses); ``common_prefixes`` one; ``sign_delete`` none (signing is local)
and ``send_signed_delete`` one DELETE. Retries inside the wrapped store are not seen: on a
calm server there are none.

Two views of the same requests:

- `CountingStore.tally`: by ``(operation, area)``, the operations ``get``, ``head``,
  ``put``, ``put_if_none_match``, ``put_if_match``, ``list``, ``delete`` (the names
  `chaos.faults.classify` gives an HTTP request) and the `area_of` the key or LIST prefix;
  `by_class` turns it into S3 price classes. `CountingStore.scope` also counts, apart,
  the requests made *within* a block and by every task it starts (a task copies the
  context it is created in), never by tasks started before it.
- `CountingStore.requests`: ``(method, key)`` in order, the method being the operation
  without its condition (``get``, ``head``, ``put``, ``list``, ``delete``); `count` and
  `keys_of` ask it. ``lists`` holds ``(prefix, start_after)`` of every ``list`` call,
  ``listed`` the keys listings returned by area.

S3 prices requests by class: **PUT-class** = PUT, COPY, POST, LIST (`PUT_CLASS`);
**GET-class** = GET, HEAD and everything else (DELETE is free on S3, counted GET-class
here to be conservative).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import TypeVar

from store.base import ConditionalGet, ObjectInfo, ObjectStore, SignedDelete

T = TypeVar("T")
PUT_CLASS = frozenset({"put", "put_if_none_match", "put_if_match", "post", "list"})
LIST_PAGE_KEYS = 1000
Tally = Counter[tuple[str, str]]
"""Requests by ``(operation, area)``."""

_SCOPE: ContextVar[str | None] = ContextVar("counting_store_scope", default=None)


def request_class(op: str) -> str:
    """``"PUT"`` or ``"GET"``: how S3 bills an operation of `chaos.faults.classify`."""
    return "PUT" if op in PUT_CLASS else "GET"


def by_class(tally: Tally) -> dict[str, int]:
    """Requests by S3 price class: ``{"PUT": n, "GET": m}``."""
    totals = {"PUT": 0, "GET": 0}
    for (op, _area), count in tally.items():
        totals[request_class(op)] += count
    return totals


def area_of(key: str) -> str:
    """The part of the layout a key (or a LIST prefix) belongs to (PROTOCOL §3):
    ``raw-blobs``, ``accepted``, ``index-log``, ``reconciler/audits``, ``work-markers``..."""
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


def put_operation(if_none_match: bool, if_match: str | None) -> str:
    """A put's operation by its condition: ``put_if_none_match``, ``put_if_match``, ``put``."""
    return "put_if_none_match" if if_none_match else "put_if_match" if if_match else "put"


class CountingStore:
    """Forwards every call to ``inner`` and counts it (see the module docstring).
    ``inner`` keeps its name so `store.time.store_clock` finds the wrapped store's clock
    offset through it. It defines no ``list_until``: `store.base.list_range` lists
    through its ``list``, so every page is counted.

    With ``overlap``, each single request first yields to the event loop, so that
    concurrent calls really overlap (as on S3); ``max_in_flight`` is the most at once."""

    def __init__(
        self, inner: ObjectStore, *, overlap: bool = False, max_logged: int = 2_000_000
    ) -> None:
        """``max_logged``: the most requests (and list calls) `requests` and `lists` hold;
        one more raises `OverflowError` (the tally has no bound: it holds counts only).
        `clear` between phases of a long benchmark."""
        self.inner = inner
        self.url = inner.url
        self.tally: Tally = Counter()
        self.scoped: dict[str, Tally] = {}
        """Requests made within each `scope`, by name (also counted in `tally`)."""
        self.requests: list[tuple[str, str]] = []
        self.lists: list[tuple[str, str | None]] = []
        self.listed: Counter[str] = Counter()
        self._overlap = overlap
        self._max_logged = max_logged
        self.in_flight = 0
        self.max_in_flight = 0

    # -- what was counted ---------------------------------------------------------------

    def snapshot(self) -> Tally:
        return Counter(self.tally)

    def by_class(self) -> dict[str, int]:
        return by_class(self.tally)

    def count(self, method: str, prefix: str = "") -> int:
        """Requests of ``method`` (``put`` whatever its condition) on keys under ``prefix``."""
        return sum(1 for m, key in self.requests if m == method and key.startswith(prefix))

    def keys_of(self, method: str, prefix: str = "") -> list[str]:
        """The keys (LIST prefixes) of ``method``'s requests under ``prefix``, in order."""
        return [key for m, key in self.requests if m == method and key.startswith(prefix)]

    def clear(self) -> None:
        """Forget what was counted (``max_in_flight`` too; open scopes keep counting)."""
        self.tally.clear()
        for tally in self.scoped.values():
            tally.clear()
        self.requests.clear()
        self.lists.clear()
        self.listed.clear()
        self.max_in_flight = 0

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
        area = area_of(key)
        self.tally[(op, area)] += 1
        if (name := _SCOPE.get()) is not None and name in self.scoped:
            self.scoped[name][(op, area)] += 1
        if len(self.requests) >= self._max_logged:
            raise OverflowError(
                f"CountingStore logged {self._max_logged} requests: clear() it between "
                "phases, or pass a larger max_logged"
            )
        self.requests.append((op.partition("_if_")[0], key))

    async def _sent(self, call: Callable[[], Awaitable[T]]) -> T:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self._overlap:
                await asyncio.sleep(0)  # let other tasks start theirs
            return await call()
        finally:
            self.in_flight -= 1

    # -- the ObjectStore operations -----------------------------------------------------

    async def get(self, key: str) -> tuple[bytes, str]:
        self._count("get", key)
        return await self._sent(lambda: self.inner.get(key))

    async def get_if_none_match(self, key: str, etag: str) -> tuple[bytes, str] | None:
        self._count("get", key)  # one GET, answered 304 or 200
        inner = self.inner
        if not isinstance(inner, ConditionalGet):
            raise TypeError(f"{inner!r} has no conditional GET")
        return await self._sent(lambda: inner.get_if_none_match(key, etag))

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        self._count("get", key)  # one GET with a Range header, billed as any GET
        return await self._sent(lambda: self.inner.get_range(key, offset, length))

    async def head(self, key: str) -> ObjectInfo:
        self._count("head", key)
        return await self._sent(lambda: self.inner.head(key))

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        self._count(put_operation(if_none_match, if_match), key)
        return await self._sent(
            lambda: self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)
        )

    async def put_file(
        self, key: str, path: str, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        self._count(put_operation(if_none_match, if_match), key)
        return await self._sent(
            lambda: self.inner.put_file(key, path, if_none_match=if_none_match, if_match=if_match)
        )

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        self._count("list", prefix)
        self.lists.append((prefix, start_after))
        returned = 0
        async for info in self.inner.list(prefix, start_after):
            returned += 1
            if returned % LIST_PAGE_KEYS == 1 and returned > 1:
                self._count("list", prefix)  # the next page
            self.listed[area_of(prefix)] += 1
            yield info

    async def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        self._count("list", prefix)
        async for folder in self.inner.common_prefixes(prefix):
            yield folder

    async def delete(self, key: str) -> None:
        self._count("delete", key)
        await self._sent(lambda: self.inner.delete(key))

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        return await self.inner.sign_delete(key, expires_in_s=expires_in_s)  # sends nothing

    async def send_signed_delete(self, request: SignedDelete) -> None:
        self._count("delete", request.key)
        await self._sent(lambda: self.inner.send_signed_delete(request))

    async def close(self) -> None:
        await self.inner.close()
