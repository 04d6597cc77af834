"""What a full audit lists up front so it need not probe key by key: `ListedKeys`.

At its start (and again when it resumes) an audit lists these prefixes, several listings
at a time (the by-sha ones split by their first hex digit), until ``audit_listed_keys_max``
keys are remembered (then every listing stops):

1. ``accepted-by-blob/v1/sha256/`` (what GC rule 5 relies on),
2. ``accepted-by-time/v1/``,
3. ``raw-blobs-by-time/v1/`` from the hour of ``now - gc.retry_horizon_s`` on (the only
   hours the audit backfills, see `reconciler.repair`),
4. ``raw-blobs/v1/sha256/`` (key and size: blob existence without a HEAD per record),
5. ``quarantine-by-blob/v1/sha256/``.

Each listed key is remembered as a 128-bit BLAKE2b digest (of the key; for raw blobs, of
the key and its size). Lookups are one-sided: `has_entry` / `has_blob` say True only for
a key (and size) that a listing returned; anything else, including keys created after the
listing and keys past the cap, is *unknown*, and the caller does what it did before there
was a snapshot: an If-None-Match create (412 is success) or a HEAD. So the snapshot
changes how many requests an audit makes, never what it concludes. Its staleness is safe
because of what is never deleted: ``accepted-by-*`` and ``quarantine-by-blob`` entries
are never deleted by anyone; ``raw-blobs-by-time`` entries are deleted only by the GC,
in hours older than the retry horizon, which the audit does not backfill; a raw blob
that the GC deletes after the listing was unreferenced when it was marked and proven
(PROTOCOL §3.5), and the steady state HEADs blobs again. A digest collision (two keys, one
digest) is the only way a key not listed could be taken for listed: with 128 bits and at
most a few million keys its probability is below 2^-80 per audit, far below that of the
SHA-256 collisions content addressing already rules out.

Memory: ~80 bytes per remembered key (Python ints in a set), bounded by the cap.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass

from protocol import keys
from store.base import ObjectStore

from .listing import closing

DIGEST_BYTES = 16


def _digest(text: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(text.encode("utf-8"), digest_size=DIGEST_BYTES).digest(), "big"
    )


def _blob_digest(key: str, size: int) -> int:
    # NUL cannot occur in an object key, so (key, size) pairs never digest alike by text.
    return _digest(f"{key}\0{size}")


@dataclass
class ListedStats:
    keys: int = 0
    prefixes_complete: int = 0
    capped_at: str | None = None
    """A prefix whose listing the cap cut short (every listing stopped then)."""


class ListedKeys:
    """Digests of keys an audit listed. Build with `ListedKeys.load`; empty when capped to 0."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._entries: set[int] = set()
        self._blobs: set[int] = set()
        self.stats = ListedStats()

    def __len__(self) -> int:
        return len(self._entries) + len(self._blobs)

    # --- lookups (True only for what a listing returned) -------------------------------

    def has_entry(self, key: str) -> bool:
        """``key`` (a derived index entry) was listed, so it exists: no create needed."""
        return bool(self._entries) and _digest(key) in self._entries

    def has_blob(self, key: str, size: int) -> bool:
        """The raw blob ``key`` was listed with exactly ``size`` bytes."""
        return bool(self._blobs) and _blob_digest(key, size) in self._blobs

    # --- building -----------------------------------------------------------------------

    @classmethod
    async def load(
        cls,
        store: ObjectStore,
        *,
        cap: int,
        raw_blobs_by_time_from: keys.UtcHour,
        parallel: int = 8,
    ) -> ListedKeys:
        """List the prefixes of the module docstring, ``parallel`` listings at a time (the
        by-sha prefixes split by their first hex digit), until ``cap`` keys are remembered.
        Store errors propagate (the caller audits without a snapshot)."""
        listed = cls(cap)
        hexdigits = "0123456789abcdef"
        plan: list[tuple[str, str | None, bool]] = [
            *((keys.ACCEPTED_BY_BLOB_PREFIX + h, None, False) for h in hexdigits),
            (keys.ACCEPTED_BY_TIME_PREFIX, None, False),
            # Keys of hour H start with "<prefix><H.partition>/", which sorts after the bare
            # "<prefix><H.partition>": starting after that includes H and every later hour.
            (
                keys.RAW_BLOBS_BY_TIME_PREFIX,
                keys.RAW_BLOBS_BY_TIME_PREFIX + raw_blobs_by_time_from.partition,
                False,
            ),
            *((keys.RAW_BLOBS_PREFIX + h, None, True) for h in hexdigits),
            *((keys.QUARANTINE_BY_BLOB_PREFIX + h, None, False) for h in hexdigits),
        ]
        # Keys under these prefixes that do not start with a hex digit are not listed: they
        # stay unknown, which costs a request, never a wrong answer.
        limit = asyncio.Semaphore(max(1, parallel))

        async def one(prefix: str, start_after: str | None, blobs: bool) -> None:
            async with limit:
                if listed.stats.capped_at is not None:
                    return
                if await listed._add_listing(store, prefix, start_after, blobs):
                    listed.stats.prefixes_complete += 1
                else:
                    listed.stats.capped_at = listed.stats.capped_at or prefix

        await asyncio.gather(*(one(*item) for item in plan))
        return listed

    async def _add_listing(
        self, store: ObjectStore, prefix: str, start_after: str | None, blobs: bool
    ) -> bool:
        """Remember every key under ``prefix``; False when the cap stopped it."""
        target = self._blobs if blobs else self._entries
        async with closing(store.list(prefix, start_after)) as listing:
            async for info in listing:
                if self.stats.keys >= self._cap or self.stats.capped_at is not None:
                    return False
                target.add(_blob_digest(info.key, info.size) if blobs else _digest(info.key))
                self.stats.keys += 1
        return True
