"""Finding partitions (hours, agent prefixes) without reading every key under them.

`ObjectStore.list` has no delimiter, so the partitions under a prefix are found by
skipping: list from a position, take the first key, derive its partition, then restart
the listing just past everything in that partition. That costs one list request per
partition found, whatever the partition holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

from protocol import keys
from store.base import ObjectStore

T = TypeVar("T")

# Sorts after every character a key can continue with (S3 order is bytewise UTF-8, and
# U+10FFFF is the largest code point), so ``p + PAST`` is past every key under ``p``.
PAST = "\U0010ffff"


@asynccontextmanager
async def closing(iterator: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """Close an async iterator (a store listing) even when the loop over it stops early, so
    its connection or open directory is released now rather than by garbage collection."""
    try:
        yield iterator
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()


async def first_key(store: ObjectStore, prefix: str, start_after: str | None = None) -> str | None:
    """The first key under ``prefix`` after ``start_after``, or ``None``."""
    async with closing(store.list(prefix, start_after)) as listing:
        async for info in listing:
            return info.key
    return None


async def partitions(
    store: ObjectStore, prefix: str, *, depth: int, start_after: str | None = None
) -> AsyncIterator[str]:
    """Each distinct ``prefix + <depth segments> + "/"`` that holds a key, in order.

    A key with fewer than ``depth`` segments after ``prefix`` is yielded whole (it is its
    own group). ``start_after`` skips every group that sorts at or before it.
    """
    after = start_after
    while True:
        key = await first_key(store, prefix, after)
        if key is None:
            return
        parts = key[len(prefix) :].split("/")
        if len(parts) > depth:
            group = prefix + "/".join(parts[:depth]) + "/"
            after = group + PAST
        else:
            group = key
            after = key
        yield group


async def hours_with_entries(
    store: ObjectStore,
    prefix: str,
    *,
    first: keys.UtcHour | None = None,
    last: keys.UtcHour | None = None,
) -> AsyncIterator[keys.UtcHour]:
    """Hours ``first..last`` (inclusive, either open) under a by-time ``prefix`` such as
    ``accepted-by-time/v1/`` that hold at least one key, ascending. Keys that are not in
    a ``date=YYYY-MM-DD/hour=HH/`` partition are skipped."""
    # Keys of hour H all start with "<prefix><H.partition>/", which sorts after the bare
    # "<prefix><H.partition>": starting after that includes H itself.
    start_after = prefix + first.partition if first is not None else None
    async for group in partitions(store, prefix, depth=2, start_after=start_after):
        try:
            hour = keys.UtcHour.parse_partition(group[len(prefix) :].rstrip("/"))
        except keys.KeyFormatError:
            continue
        if last is not None and hour > last:
            return
        yield hour


async def newest_hour(
    store: ObjectStore,
    prefix: str,
    *,
    first: keys.UtcHour | None = None,
    last: keys.UtcHour | None = None,
) -> keys.UtcHour | None:
    """The newest hour in ``first..last`` holding a key under ``prefix``, or ``None``."""
    newest: keys.UtcHour | None = None
    async for hour in hours_with_entries(store, prefix, first=first, last=last):
        newest = hour
    return newest
