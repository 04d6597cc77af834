"""How many ranges a full audit's listing is cut into (PROTOCOL §3.9, issue 31): by what
the store holds, not ~64 a prefix whatever its size. A small store's audit lists each
prefix once (the size probe is the listing); a prefix the previous audit found big gets
about one range per `KEYS_PER_RANGE` keys, at most the cap; a resumed audit keeps its
plan whatever the counts say now."""

from __future__ import annotations

import json

import pytest

from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit import ranges as audit_ranges
from reconciler.audit.listing import list_for_audit, plan_listing
from reconciler.audit.ranges import (
    KIND_PREFIXES,
    KINDS,
    PLAN_NAME,
    PREVIOUS_KEYS_CURSOR,
    RANGES_PER_STREAM,
    ListingKind,
    parse_plan,
    plan_ranges,
    previous_keys,
)
from reconciler.audit.run import run_full_audit
from store.counting import CountingStore
from store.memory import MemoryStore
from tests.reconciler.conftest import context, make_settings, write_batches
from tests.reconciler.counting_list_store import Crashed, HangAfterParts, ListRecorder
from tests.reconciler.test_audit_listing import (
    AUDIT_DIR,
    expected_rows,
    put_all,
    read_parts,
    world,
)

KPR = audit_ranges.KEYS_PER_RANGE


def kind_lists(store: CountingStore) -> list[str]:
    """The LIST requests (pages too) of the listed prefixes: the audit's listing (not the
    blob verifiers' walks of `keys.RAW_BLOBS_PREFIX` and `keys.RAW_BUNDLES_PREFIX`)."""
    prefixes = tuple(KIND_PREFIXES.values())
    walks = (keys.RAW_BLOBS_PREFIX, keys.RAW_BUNDLES_PREFIX)
    return [key for key in store.keys_of("list") if key.startswith(prefixes) and key not in walks]


async def test_a_small_stores_audit_lists_each_prefix_once(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=12, per_agent=5)
    store = CountingStore(memory_store)
    # 16 listing streams: the cap is 64 ranges a prefix (the 256 raw-blob folders and
    # the 12 agents made 64 + 12 + 1 ranges before sizing).
    settings = make_settings(concurrency=32, audit_list_concurrency=16)
    ctx = await context(store, clock, settings=settings)

    first = await run_full_audit(ctx)

    assert first.status == "completed" and first.keys_listed["accepted"] == len(batches)
    assert sorted(kind_lists(store)) == sorted(KIND_PREFIXES.values())  # one LIST each
    audit_dir = keys.audit_listing_prefix(first.started_at_unix_ns, first.audit_id)
    written = store.keys_of("put", audit_dir)
    assert sorted(k.removeprefix(audit_dir) for k in written) == sorted(
        [PLAN_NAME, "accepted/00000-000000-n60-final.parquet",
         "quarantine/00000-000000-n0-final.parquet",
         f"raw-blobs/00000-000000-n{first.keys_listed['raw-blobs']}-final.parquet",
         "raw-bundles/00000-000000-n0-final.parquet"]
    )  # fmt: skip
    assert first.requests["LIST"] == 1 + 4  # the catalog's listing, then one a prefix

    # The next audit is sized by this one's counts (small: probed, one range each).
    clock.advance(60)
    store.clear()
    second = await run_full_audit(ctx)
    assert second.status == "completed" and second.audit_id != first.audit_id
    assert sorted(kind_lists(store)) == sorted(KIND_PREFIXES.values())
    assert second.keys_listed == first.keys_listed


