"""Reads that never return fewer rows: pinned by a reader lease when long, retried
once when a file vanished (PROTOCOL §4.1 "Readers and vacuum").

Which reads take a lease (decision): `ReadGuard.mode` ``"auto"`` (the default of
`rollup.read.reader.scan` and ``lm-rollup query``) when the read plans more than
``min_files`` data files (``[rollup] reader_lease_min_files``, 32): a lease costs a PUT
and a DELETE (plus a PUT per renewal and a GET of the owner lease), noise next to that
many GETs, while a read of a few files ends in seconds, well inside the retention that
keeps a superseded snapshot's files (``[rollup] retention_s``). ``"always"``
(``lm-rollup sql``, which reads whatever the SQL touches, and ``query --lease``) and
``"never"`` (``--no-lease``) decide instead. The lease itself: `rollup.read.reader_lease`.

A file gone mid-read (`read_consistently`): the reader never returns fewer rows. It
checks which listed files are gone (HEAD), and when reading the latest snapshot
re-reads the pointer and retries once against the newer snapshot, with a warning (log,
and ``ReadGuard.notify``, which the CLI prints on stderr); a second failure, a read of
an explicit ``--version``/``--as-of`` (retrying would answer a different question), or
a current snapshot that lists a missing file raise `SnapshotFilesGone`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, TypeVar

import structlog

from protocol.clock import Clock, SystemClock
from rollup.read.reader_lease import pinned
from rollup.read.travel import load_snapshot
from rollup.table.commit import LoadedSnapshot, load_latest
from rollup.table.manifest import Snapshot
from store.base import ObjectStore
from store.errors import NotFound

log = structlog.get_logger(__name__)

T = TypeVar("T")
_HEAD_CONCURRENCY = 16


class SnapshotFilesGone(Exception):
    """Data files a snapshot lists are gone and the read cannot be completed: the
    version was vacuumed under the reader, or the dataset is damaged. Nothing partial is
    returned. ``missing`` names (some of) the files, ``version`` the snapshot."""

    def __init__(self, message: str, *, version: int, missing: Sequence[str]) -> None:
        super().__init__(message)
        self.version = version
        self.missing = list(missing)


@dataclass(frozen=True, slots=True)
class ReadGuard:
    """When a read pins its snapshot, and how (see the module doc)."""

    mode: Literal["auto", "always", "never"] = "auto"
    min_files: int = 32
    ttl_s: float = 120.0
    max_hold_s: float = 6 * 3600.0
    purpose: str = "read"
    clock: Clock = field(default_factory=SystemClock)
    notify: Callable[[str], None] | None = None
    """Called with the retry message when a vanished file makes the read start over."""

    def wants_lease(self, files: int) -> bool:
        if self.mode == "auto":
            return files > self.min_files
        return self.mode == "always"


async def missing_files(store: ObjectStore, paths: Sequence[str]) -> list[str]:
    """Those of ``paths`` that are gone (HEAD answers NotFound), looked at in groups of
    16 and stopping after the first group with any gone: enough to tell why a read failed."""
    gone: list[str] = []

    async def check(path: str) -> None:
        try:
            await store.head(path)
        except NotFound:
            gone.append(path)

    for start in range(0, len(paths), _HEAD_CONCURRENCY):
        await asyncio.gather(*(check(p) for p in paths[start : start + _HEAD_CONCURRENCY]))
        if gone:
            break
    return sorted(gone)


async def read_consistently(
    store: ObjectStore,
    *,
    version: int | None,
    as_of: datetime | None,
    files_of: Callable[[Snapshot], Sequence[str]],
    read: Callable[[LoadedSnapshot | None], Awaitable[T]],
    guard: ReadGuard,
    missing_errors: tuple[type[BaseException], ...] = (OSError, NotFound),
) -> T:
    """``read`` the snapshot asked for (latest, ``version`` or ``as_of``), pinned by a
    lease when ``guard`` wants one for ``files_of(snapshot)``; a file gone mid-read is
    handled as the module doc says. ``read`` must start afresh on each call."""
    loaded = await load_snapshot(store, version=version, as_of=as_of)
    for attempt in (1, 2):
        if loaded is None:
            return await read(None)
        files = list(files_of(loaded.snapshot))
        try:
            if guard.wants_lease(len(files)):
                async with pinned(
                    store,
                    loaded,
                    purpose=guard.purpose,
                    ttl_s=guard.ttl_s,
                    max_hold_s=guard.max_hold_s,
                    clock=guard.clock,
                ):
                    return await read(loaded)
            return await read(loaded)
        except missing_errors as exc:
            gone = await missing_files(store, files)
            if not gone:
                raise
            current = loaded.snapshot.version
            where = f"{len(gone)} data file(s) of version {current} are gone (first: {gone[0]})"
            if attempt == 2:
                raise SnapshotFilesGone(
                    f"{where}, again after a retry: vacuum keeps removing files under "
                    f"this reader; run the read again",
                    version=current,
                    missing=gone,
                ) from exc
            if version is not None or as_of is not None:
                raise SnapshotFilesGone(
                    f"{where}: vacuum removed them (the version is past the retention, "
                    f"or was not pinned yet); read a newer version",
                    version=current,
                    missing=gone,
                ) from exc
            newer = await load_latest(store)
            if newer is None or newer.manifest_key == loaded.manifest_key:
                raise SnapshotFilesGone(
                    f"{where}, and it is the current snapshot: the dataset is damaged "
                    f"(an operator must look)",
                    version=current,
                    missing=gone,
                ) from exc
            message = (
                f"{where}: vacuum removed them after version {newer.snapshot.version} "
                f"superseded it; re-read the pointer, retrying once against version "
                f"{newer.snapshot.version}"
            )
            log.warning("rollup_read_retry", version=current, retry_version=newer.snapshot.version)
            if guard.notify is not None:
                guard.notify(message)
            loaded = newer
    raise AssertionError("unreachable: the second attempt returns or raises")
