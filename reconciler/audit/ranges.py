"""The key ranges of a full audit's listing (PROTOCOL §3.9), planned once per audit.

Each listed prefix (`KIND_PREFIXES`) is cut at *bounds* ``b1 < b2 < ... < bm`` into the
ranges ``(-inf, b1], (b1, b2], ..., (bm, +inf)`` of keys under the prefix: every key lies
in exactly one of them, whatever the key is, so the ranges tile the prefix with no gap
and no overlap. A range is listed as ``list(prefix, start_after=lower)`` up to its last
key ``<= upper``, under the common prefix of its bounds where it has both
(`KeyRange.list_prefix`).

The bounds are folder names, so a folder's keys always fall in one range (never split):

- ``accepted/v1/``: the folders directly under it (``agent=<hex>/`` groups, found by one
  delimiter listing; any other folder counts as a group too);
- ``quarantine/v1/``: the agent folders under ``quarantine/v1/identity-conflict/``;
- ``raw-blobs/v1/`` and ``raw-bundles/v1/`` (PROTOCOL §3.9, §3.10): the 256
  ``sha256/<hh>/`` folders of each (fixed: no listing needed).

A key outside every group (``accepted/v1/junk``, ``raw-blobs/v1/x``, a flat key between
two agents) lies in whichever range covers its place in key order, so it is listed and
the joins report it as not well-formed. Neighbouring groups are merged into ranges by
count of groups (their sizes are not known before listing them): 10k small agents make
at most the cap of ranges, not 10k part series. One agent holding most of a store's keys
is still one range (no sub-ranges yet).

How many ranges a kind gets follows what the store holds (`range_count`): about one per
`KEYS_PER_RANGE` keys the previous completed audit listed there (its record's
``keys_listed``, carried in this audit's cursors: `PREVIOUS_KEYS_CURSOR`), at most
``RANGES_PER_STREAM`` x concurrency. A kind the previous audit found small, or that no
audit listed yet, is probed: its prefix listed up to one range's worth. All of it → one
range, and the probe's keys are that range's listing (written as its parts by
`reconciler.audit.listing`, never listed again); more → the cap. A small store's audit
then costs a few LISTs and one part per kind, not ~64 ranges' LIST and part each; a
kind with only one range needs no delimiter listing of its groups either.

The plan is written once per audit (``<audit_dir>plan.json``, create-if-absent) and read
back by a resumed audit, so the ranges, and the names of their parts, never change within
an audit whatever its concurrency or the store's folders meanwhile.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from protocol import keys
from store.base import ObjectInfo, ObjectStore, list_range
from store.errors import NotFound, PreconditionFailed

ListingKind = Literal["accepted", "quarantine", "raw-blobs", "raw-bundles"]
KINDS: tuple[ListingKind, ...] = get_args(ListingKind)
RAW_KINDS: tuple[ListingKind, ...] = ("raw-blobs", "raw-bundles")
"""The raw objects' kinds: what an audit from an S3 Inventory report still lists."""
KIND_PREFIXES: dict[ListingKind, str] = {
    "accepted": keys.ACCEPTED_PREFIX,
    "quarantine": "quarantine/v1/",
    "raw-blobs": "raw-blobs/v1/",
    "raw-bundles": "raw-bundles/v1/",
}
"""What a full audit lists: the whole version folder of each, not only its well-formed
part (`keys.QUARANTINE_PREFIX`, `keys.RAW_BLOBS_PREFIX`, `keys.RAW_BUNDLES_PREFIX`), so
stray keys are reported."""
_GROUP_PARENTS: dict[ListingKind, str] = {
    "accepted": keys.ACCEPTED_PREFIX,
    "quarantine": keys.QUARANTINE_PREFIX,
}
RANGES_PER_STREAM = 4
"""The cap on a kind's ranges is this many per listing stream: a stream that ends early
takes another, so the streams finish about together."""
KEYS_PER_RANGE = 50_000
"""About how many keys one range holds when a kind is cut by its previous count: 50 LIST
pages. A range's fixed cost (a LIST for its last, partial page, one listing-part PUT, a
progress save) is then at most ~5% of its LISTs; one stream lists it in a few seconds
(10-50 pages a second), so a resume from its start loses little; and a kind of
16 streams x 4 x 50k = 3.2M keys already gets the cap. Smaller ranges buy no
parallelism a small store needs and cost two requests each; larger ones leave streams
idle below a few million keys."""
PREVIOUS_KEYS_CURSOR = "plan:previous-keys-listed"
"""`AuditRecord.cursors` entry of a new audit: the ``keys_listed`` of the completed audit
before it (JSON), what its plan is sized by (`resume_or_start` reads that audit anyway).
In the record, so a run resumed before the plan was written sizes it alike."""
PLAN_NAME = "plan.json"
_PLAN_VERSION = 1


class ListingPlanError(ValueError):
    """A stored listing plan is malformed (names the field and the problem)."""


