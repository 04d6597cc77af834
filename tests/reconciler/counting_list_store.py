"""Store wrappers for the audit listing tests: one that records each listing, one that
stops writing parts after some (a crash at a known point)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

from store.base import ObjectInfo, ObjectStore


class Crashed(RuntimeError):
    """The simulated crash."""


class ListRecorder:
    """Forwards everything; records ``(prefix, start_after)`` of every ``list`` and the
    prefix of every ``common_prefixes``. (It defines no ``list_until``, so
    `store.base.list_range` lists through its ``list``.)"""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner, self.url = inner, inner.url
        self.lists: list[tuple[str, str | None]] = []
        self.folder_lists: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        self.lists.append((prefix, start_after))
        return self.inner.list(prefix, start_after)

    def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        self.folder_lists.append(prefix)
        return self.inner.common_prefixes(prefix)


class HangAfterParts:
    """After ``limit`` listing parts under ``audit_dir`` were written, every later put of
    one never returns (``hang=True``, announced on stdout) or raises `Crashed`."""

    def __init__(
        self, inner: ObjectStore, audit_dir: str, limit: int, *, hang: bool = True
    ) -> None:
        self.inner, self.url = inner, inner.url
        self._audit_dir, self._limit, self._hang = audit_dir, limit, hang
        self.parts_written = 0
        self._announced = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put(self, key: str, body: bytes, **conditions: Any) -> str:
        is_part = key.startswith(self._audit_dir) and key.endswith(".parquet")
        if is_part and self.parts_written >= self._limit:
            if not self._hang:
                raise Crashed(key)
            if not self._announced:  # the first put past the limit (two streams' puts
                # can both finish at limit - 1: the count then jumps past the limit)
                self._announced = True
                print("parts-written", flush=True, file=sys.stdout)
            await asyncio.Event().wait()
        etag = await self.inner.put(key, body, **conditions)
        self.parts_written += is_part
        return etag
