"""A full audit's listing as Parquet parts: ranged, parallel, resumable (PROTOCOL §3.9).

`list_for_audit` lists this audit's ranges (`reconciler.audit.ranges`, planned once per
audit) with ``concurrency`` streams over a queue of ranges, each stream writing its
range's keys as Parquet parts (`LISTING_SCHEMA`, zstd) of at most `PART_KEYS` keys under
``<audit_dir><kind>/``, named ``<range:05d>-<part:06d>-n<rows>[-final].parquet`` so a
range's parts sort in key order. The part that ends a range carries ``-final`` (and
``final`` in its key-value metadata): that range is finished and never listed again by
this audit. A stream holds one part in memory, and writes it (``put``: a part rewritten
by a resumed run has the same content) only once the next key proves it is not the last,
so the last part written is always the final one.

Resume: a range without a final part continues after the last key of its last part
(``start_after``), numbering on from there; parts already written are kept. One listing
of ``audit_dir`` finds them all (the name carries the row count, so finished ranges need
no GET). A kind the plan's size probe listed whole (`reconciler.audit.ranges.range_count`:
a small store) has its one range's parts written by `plan_listing` from the probe's keys,
right after the plan: that range is then finished like any other.

`parts_from_inventory` writes the same parts from an S3 Inventory report instead
(``<audit_dir>inventory/<kind>/``), so the joins read either the same way.

``ListingParts.list_requests`` counts LIST requests as pages of 1000 keys (S3's page
size): one per stream or delimiter listing plus one per further 1000 keys it returned.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace

import pyarrow.parquet as pq

from reconciler.audit.inventory import InventorySource
from reconciler.audit.offload import offload
from reconciler.audit.parts import (
    BYTES_PER_KEY,
    LISTING_SCHEMA,
    Part,
    PartBuffer,
    parse_part,
    part_name,
)
from reconciler.audit.ranges import (
    KIND_PREFIXES,
    KINDS,
    RAW_KINDS,
    KeyRange,
    ListingKind,
    plan_ranges,
)
from store.base import ObjectInfo, ObjectStore, list_range

__all__ = [
    "LISTING_SCHEMA",
    "PART_KEYS",
    "ListingKind",
    "ListingParts",
    "ListingPlan",
    "RangeWork",
    "Tally",
    "list_for_audit",
    "list_one_range",
    "plan_listing",
    "parts_from_inventory",
]

PART_KEYS = 250_000
"""Keys per listing part: what one stream holds in memory (~40 MB of Python objects)."""
_PAGE_KEYS = 1000


class ListingPartError(ValueError):
    """A listing part of the audit cannot be resumed from (names it and the problem)."""


@dataclass(frozen=True)
class ListingParts:
    parts: dict[ListingKind, list[str]]
    """Store keys of this audit's Parquet listing parts, per kind, in key order."""
    keys_listed: dict[ListingKind, int]
    list_requests: int
    """LIST requests this call made (0 for ranges finished before it)."""
    ranges_total: int
    ranges_resumed: int
    """Ranges already finished before this call."""


