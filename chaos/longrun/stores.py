"""The stores a long world's collectors see (`chaos.longrun.world`): a process that can
die (`ProcessGate`), and requests that time out as an S3 client's do (`RequestTimeouts`).

`RequestTimeouts` gives every request the store's connect plus read timeout, as
`store.s3.S3Store`'s client does: a read that gets no answer in time is `Unavailable`, a
mutation `OutcomeUnknown` (it may still land: `chaos.sim.runtime.DelayedStore` lets a
request in flight land after its caller gave up). Without it, a `FaultyStore` ``HANG``
would hang a caller that sets no deadline of its own, such as `IndexLogWriter`'s segment
PUT, forever — which no S3 client does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from protocol import keys
from store.base import ObjectInfo, ObjectStore, SignedDelete
from store.errors import OutcomeUnknown, Unavailable

T = TypeVar("T")


class RequestTimeouts:
    """Each request answered within ``timeout_s`` or failed (see the module docstring).
    Listings are not timed (a page's wait is the caller's concern, as in `S3LikeRetries`)."""

    def __init__(self, inner: ObjectStore, *, timeout_s: float) -> None:
        self.inner = inner
        self.url = inner.url
        self._timeout_s = timeout_s

    async def _within(self, op: str, key: str, call: Awaitable[T], *, mutating: bool) -> T:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await call
        except TimeoutError:
            kind = OutcomeUnknown if mutating else Unavailable
            raise kind(op, key, f"simulated read timeout ({self._timeout_s:g}s)") from None

    async def get(self, key: str) -> tuple[bytes, str]:
        return await self._within("get", key, self.inner.get(key), mutating=False)

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        call = self.inner.get_range(key, offset, length)
        return await self._within("get", key, call, mutating=False)

    async def head(self, key: str) -> ObjectInfo:
        return await self._within("head", key, self.inner.head(key), mutating=False)

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        call = self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)
        return await self._within("put", key, call, mutating=True)

    async def put_file(
        self, key: str, path: str, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        call = self.inner.put_file(key, path, if_none_match=if_none_match, if_match=if_match)
        return await self._within("put", key, call, mutating=True)

    def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        return self.inner.list(prefix, start_after)

    def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        return self.inner.common_prefixes(prefix)

    async def delete(self, key: str) -> None:
        await self._within("delete", key, self.inner.delete(key), mutating=True)

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        return await self.inner.sign_delete(key, expires_in_s=expires_in_s)

    async def send_signed_delete(self, request: SignedDelete) -> None:
        call = self.inner.send_signed_delete(request)
        await self._within("delete", request.key, call, mutating=True)

    async def close(self) -> None:
        await self.inner.close()


class ProcessGate:
    """The store as one collector process reaches it (see the module docstring)."""

    def __init__(self, inner: ObjectStore, *, on_lost_flush: Callable[[], None]) -> None:
        self.inner = inner
        self.url = inner.url
        self.dead = False
        self.lose_next_flush = False
        self._on_lost_flush = on_lost_flush
        self._never = asyncio.Event()

    async def _alive(self) -> None:
        if self.dead:
            await self._never.wait()  # a dead process sends nothing, ever

    async def get(self, key: str) -> tuple[bytes, str]:
        await self._alive()
        return await self.inner.get(key)

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        await self._alive()
        return await self.inner.get_range(key, offset, length)

    async def head(self, key: str) -> ObjectInfo:
        await self._alive()
        return await self.inner.head(key)

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if self.lose_next_flush and not self.dead and key.startswith(keys.INDEX_LOG_PREFIX):
            self.lose_next_flush, self.dead = False, True
            self._on_lost_flush()
        await self._alive()
        return await self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)

    async def put_file(
        self, key: str, path: str, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        await self._alive()
        return await self.inner.put_file(key, path, if_none_match=if_none_match, if_match=if_match)

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        await self._alive()
        async for info in self.inner.list(prefix, start_after):
            yield info

    def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        return self.inner.common_prefixes(prefix)

    async def delete(self, key: str) -> None:
        await self._alive()
        await self.inner.delete(key)

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        return await self.inner.sign_delete(key, expires_in_s=expires_in_s)

    async def send_signed_delete(self, request: SignedDelete) -> None:
        await self._alive()
        await self.inner.send_signed_delete(request)

    async def close(self) -> None:
        await self.inner.close()
