"""Which snapshot a version or a time names, found by a cached and bounded walk.

Time travel (`rollup.read.travel`) walks ``previous_manifest_key`` back from the latest
snapshot: one GET and one parse of a whole manifest per version stepped over. A server
answering ``version=``/``as_of=`` per request (`collector.query.committed`) must neither
pay that on every request nor let one request walk an unbounded chain. `ChainIndex`
keeps what its walks learned:

- a `Link` per version: the manifest key, ``created_at`` and the previous manifest's key
  (a few hundred bytes; the manifest itself is not kept). A committed snapshot never
  changes and the pointer moves only forward by compare-and-swap, so a version's link
  holds for every later latest. An LRU of ``max_links`` links (default ``max_back + 1``,
  so one walk never evicts its own links) keeps them;
- the floor: the oldest version the chain reaches (its previous manifest is gone, or it
  is version 1). Vacuum only deletes, so a version below the floor is answered
  `VersionNotFound` without a request.

Bound: a lookup steps back at most ``max_back`` versions from the latest, cached steps
or not (a ``version`` further back is refused before any step), so whether a request is
refused never depends on what the cache holds: `TravelTooFar`. ``max_back=None`` (the
one-shot CLI readers) walks as far as the chain goes.

Semantics are `rollup.read.travel`'s: ``as_of`` is the newest version, walking back from the
latest, whose ``created_at`` is at or before the time. One deliberate difference: a
version whose link is cached is found directly, so it is still answered after vacuum cut
the chain above it (a reader lease or published Iceberg metadata kept it), as long as
its manifest is stored.

Staleness: vacuum may delete manifests the index still links to. A link is only a key:
the caller reads the snapshot at it and, on `NotFound`, calls `forget_through` and asks
again (the walk then GETs where the chain ends now). If the chain was ever replaced (the
latest is below a cached version, or a cached link disagrees with the manifest naming
it), everything is forgotten. Callers serialize lookups with ``lock`` so that concurrent
requests share one walk instead of each doing their own.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from datetime import datetime

from rollup.table.commit import VersionNotFound, read_snapshot
from rollup.table.manifest import RollupManifestError, Snapshot, parse_created_at
from store.base import ObjectStore
from store.errors import NotFound


class TravelTooFar(LookupError):
    """The snapshot asked for is more than ``limit`` versions behind the latest."""

    def __init__(self, detail: str, *, limit: int) -> None:
        super().__init__(detail)
        self.limit = limit


class _Bounded(Exception):
    def __init__(self, link: Link) -> None:
        self.link = link


@dataclass(frozen=True, slots=True)
class Link:
    version: int
    manifest_key: str
    created_at: datetime
    previous_key: str | None

    @classmethod
    def of(cls, snapshot: Snapshot) -> Link:
        return cls(
            snapshot.version,
            snapshot.manifest_key,
            parse_created_at(snapshot.created_at),
            snapshot.previous_manifest_key,
        )


@dataclass(frozen=True, slots=True)
class Found:
    """The version's link, and its snapshot when the lookup read it anyway."""

    link: Link
    snapshot: Snapshot | None


def _created(link: Link) -> str:
    return link.created_at.strftime("%Y-%m-%dT%H:%M:%SZ")


