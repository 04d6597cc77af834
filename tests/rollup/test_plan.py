"""Planning from rollup work markers (PROTOCOL §4, §3.7): the marked catalog hours minus
the snapshot's ledger; requests grow with the new batches, never with the history; a
catalog file that is unreadable, or holds a row of another hour, stops the plan."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

from index.rows import IndexFileError, accepted_row, encode
from protocol import keys
from protocol.clock import ManualClock
from rollup.job.plan import make_plan
from rollup.table.commit import load_latest
from rollup.table.owner import OwnerLease
from store.counting import CountingStore
from store.memory import MemoryStore
from tests.rollup.dataset_builder import (
    Batch,
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
        new = [  # distinct identities: one identity is one batch, whatever its hour
            make_batch(hour_at(history_hours + h), 50 * h + n, agent="agent-new")
            for h in range(2)
            for n in range(50)
        ]
        await accept(store, new)
        store.clear()

        plan = await make_plan(store, await load_latest(store))

        assert sorted(plan.manifest_ids()) == ids(new)
        assert len(plan.hours_checked) == 2
        history_files = {
            key
            for op, key in store.requests
            if op == "get"
            and key < keys.index_catalog_hour_prefix(hour_at(history_hours))
            and key.startswith(keys.INDEX_CATALOG_PREFIX)
        }
        assert not history_files, history_files
        costs.append((Counter(op for op, _ in store.requests), sum(store.listed.values())))
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
    assert sorted(plan.manifest_ids()) == ids(hour1[2:] + late)
    assert plan.dirty_markers == tuple(await work_markers(store))
    assert set(plan.batches_per_hour()) == {hour_at(1).iso}


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


async def test_both_agent_key_forms_of_one_batch_are_planned_once() -> None:
    """Issue 24 item 14: a mixed-version upgrade can catalog one batch under both agent
    key forms (PROTOCOL §3: the long ``agent=<hex>`` of a collector of before the segment
    rule, and ``agent=h-<sha256>``). Both rows have one ``manifest_id``: the plan includes
    the batch once (before: twice, its points counted twice), and ``verify`` counts the
    catalog hour's batch once too, so the hour is complete with it included once."""
    from rollup.read.verify import verify
    from rollup.table.ledger import read_catalog_totals

    store = MemoryStore()
    clock = ManualClock(hour_at(5).start_ns)
    long_agent = "a" * 128  # 256 hex digits: the h- form applies
    twice = make_batch(hour_at(0), 0, agent=long_agent)
    other = make_batch(hour_at(0), 1)
    legacy = keys.legacy_accepted_manifest_key(twice.manifest.identity)
    assert legacy is not None and legacy != twice.manifest.manifest_key
    await accept(store, [twice, other])
    late_row = accepted_row(twice.manifest, key=legacy)
    catalog_key = keys.index_catalog_key(hour_at(0), 9, 1)
    await store.put(catalog_key, encode([late_row]))
    await put_work_marker(store, catalog_key, rows=1)

    plan = await make_plan(store, None)

    assert sorted(plan.manifest_ids()) == ids([twice, other])
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    await commit_rows(store, owner, clock, ledger=[twice.row, other.row])
    # Raw retention and sealed_through_ns count the hour column-wise, the same way.
    latest = await load_latest(store)
    assert latest is not None
    totals = await read_catalog_totals(store, hour_at(0))
    assert totals == latest.snapshot.ledger_hours[hour_at(0).iso] and totals.batches == 2
    for from_manifests in (False, True):
        await store.put(legacy, twice.manifest.to_json())  # as an old collector wrote it
        report = await verify(store, from_manifests=from_manifests)
        assert report.ok, report
        assert report.hours[0].accepted.batches == 2