@dataclass(frozen=True, slots=True)
class KeyRange:
    """Keys ``k`` under ``prefix`` with ``lower < k <= upper`` (``None``: unbounded)."""

    kind: ListingKind
    index: int
    """Position within its kind (ranges of a kind are in key order)."""
    prefix: str
    lower: str | None
    upper: str | None

    @property
    def list_prefix(self) -> str:
        """The longest prefix every key of the range starts with: a key between two
        strings starts with their common prefix, so a bounded range is listed under it
        (fewer keys for the server to skip, none past it read ahead)."""
        if self.lower is None or self.upper is None:
            return self.prefix
        common = _common_prefix(self.lower, self.upper)
        return common if common.startswith(self.prefix) else self.prefix

    def contains(self, key: str) -> bool:
        # str order is code point order, which is the UTF-8 byte order S3 lists in.
        return (
            key.startswith(self.prefix)
            and (self.lower is None or key > self.lower)
            and (self.upper is None or key <= self.upper)
        )


def _common_prefix(a: str, b: str) -> str:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return a[:length]


def raw_blob_groups(prefix: str = keys.RAW_BLOBS_PREFIX) -> list[str]:
    """The 256 ``sha256/<hh>/`` folders under a raw object prefix."""
    return [f"{prefix}{i:02x}/" for i in range(256)]


async def groups_of(store: ObjectStore, kind: ListingKind) -> tuple[list[str], int]:
    """The folders whose keys a range never splits, in key order, and the delimiter
    listings that cost (pages of 1000 folders)."""
    if kind == "raw-blobs":
        return raw_blob_groups(), 0
    if kind == "raw-bundles":
        return raw_blob_groups(keys.RAW_BUNDLES_PREFIX), 0
    found = [folder async for folder in store.common_prefixes(_GROUP_PARENTS[kind])]
    return found, 1 + len(found) // 1000


