"""`store.timed`: every request is observed once, by operation and result; the wrapper keeps
the store's contract (the shared suite runs it as the ``timed`` backend)."""

from __future__ import annotations

from typing import cast

import pytest
from prometheus_client import CollectorRegistry

from store.base import ConditionalGet, ObjectStore, get_if_changed, list_range
from store.errors import NotFound, PreconditionFailed
from store.memory import MemoryStore
from store.timed import StoreLatency, TimedStore, result_of


def count(registry: CollectorRegistry, op: str, result: str) -> float:
    value = registry.get_sample_value(
        "lm_store_request_seconds_count", {"op": op, "result": result}
    )
    return value or 0.0


async def test_each_request_is_observed_by_operation_and_result() -> None:
    registry = CollectorRegistry()
    latency = StoreLatency(registry)
    ticks = iter(float(n) for n in range(1000))
    store = TimedStore(MemoryStore(), observe=latency.observe, monotonic=lambda: next(ticks))

    await store.put("a/1", b"x", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        await store.put("a/1", b"x", if_none_match=True)
    with pytest.raises(NotFound):
        await store.get("a/2")
    body, etag = await store.get("a/1")
    await store.put("a/1", b"y", if_match=etag)
    await store.head("a/1")
    await store.delete("a/1")

    assert count(registry, "put_if_none_match", "ok") == 1
    assert count(registry, "put_if_none_match", "precondition_failed") == 1
    assert count(registry, "get", "not_found") == 1
    assert count(registry, "get", "ok") == 1
    assert count(registry, "put_if_match", "ok") == 1
    assert count(registry, "head", "ok") == 1
    assert count(registry, "delete", "ok") == 1
    # The injected clock ticks once per read: each call lasted exactly one second.
    total = registry.get_sample_value(
        "lm_store_request_seconds_sum", {"op": "get", "result": "not_found"}
    )
    assert total == 1.0
    assert body == b"x"


async def test_listings_and_conditional_gets_are_observed_and_forwarded() -> None:
    registry = CollectorRegistry()
    latency = StoreLatency(registry)
    inner = MemoryStore()
    for n in range(5):
        await inner.put(f"p/{n}", b"v")
    store = TimedStore(inner, observe=latency.observe)

    keys = [info.key async for info in list_range(store, "p/", None, "p/2")]
    assert keys == ["p/0", "p/1", "p/2"]
    assert count(registry, "list", "ok") == 1  # stopped early: still one answered listing

    assert isinstance(store, ConditionalGet)
    _body, etag = await inner.get("p/0")
    assert await get_if_changed(store, "p/0", etag) is None
    assert count(registry, "get", "ok") == 1


class _PlainStore:
    """A store without conditional GETs (as some wrappers are): get and put only."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.url = inner.url

    async def get(self, key: str) -> tuple[bytes, str]:
        return await self.inner.get(key)

    async def put(self, key: str, body: bytes) -> str:
        return await self.inner.put(key, body)


async def test_a_store_without_conditional_gets_is_answered_by_a_plain_get() -> None:
    registry = CollectorRegistry()
    plain = _PlainStore(MemoryStore())
    etag = await plain.put("k", b"v")
    store = TimedStore(cast(ObjectStore, plain), observe=StoreLatency(registry).observe)
    assert await get_if_changed(store, "k", etag) is None
    assert await get_if_changed(store, "k", "other") == (b"v", etag)
    assert count(registry, "get", "ok") == 2


def test_results_name_the_error_kind() -> None:
    assert result_of(None) == "ok"
    assert result_of(NotFound("get", "k")) == "not_found"
    assert result_of(TimeoutError()) == "outcome_unknown"
    assert result_of(ValueError("a bug")) == "error"