@dataclass
class Tally:
    """What the streams listed (picklable: a Spark task returns its own)."""

    requests: int = 0
    listed: dict[ListingKind, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    parts: dict[ListingKind, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    done: int = 0

    def add(self, other: Tally) -> None:
        self.requests += other.requests
        self.done += other.done
        for kind in KINDS:
            self.listed[kind] += other.listed[kind]
            self.parts[kind] += other.parts[kind]

    def parts_of(self, plan: ListingPlan) -> ListingParts:
        return ListingParts(
            parts={kind: sorted(self.parts[kind]) for kind in KINDS},
            keys_listed=self.listed,
            list_requests=self.requests,
            ranges_total=len(plan.ranges),
            ranges_resumed=sum(1 for w in plan.work if w.finished) - plan.probed,
        )


@dataclass(frozen=True, slots=True)
class RangeWork:
    """One range of the plan and the parts already written for it (by number): what a
    stream needs to list it or resume it. Picklable (the Spark engine ships it)."""

    key_range: KeyRange
    written: tuple[Part, ...]

    @property
    def finished(self) -> bool:
        return bool(self.written) and self.written[-1].final


@dataclass(frozen=True)
class ListingPlan:
    ranges: list[KeyRange]
    """Every range of this audit (`plan_ranges`), in order."""
    requests: int
    """LIST requests the plan cost (0 when read back)."""
    work: list[RangeWork]
    """One a range, in order: finished ones and those to list."""
    probed: int = 0
    """Ranges the plan's size probe listed (finished, but not before this call)."""

    @property
    def pending(self) -> list[RangeWork]:
        return [w for w in self.work if not w.finished]


async def plan_listing(
    store: ObjectStore,
    audit_dir: str,
    *,
    concurrency: int,
    kinds: Collection[ListingKind] = KINDS,
    previous: Mapping[str, int] | None = None,
) -> ListingPlan:
    """This audit's ranges (`plan_ranges`, sized by ``previous``: the previous completed
    audit's ``keys_listed``) of ``kinds`` (an inventory audit lists only the raw objects)
    and, found by one listing of ``audit_dir``, the parts each already has."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    planned = await plan_ranges(
        store, audit_dir, concurrency=concurrency, previous=previous, kinds=kinds
    )
    for kind, found in planned.listed.items():  # the probe listed these ranges whole
        if kind in kinds:
            only = next(r for r in planned.ranges if r.kind == kind)
            await _write_listed(store, audit_dir, only, found)
    existing: dict[tuple[ListingKind, int], list[Part]] = {}
    async for info in store.list(audit_dir):
        parsed = parse_part(audit_dir, info.key)
        if parsed is not None:
            existing.setdefault((parsed[0], parsed[1].range_index), []).append(parsed[1])
    ranges = [r for r in planned.ranges if r.kind in kinds]
    work = [
        RangeWork(r, tuple(sorted(existing.get((r.kind, r.index), []), key=_number)))
        for r in ranges
    ]
    probed = sum(1 for kind in planned.listed if kind in kinds)
    return ListingPlan(ranges, planned.requests, work, probed)


async def _write_listed(
    store: ObjectStore, audit_dir: str, key_range: KeyRange, found: list[ObjectInfo]
) -> None:
    """``key_range``'s parts from its keys already listed, as `list_one_range` cuts them."""
    tally = Tally()
    for number, start in enumerate(range(0, max(1, len(found)), PART_KEYS)):
        part = PartBuffer()
        for info in found[start : start + PART_KEYS]:
            part.add(info)
        final = start + PART_KEYS >= len(found)
        await _write(store, audit_dir, key_range, number, part, final, tally)


async def list_for_audit(
    store: ObjectStore,
    audit_dir: str,
    *,
    concurrency: int,
    progress: Callable[[int, int], Awaitable[None] | None] | None = None,
    kinds: Collection[ListingKind] = KINDS,
    previous: Mapping[str, int] | None = None,
) -> ListingParts:
    """List every range of this audit not finished yet (``concurrency`` at once) into
    Parquet parts under ``audit_dir`` (`keys.audit_listing_prefix`); the parts of every
    range, finished before or now. ``progress(done, total)`` after each range (awaited
    if it returns an awaitable: the audit saves its progress there). Only the ranges of
    ``kinds`` (an inventory audit lists only the raw objects); ``previous`` sizes a new plan
    (`plan_listing`)."""
    plan = await plan_listing(
        store, audit_dir, concurrency=concurrency, kinds=kinds, previous=previous
    )
    tally = finished_tally(plan)
    total = len(plan.ranges)
    if progress is not None:
        await _maybe_await(progress(tally.done, total))
    queue: asyncio.Queue[RangeWork] = asyncio.Queue(maxsize=total + 1)
    for work in plan.pending:
        queue.put_nowait(work)

    async def stream() -> None:
        while not queue.empty():
            await list_one_range(store, audit_dir, queue.get_nowait(), tally)
            if progress is not None:
                await _maybe_await(progress(tally.done, total))

    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, queue.qsize())):
            group.create_task(stream())
    return tally.parts_of(plan)


def finished_tally(plan: ListingPlan) -> Tally:
    """A tally holding the plan's requests and its finished ranges' parts."""
    tally = Tally(requests=plan.requests)
    for work in plan.work:
        if work.finished:
            tally.done += 1
            _count(tally, work.key_range.kind, list(work.written))
    return tally


async def _maybe_await(result: Awaitable[None] | None) -> None:
    if result is not None:
        await result


def _number(part: Part) -> int:
    return part.number


def _count(tally: Tally, kind: ListingKind, parts: list[Part]) -> None:
    tally.parts[kind] += [p.key for p in parts]
    tally.listed[kind] += sum(p.rows for p in parts)