async def test_the_previous_audits_counts_size_the_next_plan(
    memory_store: MemoryStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counts travel in the new audit's record (`PREVIOUS_KEYS_CURSOR`) to its plan."""
    monkeypatch.setattr(audit_ranges, "KEYS_PER_RANGE", 7)  # 40 manifests: 6 ranges
    await write_batches(memory_store, agents=8, per_agent=5)
    ctx = await context(memory_store, clock, settings=make_settings(concurrency=32))
    first = await run_full_audit(ctx)
    assert first.status == "completed"
    clock.advance(60)

    second = await run_full_audit(ctx)

    audit_dir = keys.audit_listing_prefix(second.started_at_unix_ns, second.audit_id)
    body, _etag = await memory_store.get(audit_dir + PLAN_NAME)
    plan = parse_plan(PLAN_NAME, body)
    counts = {kind: sum(1 for r in plan if r.kind == kind) for kind in KINDS}
    assert counts["accepted"] == -(-first.keys_listed["accepted"] // 7) == 6
    assert counts["raw-blobs"] == -(-first.keys_listed["raw-blobs"] // 7)
    assert counts["quarantine"] == 1  # none: probed, one range
    assert json.loads(body)["sized_by"]["accepted"] == "previous audit: 40 keys"
    assert second.keys_listed == first.keys_listed  # the same keys, cut otherwise


def test_previous_keys_are_read_from_the_cursors_and_never_fail_an_audit() -> None:
    assert previous_keys({PREVIOUS_KEYS_CURSOR: '{"accepted": 5, "x": -1, "y": "z"}'}) == {
        "accepted": 5
    }
    assert previous_keys({}) is None
    assert previous_keys({PREVIOUS_KEYS_CURSOR: "not json"}) is None
    assert previous_keys({PREVIOUS_KEYS_CURSOR: "[1]"}) is None


async def test_ranges_grow_with_the_previous_count_up_to_the_cap() -> None:
    store = MemoryStore()
    await put_all(store, world(agents=40, per_agent=2, blobs=20))
    cap = RANGES_PER_STREAM * 16
    previous = {"accepted": 10 * KPR + 1, "raw-blobs": 10**9, "quarantine": KPR}
    recorder = ListRecorder(store)

    planned = await plan_ranges(recorder, AUDIT_DIR, concurrency=16, previous=previous)

    counts = {kind: sum(1 for r in planned.ranges if r.kind == kind) for kind in KINDS}
    assert counts == {"accepted": 11, "quarantine": 1, "raw-blobs": cap, "raw-bundles": 1}
    # Only the small prefixes are probed (and listed whole by it); folders of the big ones.
    assert recorder.lists == [
        (KIND_PREFIXES["quarantine"], None),
        (KIND_PREFIXES["raw-bundles"], None),
    ]
    assert recorder.folder_lists == [keys.ACCEPTED_PREFIX]
    assert set(planned.listed) == {"quarantine", "raw-bundles"}
    # Fewer folders than ranges wanted: one range a folder (never an empty split).
    folders = [f async for f in store.common_prefixes(keys.ACCEPTED_PREFIX)]
    few = await plan_ranges(store, AUDIT_DIR + "few/", concurrency=16,
                            previous={"accepted": 10**9})  # fmt: skip
    assert 40 < len(folders) < cap
    assert sum(1 for r in few.ranges if r.kind == "accepted") == len(folders)
    # An inventory audit lists only the raw blobs: the records' prefixes cost nothing.
    recorder = ListRecorder(store)
    only: tuple[ListingKind, ...] = ("raw-blobs",)
    raw_only = await plan_ranges(recorder, AUDIT_DIR + "inventory/", concurrency=16,
                                 previous=previous, kinds=only)  # fmt: skip
    counts = {kind: sum(1 for r in raw_only.ranges if r.kind == kind) for kind in KINDS}
    assert counts == {"accepted": 1, "quarantine": 1, "raw-blobs": cap, "raw-bundles": 1}
    assert (recorder.lists, recorder.folder_lists, raw_only.requests) == ([], [], 0)


async def test_a_store_grown_past_its_previous_count_gets_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(audit_ranges, "KEYS_PER_RANGE", 50)
    store = MemoryStore()
    await put_all(store, world(agents=40, per_agent=2, blobs=600))
    recorder = ListRecorder(store)

    listing = await list_for_audit(recorder, AUDIT_DIR, concurrency=3,
                                   previous={"raw-blobs": 10, "accepted": 0})  # fmt: skip

    # quarantine and raw-bundles: a few keys (none), probed whole
    assert listing.ranges_total == 3 * 4 + 1 + 3 * 4 + 1
    assert listing.ranges_resumed == 0
    assert await read_parts(store, listing) == await expected_rows(store)


async def test_a_resumed_audit_keeps_its_plan_whatever_the_counts_now() -> None:
    store = MemoryStore()
    await put_all(store, world(agents=12, per_agent=3, blobs=30))
    # The plan is written, then the first probed part's write crashes.
    crashing = HangAfterParts(store, AUDIT_DIR, 0, hang=False)
    with pytest.raises(Crashed):
        await list_for_audit(crashing, AUDIT_DIR, concurrency=4)
    body, _etag = await store.get(AUDIT_DIR + PLAN_NAME)
    assert len(parse_plan(PLAN_NAME, body)) == len(KINDS)  # small: one range a kind

    recorder = ListRecorder(store)
    resumed = await list_for_audit(recorder, AUDIT_DIR, concurrency=4,
                                   previous={kind: 10**9 for kind in KINDS})  # fmt: skip

    assert (await store.get(AUDIT_DIR + PLAN_NAME))[0] == body  # not planned again
    assert resumed.ranges_total == len(KINDS) and recorder.folder_lists == []
    listed = [call for call in recorder.lists if not call[0].startswith(AUDIT_DIR)]
    assert sorted(listed) == sorted((prefix, None) for prefix in KIND_PREFIXES.values())
    assert await read_parts(store, resumed) == await expected_rows(store)
    # And once finished, nothing is listed again.
    again = ListRecorder(store)
    done = await plan_listing(again, AUDIT_DIR, concurrency=4)
    assert not done.pending and [c for c in again.lists if c[0] != AUDIT_DIR] == []
