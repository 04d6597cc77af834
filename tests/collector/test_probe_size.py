"""The conditional-write probe sends the largest raw object these settings write, with
the call every raw object is written with (PROTOCOL §3.6, §3.10)."""

from __future__ import annotations

import pytest

from collector.probe import ProbeFailed, probe_for
from config import Settings
from config.ingest_settings import IngestSettings
from store.errors import StoreConfigError
from store.memory import MemoryStore


class SizedPuts(MemoryStore):
    """Records each conditional create's body size; refuses bodies over ``limit``."""

    def __init__(self, limit: int | None = None) -> None:
        super().__init__()
        self.limit = limit
        self.sizes: list[int] = []

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if if_none_match:
            self.sizes.append(len(body))
        if self.limit is not None and len(body) > self.limit:
            raise StoreConfigError(f"EntityTooLarge: {len(body)} bytes")
        return await super().put(key, body, if_none_match=if_none_match, if_match=if_match)


def small(**ingest: object) -> Settings:
    return Settings(
        ingest=IngestSettings(
            max_frame_bytes=4096, bundle_max_bytes=8192, bundle_max_frames=10, **ingest
        )
    )


async def test_the_probe_creates_the_largest_bundle_first() -> None:
    store = SizedPuts()
    await probe_for(store, small())
    assert store.sizes[0] == 8192 + 4096 + 44 * 10 + 12


async def test_without_bundles_the_probe_creates_the_largest_frame() -> None:
    store = SizedPuts()
    await probe_for(store, small(bundle=False))
    assert store.sizes[0] == 4096


async def test_a_store_refusing_that_size_in_one_put_is_refused() -> None:
    with pytest.raises(ProbeFailed, match="12740 bytes"):
        await probe_for(SizedPuts(limit=10_000), small())
