"""What a rollup run must include: accepted batches not yet in the snapshot's ledger.

`make_plan` lists ``accepted-by-time/v1/`` (every accepted batch, by accepted hour) and
``work/v1/rollup-dirty/`` (hours the reconciler says gained batches late), then:

1. skips an hour whose entry count equals the snapshot's ledger ``batches`` for it and
   which no dirty marker names (every accepted batch of the hour is included: the ledger
   holds each batch once, and only batches that were listed here);
2. reads the ledger files of the remaining hours and subtracts their manifest_ids;
3. reads each remaining batch's accepted manifest (the authority: hash, blob key, record
   count) and returns them as `WorkItem`\\ s.

Entries and ledger rows are matched as `keys.KeyIdentity` values, so an entry key in
either agent form of PROTOCOL §3's segment rule (``agent=<hex>`` or ``agent=h-<sha256>``,
for agent_ids over 82 bytes) matches the ledger's ``manifest_id`` (always hex), and two
entries of one batch in both forms (a store written before the rule, then backfilled)
count as one batch. The manifest key of an entry whose key does not lead to it by itself
(`protocol.derived.manifest_key_of_by_time_key`) comes from the entry's body (one more
GET, for pending batches of agent_ids over 82 bytes only).

A batch's ``accepted_hour`` is the hour of its ``accepted-by-time`` entry, which is what
``verify`` recomputes the ledger's setsums from. It must equal the UTC hour of the
manifest's ``accepted_at`` (PROTOCOL §3.7): an entry under any other hour is reported as a
`SkippedBatch`, not counted, so a misfiled entry can neither put a batch in the wrong
hour nor include it twice (the reconciler files it under the right hour). Dirty markers are returned, not
deleted: the caller deletes them once the plan's work is committed (or needed none).
Counting catches late entries even without a marker, so a marker lost to a race
between the reconciler's create and our delete costs nothing.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field

import structlog
from tqdm import tqdm  # type: ignore[import-untyped]  # no stubs installed

from protocol import derived, keys
from protocol.records import AcceptedManifest, RecordError
from rollup.commit import LoadedSnapshot
from rollup.ledger import included_manifest_ids
from store.base import ObjectStore
from store.errors import NotFound

log = structlog.get_logger(__name__)

_READ_SLICE = 10_000


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One accepted batch to include (a row of `rollup.tasks.WORK_SCHEMA`)."""

    manifest_id: str
    frame_sha256: str
    raw_blob_key: str
    accepted_hour: str
    record_count: int

    def as_row(self) -> tuple[str, str, str, str, int]:
        return (
            self.manifest_id,
            self.frame_sha256,
            self.raw_blob_key,
            self.accepted_hour,
            self.record_count,
        )


@dataclass(frozen=True, slots=True)
class SkippedBatch:
    """An accepted-by-time entry whose manifest could not be used (the reconciler owns
    these: it reports and repairs manifests and indexes)."""

    manifest_key: str
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    base: LoadedSnapshot | None
    items: tuple[WorkItem, ...]
    hours_listed: int
    hours_checked: tuple[str, ...]
    dirty_markers: tuple[str, ...] = ()
    skipped: tuple[SkippedBatch, ...] = field(default_factory=tuple)

    @property
    def records(self) -> int:
        return sum(item.record_count for item in self.items)


async def make_plan(
    store: ObjectStore,
    base: LoadedSnapshot | None,
    *,
    concurrency: int = 32,
    progress: bool = False,
) -> Plan:
    """The plan against ``base`` (None: nothing included yet). Store errors propagate
    (nothing has been changed); `RollupManifestError` if a ledger file is unreadable."""
    dirty_keys, dirty_hours = await _dirty_markers(store)
    by_hour = await _accepted_by_hour(store)
    ledger_hours = base.snapshot.ledger_hours if base is not None else {}
    checked = sorted(
        hour
        for hour, entries in by_hour.items()
        if hour in dirty_hours
        or (ledger := ledger_hours.get(hour)) is None
        or ledger.batches != len(entries)
    )
    included: dict[str, set[keys.KeyIdentity]] = {}
    if base is not None and checked:
        ids = await included_manifest_ids(store, base.snapshot, set(checked))
        included = {hour: _key_identities(names) for hour, names in ids.items()}
    pending = [
        (hour, named, entry_key)
        for hour in checked
        for named, entry_key in by_hour[hour].items()
        if named not in included.get(hour, set())
    ]
    log.info(
        "rollup_plan_listed",
        hours=len(by_hour),
        hours_checked=len(checked),
        pending_batches=len(pending),
        dirty_markers=len(dirty_keys),
    )
    items, skipped = await _read_manifests(store, pending, concurrency, progress)
    return Plan(
        base=base,
        items=tuple(items),
        hours_listed=len(by_hour),
        hours_checked=tuple(checked),
        dirty_markers=tuple(dirty_keys),
        skipped=tuple(skipped),
    )


