"""The full audit's inputs as local files for its joins (`reconciler.audit.engines.duckdb_joins`):
copies of the pinned catalog files and of the listing parts, in the audit's spill
directory (PROTOCOL §3.7, §3.9).

A catalog file that is not an index file is moved aside (``index/v1/unreadable/...``) and
reported (``unreadable-index-file``): its rows then count as missing, so the audit
catalogs its records again. A pinned file that is gone is `PinnedFileMissing`: the audit
stops incomplete (its rows would otherwise count as missing, or worse, its keys as
never cataloged), and the next run lists the catalog afresh.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from index import catalog
from index.catalog_local import write_normalized
from index.rows import IndexFileError
from protocol import keys
from reconciler.audit.listing import ListingParts
from reconciler.audit.offload import offload
from reconciler.audit.ranges import KINDS, ListingKind
from reconciler.context import ReconcilerContext
from reconciler.problems import ProblemBook
from store.base import ObjectStore
from store.errors import NotFound, StoreError


class PinnedFileMissing(RuntimeError):
    """A catalog file the audit pinned is gone: compaction broke the pin, or the store
    lost it. The audit stops incomplete (its joins would count the file's rows missing)."""


@dataclass(frozen=True, slots=True)
class CatalogCopy:
    """A local copy of one pinned catalog file; ``rank``: its place in write order."""

    name: str
    path: str
    hour: keys.UtcHour
    rank: int


async def fetch_catalog(
    store: ObjectStore, names: Sequence[str], directory: str, *, concurrency: int = 8
) -> tuple[list[CatalogCopy], list[tuple[str, str]]]:
    """Local copies of the catalog files ``names`` (each with every column: one written
    before a column existed gets it as nulls), ranked by name (epoch, then sequence; ties
    in the given order), and the names that are not index files, each with why
    (unreadable). ``concurrency`` GETs at a time (one body each in memory). Raises
    `PinnedFileMissing`."""
    os.makedirs(directory, exist_ok=True)
    parsed = sorted(
        ((keys.parse_index_catalog_key(name), name) for name in names),
        key=lambda item: (item[0][1], item[0][2]),
    )
    copies: dict[int, CatalogCopy] = {}
    unreadable: dict[int, tuple[str, str]] = {}
    slots = asyncio.Semaphore(max(1, concurrency))

    async def one(rank: int, hour: keys.UtcHour, name: str) -> None:
        async with slots:
            try:
                body, _etag = await store.get(name)
            except NotFound:
                raise PinnedFileMissing(f"pinned catalog file {name!r} is gone") from None
            path = os.path.join(directory, f"{rank:08d}.parquet")
            try:
                # A file of before the range columns stays as it is (no rewrite of the
                # whole history each audit): the joins read them as null.
                await offload(
                    len(body), write_normalized, Path(path), body, name, ranges_may_lack=True
                )
                await offload(len(body), pq.read_metadata, path)
            except (IndexFileError, pa.ArrowException, OSError) as exc:
                unreadable[rank] = (name, str(exc))
                return
            copies[rank] = CatalogCopy(name, path, hour, rank)

    window = max(1, concurrency) * 4  # tasks created at a time: bounded, not one per file
    try:
        for start in range(0, len(parsed), window):
            async with asyncio.TaskGroup() as group:
                for rank in range(start, min(len(parsed), start + window)):
                    (hour, _epoch, _sequence), name = parsed[rank]
                    group.create_task(one(rank, hour, name))
    except BaseExceptionGroup as errors:  # one error as itself (a missing file first)
        flat = list(_leaves(errors))
        raise next((e for e in flat if isinstance(e, PinnedFileMissing)), flat[0]) from None
    return [copies[r] for r in sorted(copies)], [unreadable[r] for r in sorted(unreadable)]


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(error)
        else:
            yield error


@dataclass(frozen=True)
class PinnedCatalog:
    copies: list[CatalogCopy]
    unreadable: list[tuple[str, str]]
    """Files moved aside, each with why."""


async def fetch_pinned_catalog(
    ctx: ReconcilerContext,
    problems: ProblemBook,
    names: Sequence[str],
    spill: str,
    concurrency: int,
) -> PinnedCatalog | None:
    """Copies of the catalog files ``names`` (see module); ``None`` when one is gone
    (logged). Raises `StoreError`."""
    try:
        copies, unreadable = await fetch_catalog(
            ctx.store, names, os.path.join(spill, "catalog"), concurrency=concurrency
        )
    except PinnedFileMissing as exc:
        ctx.log.error("audit_pinned_file_missing", error=str(exc))
        ctx.metrics.store_failures.labels("audit_catalog").inc()
        return None
    await set_aside(ctx, problems, unreadable)
    ctx.log.info("audit_catalog_fetched", files=len(copies), moved_aside=len(unreadable))
    return PinnedCatalog(copies, unreadable)


async def set_aside(
    ctx: ReconcilerContext, problems: ProblemBook, unreadable: Sequence[tuple[str, str]]
) -> None:
    """Record each pinned file that is not an index file (``unreadable-index-file``, with
    why) and move it aside. Raises `StoreError`."""
    for name, why in unreadable:
        await problems.record("unreadable-index-file", name, why)
        await ctx.check_fence()
        try:
            aside = await catalog.move_aside(ctx.store, name)
            ctx.log.error("catalog_file_moved_aside", key=name, to=aside)
        except StoreError as exc:
            ctx.log.warning("catalog_move_aside_failed", key=name, error=str(exc))
            raise


async def copy_parts(
    store: ObjectStore, listing: ListingParts, spill: str, concurrency: int
) -> dict[ListingKind, list[str]]:
    """Local copies of the listing's parts, per kind, ``concurrency`` GETs at a time (one
    part's body each in memory). Raises `StoreError`."""
    directory = os.path.join(spill, "listing")
    os.makedirs(directory, exist_ok=True)
    todo = [(kind, key) for kind in KINDS for key in listing.parts.get(kind, [])]
    paths = [os.path.join(directory, f"{i:08d}.parquet") for i in range(len(todo))]
    slots = asyncio.Semaphore(max(1, concurrency))

    async def one(key: str, path: str) -> None:
        async with slots:
            body, _etag = await store.get(key)
            await offload(len(body), _write, path, body)

    window = max(1, concurrency) * 4  # tasks created at a time: bounded, not one per part
    for start in range(0, len(todo), window):
        async with asyncio.TaskGroup() as group:
            for i in range(start, min(len(todo), start + window)):
                group.create_task(one(todo[i][1], paths[i]))
    out: dict[ListingKind, list[str]] = {kind: [] for kind in KINDS}
    for (kind, _key), path in zip(todo, paths, strict=True):
        out[kind].append(path)
    return out


def _write(path: str, body: bytes) -> None:
    with open(path, "wb") as file:
        file.write(body)
