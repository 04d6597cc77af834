"""A merged catalog file is uploaded from its local file (`ObjectStore.put_file`), never as
bytes in memory (issue 22 "compaction of one hour within 1 GiB"; bench.catalog_hour)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

from chaos.faulty_store import Fault, FaultyStore
from index import catalog
from index.catalog_merge import merge_files
from index.rows import accepted_row
from protocol import keys
from protocol.clock import ManualClock
from store.base import ObjectInfo
from store.memory import MemoryStore
from tests.index.test_index_files import T0, manifest


class Uploads:
    """Forwards to a `MemoryStore`, recording how each key was written."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.writes: list[tuple[str, str]] = []

    async def get(self, key: str) -> tuple[bytes, str]:
        return await self.inner.get(key)

    async def head(self, key: str) -> ObjectInfo:
        return await self.inner.head(key)

    async def put(self, key: str, body: bytes, **conditions: Any) -> str:
        self.writes.append(("put", key))
        return await self.inner.put(key, body, **conditions)

    async def put_file(self, key: str, path: str, **conditions: Any) -> str:
        self.writes.append(("put_file", key))
        return await self.inner.put_file(key, path, **conditions)

    def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        return self.inner.list(prefix, start_after)


async def _two_files(
    store: Any, clock: ManualClock
) -> tuple[catalog.CatalogWriter, keys.UtcHour, list[ObjectInfo]]:
    writer = catalog.CatalogWriter(store=store, clock=clock, rng=random.Random(1), epoch=3)
    hour = keys.UtcHour.from_unix_ns(T0)
    await writer.write(
        hour, [accepted_row(manifest(1)), accepted_row(manifest(2))], writer="steady"
    )
    await writer.write(
        hour, [accepted_row(manifest(2)), accepted_row(manifest(3))], writer="steady"
    )
    return writer, hour, await catalog.list_hour_files(store, hour)


async def test_the_merged_file_is_uploaded_from_its_local_file() -> None:
    clock = ManualClock(T0)
    store = Uploads(MemoryStore(clock=clock))
    writer, hour, files = await _two_files(store, clock)
    store.writes.clear()

    compaction = await merge_files(store, writer, hour, files, level=1)  # type: ignore[arg-type]

    assert ("put_file", compaction.merged_key) in store.writes
    assert ("put", compaction.merged_key) not in store.writes
    merged = await catalog.read_file(store, compaction.merged_key)  # type: ignore[arg-type]
    assert sorted(row.key for row in merged) == sorted(
        accepted_row(manifest(i)).key for i in (1, 2, 3)
    )


async def test_a_lost_answer_on_the_upload_is_recognized_as_ours_from_the_file() -> None:
    """The create applied but its answer was lost; the repeat gets 412, and the body read
    back is compared with the local file's hash: the merged file is ours, under that name."""
    clock = ManualClock(T0)
    store = FaultyStore(MemoryStore(clock=clock))
    writer, hour, files = await _two_files(store, clock)
    store.script("put_if_none_match", keys.INDEX_CATALOG_PREFIX, Fault.LOST_REPLY)

    compaction = await merge_files(store, writer, hour, files, level=1)  # type: ignore[arg-type]

    assert store.injected[("put_if_none_match", Fault.LOST_REPLY)] == 1
    names = [info.key for info in await catalog.list_hour_files(store, hour)]
    assert names == sorted([*(f.key for f in files), compaction.merged_key])
    assert compaction.rows == 3