async def _dirty_markers(store: ObjectStore) -> tuple[list[str], set[str]]:
    marker_keys: list[str] = []
    hours: set[str] = set()
    async for info in store.list(keys.ROLLUP_DIRTY_PREFIX):
        partition = info.key.removeprefix(keys.ROLLUP_DIRTY_PREFIX).removesuffix(".json")
        try:
            hours.add(keys.UtcHour.parse_partition(partition).iso)
        except keys.KeyFormatError:
            log.warning("rollup_dirty_marker_ignored", key=info.key)
            continue
        marker_keys.append(info.key)
    return marker_keys, hours


def _key_identities(manifest_ids: set[str]) -> set[keys.KeyIdentity]:
    """The ledger's manifest_ids as the identities entry keys are compared with."""
    named: set[keys.KeyIdentity] = set()
    for manifest_id in manifest_ids:
        try:
            named.add(keys.parse_manifest_id(manifest_id))
        except keys.KeyFormatError:  # matches no entry: nothing to subtract
            log.warning("rollup_ledger_manifest_id_unparseable", manifest_id=manifest_id)
    return named


async def _accepted_by_hour(store: ObjectStore) -> dict[str, dict[keys.KeyIdentity, str]]:
    """Per hour: each batch's identity and one of its entry keys."""
    by_hour: dict[str, dict[keys.KeyIdentity, str]] = defaultdict(dict)
    async for info in store.list(keys.ACCEPTED_BY_TIME_PREFIX):
        try:
            hour, named = keys.parse_accepted_by_time_key(info.key)
        except keys.KeyFormatError:
            log.warning("rollup_by_time_entry_ignored", key=info.key)
            continue
        by_hour[hour.iso].setdefault(named, info.key)
    return dict(by_hour)


async def _read_manifests(
    store: ObjectStore,
    pending: list[tuple[str, keys.KeyIdentity, str]],
    concurrency: int,
    progress: bool,
) -> tuple[list[WorkItem], list[SkippedBatch]]:
    limit = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(pending), desc="reading manifests", unit="batch", disable=not progress)

    async def manifest_key(hour: str, named: keys.KeyIdentity, entry_key: str) -> str:
        direct = derived.manifest_key_of_by_time_key(keys.UtcHour.parse_iso(hour), named, entry_key)
        if direct is not None:
            return direct
        body, _ = await store.get(entry_key)  # its body names the manifest
        return derived.by_time_source(named, body)

    async def read(hour: str, named: keys.KeyIdentity, entry_key: str) -> WorkItem | SkippedBatch:
        key = entry_key
        try:
            async with limit:
                key = await manifest_key(hour, named, entry_key)
                body, _ = await store.get(key)
            manifest = AcceptedManifest.from_json(body)
        except NotFound:
            return SkippedBatch(key, "indexed in accepted-by-time, but the manifest is missing")
        except RecordError as exc:
            return SkippedBatch(key, f"unparseable: {exc}")
        finally:
            bar.update(1)
        if not keys.identity_matches_key(manifest.identity, named):
            return SkippedBatch(key, f"the manifest names batch {manifest.identity}")
        accepted_hour = keys.UtcHour.from_unix_ns(manifest.accepted_at_unix_ns).iso
        if accepted_hour != hour:
            return SkippedBatch(
                key, f"indexed under hour {hour}, but the manifest was accepted in {accepted_hour}"
            )
        return WorkItem(
            manifest_id=manifest.identity.manifest_id,
            frame_sha256=manifest.frame_sha256,
            raw_blob_key=manifest.raw_blob_key,
            accepted_hour=hour,
            record_count=manifest.record_count,
        )

    results: list[WorkItem | SkippedBatch] = []
    try:
        # In slices, so a backlog of a million batches is not a million coroutines at once.
        for start in range(0, len(pending), _READ_SLICE):
            part = pending[start : start + _READ_SLICE]
            results += await asyncio.gather(*(read(*item) for item in part))
    finally:
        bar.close()
    items = [r for r in results if isinstance(r, WorkItem)]
    skipped = [r for r in results if isinstance(r, SkippedBatch)]
    for skip in skipped:
        log.warning("rollup_batch_skipped", manifest_key=skip.manifest_key, reason=skip.reason)
    return items, skipped
