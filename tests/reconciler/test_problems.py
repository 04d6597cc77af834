"""The problem book lists the problem records once, when first needed, however many
records a pass checks at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from protocol import keys
from protocol.clock import ManualClock
from reconciler.problems import ProblemBook
from store.base import ObjectInfo
from store.errors import Unavailable
from store.memory import MemoryStore
from tests.reconciler.conftest import context


class SlowListings(MemoryStore):
    """Listings that yield to other tasks before each page, as on S3."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.listings = 0

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        if prefix == keys.RECONCILER_PROBLEMS_PREFIX:
            self.listings += 1
        await asyncio.sleep(0)
        async for info in super().list(prefix, start_after):
            yield info


async def test_concurrent_checks_list_the_problem_records_once(clock: ManualClock) -> None:
    store = SlowListings(clock)
    ctx = await context(store, clock)
    problems = ProblemBook(ctx)
    await problems.record("unparseable-manifest", "accepted/v1/a.json", "not JSON")
    assert store.listings == 0  # recording needs no listing

    subjects = [f"accepted/v1/{n}.json" for n in range(8)] + ["accepted/v1/a.json"]
    await asyncio.gather(*(problems.resolve("unparseable-manifest", s) for s in subjects))

    assert store.listings == 1
    assert [key async for key in problems.subjects("unparseable-manifest")] == []


class FailingListings(MemoryStore):
    """The problem records cannot be listed until ``healed``."""

    healed = False

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        if prefix == keys.RECONCILER_PROBLEMS_PREFIX and not self.healed:
            raise Unavailable("list", prefix, "injected")
        async for info in super().list(prefix, start_after):
            yield info

    def inner_list(self) -> AsyncIterator[ObjectInfo]:
        return super().list(keys.RECONCILER_PROBLEMS_PREFIX)


async def test_a_failed_listing_never_fails_a_check_and_is_tried_again(
    clock: ManualClock,
) -> None:
    store = FailingListings(clock=clock)
    ctx = await context(store, clock)
    await ProblemBook(ctx).record("unparseable-manifest", "accepted/v1/a.json", "not JSON")
    problems = ProblemBook(ctx)

    await problems.resolve("unparseable-manifest", "accepted/v1/a.json")  # does not raise
    assert [info.key async for info in store.inner_list()] != []  # still recorded

    store.healed = True
    await problems.resolve("unparseable-manifest", "accepted/v1/a.json")
    assert [info.key async for info in store.inner_list()] == []
