"""Finding partitions (agent prefixes) without reading every key under them.

`ObjectStore.list` has no delimiter, so the partitions under a prefix are found by
reading one listing and skipping: keys are read in order and grouped by partition; once a
partition has shown more than `SKIP_AFTER_KEYS` keys the listing restarts just past
everything in it. A partition costs at most about one list page (two when it starts near
the end of one), and small partitions share pages. The keys read on the way can be handed
on (`groups` with ``keep_keys``), so a full audit lists small agent groups only once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from store.base import ObjectInfo, ObjectStore

T = TypeVar("T")

# Sorts after every character a key can continue with (S3 order is bytewise UTF-8, and
# U+10FFFF is the largest code point), so ``p + PAST`` is past every key under ``p``.
PAST = "\U0010ffff"
SKIP_AFTER_KEYS = 1000
"""`groups` skips past a group once it read this many of its keys: one S3 list page."""


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


@dataclass(frozen=True, slots=True)
class Group:
    """One partition found by `groups`."""

    prefix: str
    """``prefix + <depth segments> + "/"``, or a whole key that has fewer segments."""
    infos: list[ObjectInfo] | None
    """Every object of the group (key, ETag, ...), in key order, when the scan read all of
    them (at most ``max_keys``); ``None`` when it skipped past the rest (list the group to
    see them)."""

    @property
    def keys(self) -> list[str] | None:
        return None if self.infos is None else [info.key for info in self.infos]

    @property
    def whole_key(self) -> bool:
        return not self.prefix.endswith("/")

    @property
    def past(self) -> str:
        """A ``start_after`` that is past every key of this group and before the next."""
        return self.prefix if self.whole_key else self.prefix + PAST


def group_of(prefix: str, key: str, depth: int) -> str:
    parts = key[len(prefix) :].split("/")
    if len(parts) > depth:
        return prefix + "/".join(parts[:depth]) + "/"
    return key


async def groups(
    store: ObjectStore,
    prefix: str,
    *,
    depth: int,
    start_after: str | None = None,
    max_keys: int = SKIP_AFTER_KEYS,
    keep_keys: bool = False,
) -> AsyncIterator[Group]:
    """Each distinct ``prefix + <depth segments> + "/"`` that holds a key, in key order.

    One listing is read key by key; a group that turns out to hold more than ``max_keys``
    keys is skipped over by restarting the listing just past it, so a large group costs
    about one list page and a small one only its own keys. With ``keep_keys`` each group
    comes with its keys when the scan read them all. A key with fewer than ``depth``
    segments after ``prefix`` is a group of its own. ``start_after`` skips every key
    that sorts at or before it.
    """
    after = start_after
    while True:
        restart: str | None = None
        current: str | None = None
        held: list[ObjectInfo] = []
        count = 0
        async with closing(store.list(prefix, after)) as listing:
            async for info in listing:
                group = group_of(prefix, info.key, depth)
                if group != current:
                    if current is not None:
                        yield Group(current, held if keep_keys else None)
                    current, held, count = group, [], 0
                count += 1
                if count > max_keys:
                    restart = current
                    break
                if keep_keys:
                    held.append(info)
        if current is None:
            return
        if restart is None:
            yield Group(current, held if keep_keys else None)
            return
        skipped = Group(restart, None)
        yield skipped
        after = skipped.past
