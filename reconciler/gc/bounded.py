"""`for_each_bounded`: one coroutine per item, at most ``limit`` at once (the GC's per-blob
steps: each is a few small requests, so a run over many marks is bound by latency)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import TypeVar

X = TypeVar("X")


async def for_each_bounded(
    items: Iterable[X] | AsyncIterable[X], work: Callable[[X], Awaitable[object]], limit: int
) -> None:
    """Await ``work(item)`` for every item, at most ``limit`` running at once; items are
    taken only as slots free up, so a long listing is never held whole. The first error
    cancels the rest and is raised as itself (not as an `ExceptionGroup`)."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if limit == 1:  # one at a time, inline: no task, no extra turn of the event loop
        if isinstance(items, AsyncIterable):
            async for item in items:
                await work(item)
        else:
            for item in items:
                await work(item)
        return
    slots = asyncio.Semaphore(limit)

    async def one(item: X) -> None:
        try:
            await work(item)
        finally:
            slots.release()

    try:
        async with asyncio.TaskGroup() as group:
            if isinstance(items, AsyncIterable):
                async for item in items:
                    await slots.acquire()
                    group.create_task(one(item))
            else:
                for item in items:
                    await slots.acquire()
                    group.create_task(one(item))
    except BaseExceptionGroup as errors:
        raise errors.exceptions[0] from None