def ranges_from_groups(kind: ListingKind, groups: list[str], count: int) -> list[KeyRange]:
    """``count`` (at most; at least 1) ranges tiling ``kind``'s prefix, each starting at a
    group's folder name: groups are merged in runs of about equal number."""
    prefix = KIND_PREFIXES[kind]
    ordered = sorted(set(groups))
    runs = max(1, min(count, len(ordered)))
    # Run j starts at group ordered[j * len // runs]; the first run also takes all keys
    # before its first group, the last all keys after its last one.
    starts = [ordered[j * len(ordered) // runs] for j in range(1, runs)]
    bounds: list[str | None] = [None, *starts, None]
    return [KeyRange(kind, i, prefix, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


@dataclass(frozen=True)
class PlannedRanges:
    ranges: list[KeyRange]
    """Every range of this audit (every kind, in key order)."""
    requests: int
    """LIST requests the planning cost (0 when read back)."""
    listed: dict[ListingKind, list[ObjectInfo]] = field(default_factory=dict)
    """The kinds whose one range the size probe listed whole, with their keys in key
    order: to be written as that range's parts (only when this call wrote the plan)."""


async def plan_ranges(
    store: ObjectStore,
    audit_dir: str,
    *,
    concurrency: int,
    previous: Mapping[str, int] | None = None,
    kinds: Collection[ListingKind] = KINDS,
) -> PlannedRanges:
    """This audit's ranges, read from ``<audit_dir>plan.json`` when an earlier run of the
    audit wrote it, else planned and created there (a racing creator's plan wins and is
    read back). ``previous``: the previous completed audit's ``keys_listed`` (sizes the
    ranges, `range_count`); only ``kinds`` are probed (the others are not listed)."""
    key = audit_dir + PLAN_NAME
    try:
        body, _etag = await store.get(key)
        return PlannedRanges(parse_plan(key, body), 0)
    except NotFound:
        pass
    ranges: list[KeyRange] = []
    listed: dict[ListingKind, list[ObjectInfo]] = {}
    sized_by: dict[str, str] = {}
    requests = 0
    for kind in KINDS:
        count, probed, spent, sized_by[kind] = await range_count(
            store, kind, (previous or {}).get(kind), RANGES_PER_STREAM * concurrency,
            probe=kind in kinds,
        )  # fmt: skip
        requests += spent
        if probed is not None:
            listed[kind] = probed
        groups: list[str] = []
        if count > 1:
            groups, spent = await groups_of(store, kind)
            requests += spent
        ranges += ranges_from_groups(kind, groups, count)
    try:
        await store.put(key, plan_json(ranges, sized_by), if_none_match=True)
    except PreconditionFailed:
        body, _etag = await store.get(key)
        return PlannedRanges(parse_plan(key, body), requests)
    return PlannedRanges(ranges, requests, listed)


async def range_count(
    store: ObjectStore, kind: ListingKind, previous: int | None, cap: int, *, probe: bool
) -> tuple[int, list[ObjectInfo] | None, int, str]:
    """How many ranges ``kind`` is cut into (1 to ``cap``): ``ceil(previous /
    KEYS_PER_RANGE)`` when the previous audit listed more than one range's worth there;
    else the probe lists the prefix up to one range's worth: all of it → 1 (and its
    keys), more → ``cap`` (the store outgrew the previous count, or none is known; the
    probe's pages are then spent for nothing, at most 51 LISTs against a listing at least
    that long). Without ``probe`` (a kind this audit does not list, an inventory audit's
    records): 1, no request.
    Returns (count, the probe's keys when they are the whole kind, LIST requests, how
    the count was found)."""
    if not probe:
        return 1, None, 0, "not listed"
    if previous is not None and previous > KEYS_PER_RANGE:
        count = min(cap, -(-previous // KEYS_PER_RANGE))
        return max(1, count), None, 0, f"previous audit: {previous} keys"
    found: list[ObjectInfo] = []
    listing = list_range(store, KIND_PREFIXES[kind], None, None)
    try:
        async for info in listing:
            found.append(info)
            if len(found) > KEYS_PER_RANGE:
                break
    finally:
        await listing.aclose()  # no page read ahead is left running
    requests = 1 + len(found) // 1000
    if len(found) > KEYS_PER_RANGE:
        return max(1, cap), None, requests, f"probe: over {KEYS_PER_RANGE} keys"
    return 1, found, requests, f"probe: {len(found)} keys"


def previous_keys_cursor(keys_listed: Mapping[str, int]) -> str:
    """The `PREVIOUS_KEYS_CURSOR` value of a completed audit's ``keys_listed``."""
    return json.dumps(dict(sorted(keys_listed.items())))


def previous_keys(cursors: Mapping[str, str]) -> dict[str, int] | None:
    """The previous audit's ``keys_listed`` from an audit's cursors (`None` when absent
    or malformed: the plan then probes, it never fails over a size)."""
    try:
        found = json.loads(cursors[PREVIOUS_KEYS_CURSOR])
    except (KeyError, ValueError):
        return None
    if not isinstance(found, dict):
        return None
    return {k: v for k, v in found.items() if type(v) is int and v >= 0}


def plan_json(ranges: list[KeyRange], sized_by: Mapping[str, str] | None = None) -> bytes:
    """The stored plan; ``sized_by`` (per kind, how its number of ranges was found) is
    for people reading it, never read back."""
    doc: dict[str, object] = {
        "version": _PLAN_VERSION,
        **({"sized_by": dict(sized_by)} if sized_by else {}),
        "ranges": [
            {"kind": r.kind, "prefix": r.prefix, "lower": r.lower, "upper": r.upper} for r in ranges
        ],
    }
    return json.dumps(doc, indent=1).encode("utf-8")


def parse_plan(key: str, body: bytes) -> list[KeyRange]:
    """The ranges of a stored plan, checked to tile each kind's prefix with no gap."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ListingPlanError(f"{key}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != _PLAN_VERSION:
        raise ListingPlanError(f"{key}: version must be {_PLAN_VERSION}")
    entries = doc.get("ranges")
    if not isinstance(entries, list):
        raise ListingPlanError(f"{key}: ranges must be a list")
    ranges: list[KeyRange] = []
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict) or entry.get("kind") not in KINDS:
            raise ListingPlanError(f"{key}: ranges[{n}].kind must be one of {KINDS}")
        kind: ListingKind = entry["kind"]
        bounds = [entry.get("lower"), entry.get("upper")]
        if entry.get("prefix") != KIND_PREFIXES[kind]:
            raise ListingPlanError(f"{key}: ranges[{n}].prefix must be {KIND_PREFIXES[kind]!r}")
        if any(b is not None and not isinstance(b, str) for b in bounds):
            raise ListingPlanError(f"{key}: ranges[{n}] bounds must be strings or null")
        index = sum(1 for r in ranges if r.kind == kind)
        ranges.append(KeyRange(kind, index, KIND_PREFIXES[kind], bounds[0], bounds[1]))
    for kind in KINDS:
        if not any(r.kind == kind for r in ranges):
            # A plan written before this kind was listed (``raw-bundles``, PROTOCOL §3.10)
            # by an audit now resumed: the kind is one unbounded range.
            ranges.append(KeyRange(kind, 0, KIND_PREFIXES[kind], None, None))
        _check_tiling(key, [r for r in ranges if r.kind == kind], kind)
    return ranges


def _check_tiling(key: str, ranges: list[KeyRange], kind: ListingKind) -> None:
    if not ranges or ranges[0].lower is not None or ranges[-1].upper is not None:
        raise ListingPlanError(f"{key}: the {kind} ranges must start and end unbounded")
    for before, after in itertools.pairwise(ranges):
        if before.upper is None or before.upper != after.lower:
            raise ListingPlanError(f"{key}: {kind} range {after.index} must start at the end "
                                   f"of range {before.index}")  # fmt: skip
        if after.upper is not None and after.upper <= after.lower:
            raise ListingPlanError(f"{key}: {kind} range {after.index} is empty or reversed")