async def test_planning_holds_no_python_object_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22 item 3 (PROTOCOL §3.9): the marked hours' catalog rows and the ledger
    hour are anti-joined column-wise (DuckDB over local copies), and the plan's items
    are an Arrow table of `WORK_SCHEMA`. Before: one `IndexRow` per catalog row, the
    ledger as `LedgerRow`s and a Python set, a `WorkItem` per batch."""
    from index.rows import IndexRow
    from rollup.job.tasks import WORK_SCHEMA
    from rollup.table.ledger import LedgerRow

    store = MemoryStore()
    clock = ManualClock(hour_at(5).start_ns)
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    batches = [make_batch(hour_at(0), n) for n in range(6)]
    await accept(store, batches)
    await commit_rows(store, owner, clock, ledger=[b.row for b in batches[:2]])
    base = await load_latest(store)

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a Python object per batch")

    monkeypatch.setattr(IndexRow, "__init__", refuse)
    monkeypatch.setattr(LedgerRow, "__init__", refuse)
    plan = await make_plan(store, base)

    assert isinstance(plan.items, pa.Table) and plan.items.schema.equals(WORK_SCHEMA)
    assert sorted(plan.manifest_ids()) == ids(batches[2:])
    assert plan.records == 40 and plan.batches_per_hour() == {hour_at(0).iso: 4}
    first = plan.items.sort_by("manifest_id").slice(0, 1).to_pylist()[0]
    manifest = batches[2].manifest
    assert first == {
        "manifest_id": manifest.identity.manifest_id,
        "frame_sha256": manifest.frame_sha256,
        "raw_blob_key": manifest.raw_blob_key,
        "accepted_hour": hour_at(0).iso,
        "record_count": manifest.record_count,
        "raw_offset": None,  # a frame blob: read whole (PROTOCOL §3.10)
        "raw_length": None,
        "raw_object_bytes": None,
    }


async def test_a_batch_cataloged_in_two_hours_is_planned_once_in_the_earlier() -> None:
    """Both agent key forms of one batch in two hours (each form's manifest has its own
    ``accepted_at``): planned once, the earlier hour's row, as the row-wise planner did;
    now one DuckDB window over the ids that occur more than once."""
    store = MemoryStore()
    long_agent = "b" * 128
    first = make_batch(hour_at(0), 0, agent=long_agent)
    await accept(store, [first])
    later = first.manifest.model_copy(
        update={"accepted_at_unix_ns": hour_at(1).start_ns + 5 * 1_000_000_000}
    )
    legacy = keys.legacy_accepted_manifest_key(first.manifest.identity)
    assert legacy is not None
    catalog_key = keys.index_catalog_key(hour_at(1), 9, 1)
    await store.put(catalog_key, encode([accepted_row(later, key=legacy)]))
    await put_work_marker(store, catalog_key, rows=1)

    plan = await make_plan(store, None)

    assert plan.manifest_ids() == ids([first])
    assert plan.batches_per_hour() == {hour_at(0).iso: 1}
    assert plan.hours_checked == (hour_at(0).iso, hour_at(1).iso)


async def test_a_key_held_twice_by_the_newest_catalog_file_is_planned_once() -> None:
    """A catalog file can hold one key twice (a compaction merge of two files that both
    cataloged it, or a chunk that met the key twice); with another file also holding it,
    the newest file's rows both matched "the newest file" and the batch was planned twice:
    the 30-minute chaos run (seed 2029, round 5) committed two batches twice, their
    points counted twice. One row per (hour, key), the newest file's last."""
    store = MemoryStore()
    doubled, single = make_batch(hour_at(0), 0), make_batch(hour_at(0), 1)
    await accept(store, [doubled, single])  # one catalog file holding both, and a marker
    merged = keys.index_catalog_key(hour_at(0), 9, 1)  # newer than the file accept wrote
    doubled_row = accepted_row(doubled.manifest)
    await store.put(merged, encode([doubled_row, doubled_row]))
    await put_work_marker(store, merged, rows=2)
    alone = keys.index_catalog_key(hour_at(0), 9, 2)  # a key twice in its only file
    single_row = accepted_row(single.manifest)
    await store.put(alone, encode([single_row, single_row]))
    await put_work_marker(store, alone, rows=2)

    plan = await make_plan(store, None)

    assert sorted(plan.manifest_ids()) == ids([doubled, single])
    assert plan.batches_per_hour() == {hour_at(0).iso: 2}
