"""The live query's exclusion set (PROTOCOL §3.9): which of the window's batches a snapshot
includes, looked up column-wise in the ledger hour's cached Arrow column."""

from __future__ import annotations

from collector.query import committed as query_committed
from collector.query.committed import SnapshotSource
from protocol.clock import ManualClock
from rollup.table.owner import OwnerLease
from store.memory import MemoryStore
from tests.rollup.dataset_builder import commit_rows, hour_at, make_batch


async def test_only_the_candidates_the_ledger_includes_come_back() -> None:
    store = MemoryStore()
    clock = ManualClock()
    owner = await OwnerLease.acquire(store, "job", 60, clock)
    rows = [make_batch(hour_at(0), n).row for n in range(50)] + [make_batch(hour_at(1), 0).row]
    snapshot = (await commit_rows(store, owner, clock, ledger=rows)).snapshot
    source = SnapshotSource(store, refresh_interval_s=1.0, max_travel_versions=10)
    live = make_batch(hour_at(0), 999).row.manifest_id  # accepted, not rolled up yet
    candidates = {rows[3].manifest_id, rows[50].manifest_id, live}

    found = await source.included(snapshot, {hour_at(0).iso, hour_at(1).iso}, candidates)

    assert found == {rows[3].manifest_id, rows[50].manifest_id}
    assert await source.included(snapshot, {hour_at(0).iso}, set()) == set()


async def test_the_cache_is_bounded_by_bytes(monkeypatch: object) -> None:
    store = MemoryStore()
    clock = ManualClock()
    owner = await OwnerLease.acquire(store, "job", 60, clock)
    rows = [make_batch(hour_at(h), n).row for h in range(4) for n in range(20)]
    snapshot = (await commit_rows(store, owner, clock, ledger=rows)).snapshot
    source = SnapshotSource(store, refresh_interval_s=1.0, max_travel_versions=10)
    monkeypatch.setattr(query_committed, "MAX_CACHED_LEDGER_BYTES", 1)  # type: ignore[attr-defined]
    hours = {hour_at(h).iso for h in range(4)}

    found = await source.included(snapshot, hours, {r.manifest_id for r in rows})

    assert found == {r.manifest_id for r in rows}  # evicted hours are read again, not lost
    assert len(source._ledger) == 1  # the newest hour only
