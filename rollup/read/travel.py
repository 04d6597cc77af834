"""Time travel: which committed snapshot a read sees (``--version`` / ``--as-of``).

`load_snapshot` picks the latest snapshot, a given ``version`` (`rollup.table.commit.load_version`),
or the snapshot that was current at a time (`load_as_of`): the newest version whose
``created_at`` is at or before that time. ``created_at`` is the committing owner's clock,
whole seconds (truncated), so a time within the second of a commit includes that commit.

Cost of ``as_of`` (decision). Two ways were counted, for ``n`` retained versions of which
``k`` were committed after the time asked for:
- walking ``previous_manifest_key`` back from the pointer: ``2 + k`` GETs (the pointer,
  the latest snapshot, one snapshot per step back), each returning one snapshot manifest;
- listing ``rollup/v1/manifests/``: ``ceil(n / 1000)`` LISTs plus ``~log2(n)`` GETs for
  a binary search on ``created_at``, plus GETs to tell committed snapshots from orphans of
  failed attempts, which the listing also returns under the same version.
The walk is used. It is exact without assumptions, while the binary search is only right
if ``created_at`` grows with the version, which nothing enforces across owners (each
stamps its own clock, and ``apply`` does not check it); and the usual question ("as of an
hour ago") is a few versions back, where the walk costs a handful of GETs and the listing
alone costs more once ``n`` passes a few thousand. Reaching far back costs one GET per
version in between; `history` pays the same, and vacuum's retention bounds ``n``.
These one-shot readers (the CLI) walk afresh each time; a server answering time travel
per request keeps a `rollup.read.chain_index.ChainIndex` instead (cached links, a bounded
walk).
"""

from __future__ import annotations

from datetime import datetime

from rollup.read.chain_index import ChainIndex
from rollup.table.commit import (
    STALE_ETAG,
    LoadedSnapshot,
    VersionNotFound,
    load_latest,
    load_version,
    read_snapshot,
)
from store.base import ObjectStore


async def load_as_of(store: ObjectStore, moment: datetime) -> LoadedSnapshot:
    """The newest snapshot created at or before ``moment`` (timezone-aware).

    `VersionNotFound` when there is none: nothing was committed by then, or the
    snapshots of that time were vacuumed."""
    if moment.tzinfo is None:
        raise ValueError(f"as-of time {moment.isoformat()} has no timezone")
    latest = await load_latest(store)
    if latest is None:
        raise VersionNotFound("nothing has been committed yet")
    # A one-shot index, unbounded: the walk this module's doc counts (the as-of rule
    # lives in one place, `ChainIndex.as_of`).
    found = await ChainIndex(max_back=None).as_of(store, latest.snapshot, moment)
    snapshot = found.snapshot or await read_snapshot(store, found.link.manifest_key)
    etag = latest.pointer_etag if snapshot.version == latest.snapshot.version else STALE_ETAG
    return LoadedSnapshot(snapshot, snapshot.manifest_key, etag)


async def load_snapshot(
    store: ObjectStore, *, version: int | None = None, as_of: datetime | None = None
) -> LoadedSnapshot | None:
    """The snapshot a read should see: ``version``, else the one current ``as_of``, else
    the latest (None before the first commit). `ValueError` if both are given;
    `VersionNotFound` if the asked-for one does not exist."""
    if version is not None and as_of is not None:
        raise ValueError("give a version or an as-of time, not both")
    if version is not None:
        return await load_version(store, version)
    if as_of is not None:
        return await load_as_of(store, as_of)
    return await load_latest(store)
