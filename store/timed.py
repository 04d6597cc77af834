"""`TimedStore`: any `ObjectStore` with each request's latency observed, for the daemons'
``lm_store_request_seconds`` histogram (`StoreLatency`).

One wrapper shared by every daemon, so the metric has one name and one meaning everywhere:
``lm_store_request_seconds{op, result}`` (Prometheus' convention for a library's metric used
by several programs, like ``process_*``: the scrape's ``job`` and ``instance`` tell the
daemons apart). ``op`` is the request as S3 bills it (``get``, ``head``, ``put``,
``put_if_none_match``, ``put_if_match``, ``list``, ``delete``); ``result`` is ``ok`` or
the error's kind (``not_found``, ``precondition_failed``, ``conflict``,
``outcome_unknown``, ``unavailable``, ``expired``, ``error``), the same words as
``lm_collector_store_operations{result}``.

What one observation is: a call, from its start to its answer (retries inside the wrapped
store included: S3's library retries are off, `store.s3`). A listing is one observation
from its start to its last key; a listing its caller stops early is observed as
``ok`` when it is closed. A call cancelled by its caller (a budget ran out) is observed
as ``outcome_unknown``. ``sign_delete`` sends nothing and is not observed.

Wrappers that keep the wrapped store in ``inner`` are looked through by
`store.time.store_clock`. ``list_until`` (`store.base.BoundedListing`) and
``get_if_none_match`` (`store.base.ConditionalGet`) are defined here and use the wrapped
store's where it has them, else what `store.base` would do without them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Histogram

from store.base import ConditionalGet, ObjectInfo, ObjectStore, SignedDelete
from store.counting import put_operation
from store.errors import (
    ConditionConflict,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    RequestExpired,
    Unavailable,
)

T = TypeVar("T")
Observe = Callable[[str, str, float], None]
"""``(op, result, seconds)`` of one request."""

STORE_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_RESULTS: tuple[tuple[type[BaseException], str], ...] = (
    # Subclasses before their base: OutcomeUnknown is an Unavailable.
    (NotFound, "not_found"),
    (PreconditionFailed, "precondition_failed"),
    (ConditionConflict, "conflict"),
    (OutcomeUnknown, "outcome_unknown"),
    (Unavailable, "unavailable"),
    (RequestExpired, "expired"),
    (asyncio.CancelledError, "outcome_unknown"),
    (TimeoutError, "outcome_unknown"),
)


def result_of(exc: BaseException | None) -> str:
    """The ``result`` label of a request that ended with ``exc`` (``None``: ``ok``)."""
    if exc is None:
        return "ok"
    for kind, name in _RESULTS:
        if isinstance(exc, kind):
            return name
    return "error"


class StoreLatency:
    """``lm_store_request_seconds{op, result}`` on ``registry``; `observe` is a `TimedStore`'s
    ``observe``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram(
            "lm_store_request_seconds",
            "Object store requests by operation and result: seconds from the call to its "
            "answer (a listing: to its last key)",
            ["op", "result"],
            buckets=STORE_LATENCY_BUCKETS,
            registry=registry,
        )

    def observe(self, op: str, result: str, seconds: float) -> None:
        self.histogram.labels(op=op, result=result).observe(seconds)


class TimedStore:
    """Forwards every call to ``inner`` and observes its latency (module docstring)."""

    def __init__(
        self,
        inner: ObjectStore,
        *,
        observe: Observe,
        monotonic: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self._observe = observe
        self._monotonic = monotonic

    async def _timed(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        start = self._monotonic()
        error: BaseException | None = None
        try:
            return await call()
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._observe(op, result_of(error), self._monotonic() - start)

    async def _timed_listing(self, listing: AsyncIterator[T]) -> AsyncIterator[T]:
        start = self._monotonic()
        error: BaseException | None = None
        try:
            async for item in listing:
                yield item
        except GeneratorExit:
            raise  # the caller stopped early: the pages it read were answered
        except BaseException as exc:
            error = exc
            raise
        finally:
            aclose = getattr(listing, "aclose", None)
            if aclose is not None:
                await aclose()
            self._observe("list", result_of(error), self._monotonic() - start)

    # -- the ObjectStore operations -----------------------------------------------------

    async def get(self, key: str) -> tuple[bytes, str]:
        return await self._timed("get", lambda: self.inner.get(key))

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        return await self._timed("get", lambda: self.inner.get_range(key, offset, length))

    async def head(self, key: str) -> ObjectInfo:
        return await self._timed("head", lambda: self.inner.head(key))

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        return await self._timed(
            put_operation(if_none_match, if_match),
            lambda: self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match),
        )

    async def put_file(
        self, key: str, path: str, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        return await self._timed(
            put_operation(if_none_match, if_match),
            lambda: self.inner.put_file(key, path, if_none_match=if_none_match, if_match=if_match),
        )

    def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        return self._timed_listing(self.inner.list(prefix, start_after))

    def list_until(
        self, prefix: str, start_after: str | None, until: str
    ) -> AsyncIterator[ObjectInfo]:
        """The wrapped store's bounded listing where it has one, else its ``list``
        (`store.base.list_range` stops that at ``until``)."""
        bounded = getattr(type(self.inner), "list_until", None)
        if callable(bounded):
            return self._timed_listing(bounded(self.inner, prefix, start_after, until))
        return self._timed_listing(self.inner.list(prefix, start_after))

    def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        return self._timed_listing(self.inner.common_prefixes(prefix))

    async def delete(self, key: str) -> None:
        await self._timed("delete", lambda: self.inner.delete(key))

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        return await self.inner.sign_delete(key, expires_in_s=expires_in_s)  # sends nothing

    async def send_signed_delete(self, request: SignedDelete) -> None:
        await self._timed("delete", lambda: self.inner.send_signed_delete(request))

    async def get_if_none_match(self, key: str, etag: str) -> tuple[bytes, str] | None:
        """`store.base.ConditionalGet`, defined on the class: Python 3.12 checks protocols
        with ``getattr_static``, which never sees ``__getattr__``. A wrapped store without
        it answers through a plain GET compared by ETag (`store.base.get_if_changed`'s
        fallback: same answer, full cost)."""
        inner = self.inner
        if isinstance(inner, ConditionalGet):
            return await self._timed("get", lambda: inner.get_if_none_match(key, etag))
        body, current = await self.get(key)
        return None if current == etag else (body, current)

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        """Anything else the wrapped store has (its ``url``-like attributes, helpers)."""
        if name == "inner":
            raise AttributeError(name)  # not yet set (copying, unpickling): never recurse
        return getattr(self.inner, name)
