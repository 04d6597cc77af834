"""`MemoryStore`: an in-process object store with S3 semantics, for tests and simulations.

Every operation is atomic: its check and its change happen under one lock with no
``await`` in between, so asyncio tasks (and threads) racing on a key see exactly one
winner, as on S3. Nothing survives the process.

ETags are the quoted MD5 hex of the body, as S3 gives for single-part uploads: a
rewrite with identical bytes keeps its ETag (as on S3), any other rewrite changes it.
``last_modified_ns`` comes from the injected clock, which is also the store's clock for
signed deletes: one is refused (`RequestExpired`) when sent after its expiry.
"""

from __future__ import annotations

import asyncio
import bisect
import builtins
import hashlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from protocol.clock import Clock, SystemClock
from store.base import (
    ObjectInfo,
    SignedDelete,
    check_key,
    check_put_conditions,
    check_range,
    check_signed_expiry,
)
from store.errors import NotFound, PreconditionFailed, RequestExpired

# S3's ListObjectsV2 page size; paging the same way keeps listings lazy and lets a
# concurrent writer's changes show up (or not) exactly as they would on S3.
_PAGE_SIZE = 1000


def body_etag(body: bytes) -> str:
    """The ETag a store without its own versioning gives ``body``: quoted MD5 hex."""
    return f'"{hashlib.md5(body, usedforsecurity=False).hexdigest()}"'


@dataclass(frozen=True, slots=True)
class _Object:
    body: bytes
    info: ObjectInfo


class MemoryStore:
    """A dict of objects behind the `ObjectStore` protocol. Errors: `NotFound`,
    `PreconditionFailed`, `ValueError` for invalid keys or conflicting conditions."""

    def __init__(self, url: str = "memory://", *, clock: Clock | None = None) -> None:
        self.url = url
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._objects: dict[str, _Object] = {}
        # UTF-8 encoded keys in bytewise (S3) order, kept beside the dict so that a listing
        # page is a bisect away instead of a sort of everything.
        self._order: list[bytes] = []
        # A threading lock, not an asyncio one: no operation awaits while holding it, and it
        # keeps the store correct if a test drives it from several threads.
        self._lock = threading.Lock()

    async def get(self, key: str) -> tuple[bytes, str]:
        check_key("get", key)
        with self._lock:
            obj = self._objects.get(key)
        if obj is None:
            raise NotFound("get", key)
        return obj.body, obj.info.etag

    async def get_if_none_match(self, key: str, etag: str) -> tuple[bytes, str] | None:
        """`get`, or ``None`` when the ETag is still ``etag`` (304)."""
        body, current = await self.get(key)
        return None if current == etag else (body, current)

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        check_key("get", key)
        check_range(key, offset, length)
        with self._lock:
            obj = self._objects.get(key)
        if obj is None:
            raise NotFound("get", key)
        return obj.body[offset : offset + length]

    async def head(self, key: str) -> ObjectInfo:
        check_key("head", key)
        with self._lock:
            obj = self._objects.get(key)
        if obj is None:
            raise NotFound("head", key)
        return obj.info

    async def put(
        self,
        key: str,
        body: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        check_key("put", key)
        check_put_conditions(key, if_none_match, if_match)
        body = bytes(body)
        info = ObjectInfo(key, len(body), body_etag(body), self._clock.now_ns())
        with self._lock:
            current = self._objects.get(key)
            if if_none_match and current is not None:
                raise PreconditionFailed("put", key, "object exists (If-None-Match: *)")
            if if_match is not None and (current is None or current.info.etag != if_match):
                found = "no object" if current is None else f"ETag {current.info.etag}"
                raise PreconditionFailed("put", key, f"If-Match {if_match}, found {found}")
            if current is None:
                bisect.insort(self._order, key.encode("utf-8"))
            self._objects[key] = _Object(body, info)
        return info.etag

    async def put_file(
        self,
        key: str,
        path: str,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        """`put` of the file's bytes (this store holds every body in memory anyway);
        through ``self.put``, so a subclass that watches puts sees this one too."""
        check_key("put", key)
        body = await asyncio.to_thread(Path(path).read_bytes)
        return await self.put(key, body, if_none_match=if_none_match, if_match=if_match)

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        raw_prefix = prefix.encode("utf-8")
        cursor = max(raw_prefix, start_after.encode("utf-8")) if start_after else raw_prefix
        inclusive = start_after is None or cursor != start_after.encode("utf-8")
        while True:
            with self._lock:
                page = self._page(raw_prefix, cursor, inclusive)
            for info in page:
                yield info
            if len(page) < _PAGE_SIZE:
                return
            cursor, inclusive = page[-1].key.encode("utf-8"), False
            # Like an S3 page fetch, give other tasks a turn between pages.
            await asyncio.sleep(0)

    def _page(self, prefix: bytes, cursor: bytes, inclusive: bool) -> builtins.list[ObjectInfo]:
        find = bisect.bisect_left if inclusive else bisect.bisect_right
        start = find(self._order, cursor)
        page: builtins.list[ObjectInfo] = []
        for raw in self._order[start : start + _PAGE_SIZE]:
            if not raw.startswith(prefix):
                break
            page.append(self._objects[raw.decode("utf-8")].info)
        return page

    async def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        raw_prefix = prefix.encode("utf-8")
        cursor = raw_prefix
        while True:
            with self._lock:
                start = bisect.bisect_left(self._order, cursor)
                raw = self._order[start] if start < len(self._order) else b""
            if not raw.startswith(raw_prefix) or not raw:
                return
            slash = raw.find(b"/", len(raw_prefix))
            if slash < 0:  # a key directly under the prefix: not a folder, skip it
                cursor = raw + b"\x00"
                continue
            folder = raw[: slash + 1]
            yield folder.decode("utf-8")
            cursor = folder[:-1] + b"0"  # '0' follows '/': past every key in the folder
            await asyncio.sleep(0)

    async def delete(self, key: str) -> None:
        check_key("delete", key)
        with self._lock:
            if self._objects.pop(key, None) is not None:
                raw = key.encode("utf-8")
                del self._order[bisect.bisect_left(self._order, raw)]

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        check_key("sign_delete", key)
        check_signed_expiry(key, expires_in_s)
        return SignedDelete(key, expires_in_s, self._clock.now_ns())

    async def send_signed_delete(self, request: SignedDelete) -> None:
        """`delete`, refused once the store's clock is past the request's expiry."""
        if self._clock.now_ns() > request.expires_at_unix_ns:
            raise RequestExpired("delete", request.key, "the signed request has expired")
        await self.delete(request.key)

    async def close(self) -> None:
        """Nothing to release; the objects stay readable (tests inspect them afterwards)."""
