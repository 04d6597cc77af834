"""`rollup.read.travel`: the snapshot current at a time, and what finding it costs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from protocol import keys
from protocol.clock import ManualClock
from rollup.read.travel import load_as_of, load_snapshot
from rollup.table.commit import VersionNotFound
from rollup.table.manifest import parse_created_at
from rollup.table.owner import OwnerLease
from store.counting import CountingStore
from store.memory import MemoryStore
from tests.rollup.dataset_builder import commit_rows, hour_at, points


async def five_versions() -> tuple[CountingStore, list[datetime]]:
    """Versions 1..5, committed a minute apart; their created_at times."""
    store = MemoryStore("memory://travel")
    clock = ManualClock(hour_at(3).start_ns)
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    times = []
    for n in range(5):
        loaded = await commit_rows(
            store, owner, clock, data=[("points", hour_at(0), points(hour_at(0), 1, seq_start=n))]
        )
        times.append(parse_created_at(loaded.snapshot.created_at))
        clock.advance(60)
    return CountingStore(store), times


async def test_as_of_is_the_newest_version_at_or_before_the_time() -> None:
    store, times = await five_versions()
    for version, created in enumerate(times, start=1):
        for moment in (created, created + timedelta(seconds=59)):
            loaded = await load_as_of(store, moment)
            assert loaded.snapshot.version == version
    latest = await load_as_of(store, datetime(2100, 1, 1, tzinfo=UTC))
    assert latest.snapshot.version == 5 and latest.pointer_etag != '"lightmetrics-stale-pointer"'
    with pytest.raises(VersionNotFound, match="oldest committed is version 1"):
        await load_as_of(store, times[0] - timedelta(seconds=1))
    with pytest.raises(ValueError, match="no timezone"):
        await load_as_of(store, datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="not both"):
        await load_snapshot(store, version=1, as_of=times[0])


async def test_as_of_costs_two_gets_plus_one_per_newer_version() -> None:
    """The cost the module doc counts: the pointer, the latest snapshot, one GET per step
    back; no LIST."""
    store, times = await five_versions()
    for version, created in enumerate(times, start=1):
        store.clear()
        await load_as_of(store, created)
        newer = 5 - version
        assert store.count("get") == 2 + newer
        assert store.count("get", keys.ROLLUP_MANIFESTS_PREFIX) == 1 + newer
        assert store.count("list") == 0


async def test_as_of_before_anything_or_beyond_vacuum() -> None:
    empty = MemoryStore("memory://travel-empty")
    with pytest.raises(VersionNotFound, match="nothing has been committed"):
        await load_as_of(empty, datetime(2026, 1, 1, tzinfo=UTC))
    store, times = await five_versions()
    first = await load_snapshot(store, version=1)
    second = await load_snapshot(store, version=2)
    assert first is not None and second is not None
    await store.delete(first.manifest_key)  # as vacuum does beyond the retention
    with pytest.raises(VersionNotFound, match="oldest kept is version 2"):
        await load_as_of(store, times[0])
