"""Planning from rollup work markers (PROTOCOL §4, §3.7): the marked catalog hours minus
the snapshot's ledger; requests grow with the new batches, never with the history; a
catalog file that is unreadable, or holds a row of another hour, stops the plan."""

from __future__ import annotations

from collections import Counter

import pytest

from index.rows import IndexFileError, accepted_row, encode
from protocol import keys
from protocol.clock import ManualClock
from rollup.commit import load_latest
from rollup.owner import OwnerLease
from rollup.plan import make_plan
from store.memory import MemoryStore
from tests.rollup.dataset_builder import (
    Batch,
    CountingStore,
    accept,
    catalog_manifests,
    commit_rows,
    hour_at,
    make_batch,
    put_work_marker,
    work_markers,
)


async def rolled_up_history(hours: int, per_hour: int = 5) -> CountingStore:
    """A store whose ``hours`` accepted hours are cataloged and committed, their work
    markers consumed: history the rollup has done."""
    store = CountingStore(MemoryStore())
    clock = ManualClock(hour_at(hours + 2).start_ns)
    owner = await OwnerLease.acquire(store, "history", 600, clock)
    batches = [make_batch(hour_at(h), n) for h in range(hours) for n in range(per_hour)]
    for batch in batches:
        await store.put(batch.manifest.manifest_key, batch.manifest.to_json())
    await catalog_manifests(store, [b.manifest for b in batches], markers=False)
    await commit_rows(store, owner, clock, ledger=[b.row for b in batches])
    await owner.release()
    return store


def ids(batches: list[Batch]) -> list[str]:
    return sorted(b.manifest.identity.manifest_id for b in batches)


async def test_planning_requests_do_not_grow_with_the_history() -> None:
    costs = []
    for history_hours in (3, 30):
        store = await rolled_up_history(history_hours)
        new = [
            make_batch(hour_at(history_hours + h), n, agent="agent-new")
            for h in range(2)
            for n in range(50)
        ]
        await accept(store, new)
        store.clear()

        plan = await make_plan(store, await load_latest(store))

        assert sorted(item.manifest_id for item in plan.items) == ids(new)
        assert len(plan.hours_checked) == 2
        history_files = {
            key
            for op, key in store.requests
            if op == "get"
            and key < keys.index_catalog_hour_prefix(hour_at(history_hours))
            and key.startswith(keys.INDEX_CATALOG_PREFIX)
        }
        assert not history_files, history_files
        costs.append((Counter(op for op, _ in store.requests), store.listed))
    assert costs[0] == costs[1], costs


async def test_planning_reads_the_marked_hours_minus_the_ledger() -> None:
    store = MemoryStore()
    clock = ManualClock(hour_at(5).start_ns)
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    hour0 = [make_batch(hour_at(0), n) for n in range(3)]
    hour1 = [make_batch(hour_at(1), n) for n in range(4)]
    await accept(store, hour0 + hour1)
    await commit_rows(store, owner, clock, ledger=[b.row for b in hour0 + hour1[:2]])
    for key in await work_markers(store):
        await store.delete(key)  # consumed by the run that committed
    late = [make_batch(hour_at(1), 10)]
    await accept(store, late)  # the hour gains a row: a new file and its marker

    plan = await make_plan(store, await load_latest(store))

    assert plan.hours_checked == (hour_at(1).iso,)  # hour 0 is not read at all
    assert sorted(item.manifest_id for item in plan.items) == ids(hour1[2:] + late)
    assert plan.dirty_markers == tuple(await work_markers(store))
    assert {item.accepted_hour for item in plan.items} == {hour_at(1).iso}


async def test_a_catalog_file_holding_a_row_of_another_hour_is_refused() -> None:
    store = MemoryStore()
    own, stray = make_batch(hour_at(0), 0), make_batch(hour_at(1), 1)
    key = keys.index_catalog_key(hour_at(0), 1, 1)
    await store.put(key, encode([accepted_row(own.manifest), accepted_row(stray.manifest)]))
    await put_work_marker(store, key, rows=2)

    with pytest.raises(IndexFileError, match="belongs to hour"):
        await make_plan(store, None)


async def test_an_unreadable_catalog_file_stops_planning() -> None:
    store = MemoryStore()
    await accept(store, [make_batch(hour_at(0), 0)])  # a sound file and its marker
    await store.put(keys.index_catalog_key(hour_at(0), 7, 1), b"PAR1 torn off here")

    with pytest.raises(IndexFileError, match="not an index file"):
        await make_plan(store, None)
    assert len(await work_markers(store)) == 1  # nothing consumed