class ChainIndex:
    def __init__(self, *, max_back: int | None, max_links: int | None = None) -> None:
        if max_links is None and max_back is not None:
            max_links = max_back + 1
        self.max_back = max_back
        self.max_links = max_links
        self.lock = asyncio.Lock()
        self._links: OrderedDict[int, Link] = OrderedDict()
        self._top = 0
        self._floor: Link | None = None

    def __len__(self) -> int:
        return len(self._links)

    @property
    def floor(self) -> int | None:
        """The oldest version the chain reached when last walked to its end."""
        return self._floor.version if self._floor is not None else None

    def forget(self) -> None:
        self._links.clear()
        self._top = 0
        self._floor = None

    def forget_through(self, version: int) -> None:
        """Version ``version``'s manifest is gone (vacuum): drop it and every older link."""
        for old in [v for v in self._links if v <= version]:
            del self._links[old]
        if self._floor is not None and self._floor.version <= version:
            self._floor = None

    async def version(self, store: ObjectStore, latest: Snapshot, version: int) -> Found:
        """Version ``version``. `VersionNotFound` when newer than ``latest``, below 1,
        or vacuumed; `TravelTooFar` when more than ``max_back`` versions back."""
        if not 1 <= version <= latest.version:
            raise VersionNotFound(f"version {version} does not exist (latest is {latest.version})")
        back = latest.version - version
        if self.max_back is not None and back > self.max_back:
            raise TravelTooFar(
                f"version {version} is {back} versions behind the latest ({latest.version}); "
                f"time travel reaches back at most {self.max_back}",
                limit=self.max_back,
            )
        self._check_latest(latest)
        if self._floor is not None and version < self._floor.version:
            raise VersionNotFound(self._vacuumed(version, self._floor))
        cached = self._links.get(version)
        if cached is not None:
            self._links.move_to_end(version)
            return Found(cached, latest if version == latest.version else None)
        oldest = None
        async with aclosing(self._walk(store, latest)) as walk:
            async for link, snapshot in walk:
                if link.version == version:
                    return Found(link, snapshot)
                oldest = link
        assert oldest is not None  # the walk yields the latest at least
        raise VersionNotFound(self._vacuumed(version, oldest))

    async def as_of(self, store: ObjectStore, latest: Snapshot, moment: datetime) -> Found:
        """The newest version created at or before ``moment`` (timezone-aware).
        `VersionNotFound` when the chain ends first; `TravelTooFar` when it is not found
        within ``max_back`` versions of the latest."""
        if moment.tzinfo is None:
            raise ValueError(f"as-of time {moment.isoformat()} has no timezone")
        self._check_latest(latest)
        oldest = None
        try:
            async with aclosing(self._walk(store, latest)) as walk:
                async for link, snapshot in walk:
                    if link.created_at <= moment:
                        return Found(link, snapshot)
                    oldest = link
        except _Bounded as bounded:
            assert self.max_back is not None
            raise TravelTooFar(
                f"no snapshot created at or before {moment.isoformat()} within "
                f"{self.max_back} versions of the latest ({latest.version}); the oldest "
                f"looked at is version {bounded.link.version}, committed "
                f"{_created(bounded.link)}",
                limit=self.max_back,
            ) from None
        assert oldest is not None
        when = "committed" if oldest.version == 1 else "kept"
        raise VersionNotFound(
            f"no snapshot was committed at or before {moment.isoformat()}: the oldest "
            f"{when} is version {oldest.version}, committed {_created(oldest)}"
        )

    @staticmethod
    def _vacuumed(version: int, oldest: Link) -> str:
        return f"version {version} was vacuumed (oldest kept is {oldest.version})"

    def _is_floor(self, link: Link) -> bool:
        return self._floor is not None and self._floor.manifest_key == link.manifest_key

    def _check_latest(self, latest: Snapshot) -> None:
        same = self._links.get(latest.version)
        if latest.version < self._top or (
            same is not None and same.manifest_key != latest.manifest_key
        ):
            self.forget()  # another chain than the one cached: start over

    def _keep(self, link: Link) -> Link:
        self._links[link.version] = link
        self._links.move_to_end(link.version)
        self._top = max(self._top, link.version)
        while self.max_links is not None and len(self._links) > self.max_links:
            self._links.popitem(last=False)
        return link

    async def _walk(
        self, store: ObjectStore, latest: Snapshot
    ) -> AsyncGenerator[tuple[Link, Snapshot | None]]:
        """Links from the latest back; ends where the chain ends (recording the floor);
        `_Bounded` instead of a step past ``max_back``."""
        link: Link = self._keep(Link.of(latest))
        snapshot: Snapshot | None = latest
        steps = 0
        while True:
            yield link, snapshot
            if self.max_back is not None and steps >= self.max_back:
                if link.previous_key is None or self._is_floor(link):
                    return  # the chain ends here anyway
                raise _Bounded(link)
            older = await self._older(store, link)
            if older is None:
                return
            link, snapshot = older
            steps += 1

    async def _older(self, store: ObjectStore, link: Link) -> tuple[Link, Snapshot | None] | None:
        if link.previous_key is None:
            self._floor = link
            return None
        if self._is_floor(link):
            return None  # the chain ended here before; vacuum never brings a version back
        cached = self._links.get(link.version - 1)
        if cached is not None:
            if cached.manifest_key == link.previous_key:
                self._links.move_to_end(cached.version)
                return cached, None
            self.forget()
            self._keep(link)
        try:
            older = await read_snapshot(store, link.previous_key)
        except NotFound:
            self._floor = link
            return None
        if older.version != link.version - 1:
            raise RollupManifestError(
                f"version {link.version} links to {link.previous_key!r}, version {older.version}"
            )
        return self._keep(Link.of(older)), older
