"""`reconciler.gc.bounded.for_each_bounded`: at most ``limit`` at once, every item done, the
first error raised as itself and the rest cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from reconciler.gc.bounded import for_each_bounded


async def numbers(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


@pytest.mark.parametrize("source", ["list", "async"])
async def test_every_item_runs_with_at_most_limit_at_once(source: str) -> None:
    running, peak, done = 0, 0, []

    async def work(item: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        running -= 1
        done.append(item)

    items = list(range(50)) if source == "list" else numbers(50)
    await for_each_bounded(items, work, 4)
    assert sorted(done) == list(range(50)) and peak == 4


async def test_the_first_error_is_raised_as_itself_and_the_rest_are_cancelled() -> None:
    started: list[int] = []
    cancelled: list[int] = []

    async def work(item: int) -> None:
        started.append(item)
        if item == 2:
            raise KeyError("boom")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(item)
            raise

    with pytest.raises(KeyError, match="boom"):
        await for_each_bounded(range(100), work, 3)
    assert started == [0, 1, 2] and sorted(cancelled) == [0, 1]


async def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit must be >= 1"):
        await for_each_bounded([1], lambda _i: asyncio.sleep(0), 0)