async def list_one_range(store: ObjectStore, audit_dir: str, work: RangeWork, tally: Tally) -> None:
    """List one range on from its last written part, writing parts as they fill."""
    key_range, written = work.key_range, work.written
    kind = key_range.kind
    _count(tally, kind, list(written))
    after = key_range.lower
    if written:
        after = await _last_key(store, written[-1].key)
    number = written[-1].number + 1 if written else 0
    part = PartBuffer()
    seen = 0
    listing = list_range(store, key_range.list_prefix, after, key_range.upper)
    try:
        async for info in listing:
            seen += 1
            if len(part) == PART_KEYS:  # a key follows: this part is not the last
                await _write(store, audit_dir, key_range, number, part, False, tally)
                number, part = number + 1, PartBuffer()
            part.add(info)
    finally:
        tally.requests += 1 + seen // _PAGE_KEYS
        await listing.aclose()
    await _write(store, audit_dir, key_range, number, part, True, tally)
    tally.done += 1


async def _write(
    store: ObjectStore,
    audit_dir: str,
    key_range: KeyRange,
    number: int,
    part: PartBuffer,
    final: bool,
    tally: Tally,
) -> None:
    key = audit_dir + part_name(key_range.kind, key_range.index, number, len(part), final)
    metadata = {"range": str(key_range.index), "final": "true" if final else "false"}
    body = await offload(len(part) * BYTES_PER_KEY, part.parquet, metadata)
    await store.put(key, body)
    tally.parts[key_range.kind].append(key)
    tally.listed[key_range.kind] += len(part)


async def _last_key(store: ObjectStore, part_key: str) -> str:
    body, _etag = await store.get(part_key)
    keys_column = pq.read_table(io.BytesIO(body), columns=["key"]).column("key")
    if len(keys_column) == 0:
        raise ListingPartError(f"{part_key}: a part that is not final must hold keys")
    last = keys_column[len(keys_column) - 1].as_py()
    assert isinstance(last, str)
    return last


async def parts_from_inventory(
    store: ObjectStore, audit_dir: str, source: InventorySource
) -> ListingParts:
    """The same parts from an S3 Inventory report (``source``): each row whose key lies
    under one of `KIND_PREFIXES` goes to that kind's parts; other rows are skipped. Parts
    are ``<audit_dir>inventory/<kind>/<part>...`` in the report's row order (one series
    per kind, the last one final); a run again over the same report rewrites the same
    parts. No LIST request (the report's files are read with GETs)."""
    report = await source.report()
    prefixes = tuple(KIND_PREFIXES.values())
    tally = Tally()
    buffers: dict[ListingKind, PartBuffer] = {kind: PartBuffer() for kind in KINDS}
    numbers = dict.fromkeys(KINDS, 0)
    inventory_range = {kind: KeyRange(kind, 0, KIND_PREFIXES[kind], None, None) for kind in KINDS}
    inventory_dir = f"{audit_dir}inventory/"
    for file_key in report.files:
        async for _row, obj in source.objects(file_key, prefixes):
            kind = next(_kinds_of(obj.key))
            part = buffers[kind]
            if len(part) == PART_KEYS:
                await _write(store, inventory_dir, inventory_range[kind], numbers[kind], part,
                             False, tally)  # fmt: skip
                numbers[kind] += 1
                part = buffers[kind] = PartBuffer()
            part.add_row(obj.key, obj.etag, obj.size, obj.last_modified_ns)
    for kind in KINDS:
        await _write(store, inventory_dir, inventory_range[kind], numbers[kind], buffers[kind],
                     True, tally)  # fmt: skip
    return ListingParts(
        parts={kind: tally.parts[kind] for kind in KINDS},
        keys_listed=tally.listed,
        list_requests=0,
        ranges_total=len(KINDS),
        ranges_resumed=0,
    )


def with_inventory(listed: ListingParts, report: ListingParts) -> ListingParts:
    """An inventory audit's parts: the records' from the report (`parts_from_inventory`),
    the raw objects' (frame blobs and bundles) from the listing (as they always were)."""
    return replace(
        report,
        parts={**report.parts, **{kind: listed.parts[kind] for kind in RAW_KINDS}},
        keys_listed={**report.keys_listed, **{k: listed.keys_listed[k] for k in RAW_KINDS}},
    )


def _kinds_of(key: str) -> Iterator[ListingKind]:
    return (kind for kind in KINDS if key.startswith(KIND_PREFIXES[kind]))
