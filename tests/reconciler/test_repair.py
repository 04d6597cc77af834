"""Repair by steady passes and audits on the memory store: entries restored, problems
recorded and resolved, dirty markers written for hours that gained entries."""

from __future__ import annotations

from protocol import keys
from protocol.clock import ManualClock
from protocol.records import ProblemRecord, RollupDirty
from reconciler.audit import run_full_audit
from reconciler.problems import count_problems
from reconciler.steady import SteadyScanner
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    audits_until_a_verification_round_ends,
    context,
    derived_keys_in,
    keys_under,
    make_batch,
    write_batch,
    write_batches,
    write_conflict,
)


async def test_steady_pass_restores_entries_of_listed_manifests(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=3, per_agent=5)
    expected = await derived_keys_in(memory_store)
    gone = [batches[0].entry_key("accepted-by-blob"), batches[7].entry_key("raw-blobs-by-time")]
    for key in gone:
        await memory_store.delete(key)
    ctx = await context(memory_store, clock)

    result = await SteadyScanner(ctx).run_pass()

    assert result.complete and result.entries_checked == 15
    assert dict(result.outcome.created) == {"accepted-by-blob": 1, "raw-blobs-by-time": 1}
    assert await derived_keys_in(memory_store) == expected
    assert ctx.metrics.repairs.labels("accepted-by-blob")._value.get() == 1
    assert await keys_under(memory_store, keys.ROLLUP_DIRTY_PREFIX) == set()  # no hour gained


async def test_audit_restores_every_kind_including_by_time(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=4, per_agent=6)
    await write_conflict(memory_store, batches[3], clock.now_ns())
    expected = await derived_keys_in(memory_store)
    for batch in batches[::5]:
        for key in batch.derived_keys:
            await memory_store.delete(key)
    for key in await keys_under(memory_store, keys.QUARANTINE_BY_BLOB_PREFIX):
        await memory_store.delete(key)
    ctx = await context(memory_store, clock)

    record = await run_full_audit(ctx)

    assert record.status == "completed"
    assert (record.manifests_seen, record.quarantines_seen, record.problems) == (24, 1, 0)
    assert record.repaired == {
        "accepted-by-time": 5,
        "accepted-by-blob": 5,
        "raw-blobs-by-time": 5,
        "quarantine-by-blob": 1,
        "rollup-dirty": 1,
    }
    assert await derived_keys_in(memory_store) == expected


async def test_manifest_without_any_derived_entry_is_found_by_the_audit(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    """The collector was killed right after creating the manifest."""
    [batch] = await write_batches(memory_store, agents=1, per_agent=1, derived_entries=False)
    ctx = await context(memory_store, clock)

    steady = await SteadyScanner(ctx).run_pass()
    assert steady.entries_seen == 0  # nothing indexes it: only the audit can find it
    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.manifests_seen == 1
    assert await derived_keys_in(memory_store) == batch.derived_keys


async def test_dirty_marker_is_written_for_each_hour_that_gained_an_entry(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    hour_ns = 3600 * keys.NS_PER_S
    start = (clock.now_ns() // hour_ns - 3) * hour_ns
    batches = await write_batches(
        memory_store, agents=1, per_agent=3, start_ns=start, step_ns=hour_ns
    )
    await memory_store.delete(batches[1].entry_key("accepted-by-time"))
    await memory_store.delete(batches[2].entry_key("accepted-by-blob"))
    ctx = await context(memory_store, clock)

    await run_full_audit(ctx)

    gained = batches[1].manifest.accepted_hour
    assert await keys_under(memory_store, keys.ROLLUP_DIRTY_PREFIX) == {
        keys.rollup_dirty_key(gained)
    }
    marker = RollupDirty.from_json((await memory_store.get(keys.rollup_dirty_key(gained)))[0])
    assert marker.hour == gained.iso


async def test_missing_blob_is_a_problem_in_steady_state_and_cleared_when_it_returns(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=2)
    blob_key = batches[0].manifest.raw_blob_key
    await memory_store.delete(blob_key)
    ctx = await context(memory_store, clock)

    result = await SteadyScanner(ctx).run_pass()

    assert dict(result.outcome.problems) == {"missing-blob": 1}
    body, _ = await memory_store.get(keys.problem_key("missing-blob", blob_key))
    problem = ProblemRecord.from_json(body)
    assert problem.subject_key == blob_key and batches[0].key in problem.detail
    assert ctx.metrics.problems.labels("missing-blob")._value.get() == 1

    await memory_store.put(blob_key, batches[0].frame)
    record = await run_full_audit(ctx)
    assert record.problems == 0
    assert await count_problems(memory_store) == {}


async def test_corrupt_blob_is_found_by_the_audit(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=2)
    blob_key = batches[1].manifest.raw_blob_key
    wrong = bytes(reversed(batches[1].frame))  # same size: a HEAD cannot tell
    await memory_store.put(blob_key, wrong)
    ctx = await context(memory_store, clock)

    steady = await SteadyScanner(ctx).run_pass()
    assert not steady.outcome.problems
    # Blobs are verified alongside the walk (`reconciler.verify`): within a round, which
    # may take more than one audit.
    records = await audits_until_a_verification_round_ends(ctx, clock)

    assert sum(r.problems for r in records) == 1
    assert await count_problems(memory_store) == {"corrupt-blob": 1}
    body, _ = await memory_store.get(keys.problem_key("corrupt-blob", blob_key))
    assert "hashes to" in ProblemRecord.from_json(body).detail


async def test_unparseable_manifest_is_a_problem_and_does_not_stop_the_audit(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=2, per_agent=2, derived_entries=False)
    await memory_store.put(batches[0].key, b'{"schema": "lightmetrics.accepted_batch.v1", "agent_')
    ctx = await context(memory_store, clock)

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.problems == 1
    assert await count_problems(memory_store) == {"unparseable-manifest": 1}
    repaired = await derived_keys_in(memory_store)
    assert all(b.derived_keys <= repaired for b in batches[1:])
    assert not batches[0].derived_keys & repaired


async def test_second_audit_repairs_nothing(memory_store: MemoryStore, clock: ManualClock) -> None:
    await write_batches(memory_store, agents=2, per_agent=3)
    ctx = await context(memory_store, clock)

    first = await run_full_audit(ctx)
    clock.advance(60)
    second = await run_full_audit(ctx)

    assert first.audit_id != second.audit_id
    assert first.repaired == second.repaired == {}
    assert second.started_at_unix_ns > first.started_at_unix_ns


async def test_raw_blob_time_index_is_not_rebuilt_for_hours_the_gc_owns(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    """Past the GC's retry horizon the GC prunes the entries of referenced blobs: an audit
    must not bring them back (each audit would undo each GC run)."""
    ctx = await context(memory_store, clock)
    horizon_s = ctx.settings.gc.retry_horizon_s
    old = make_batch(1, 1, clock.now_ns() - int((horizon_s + 3600) * 1e9))
    young = make_batch(1, 2, clock.now_ns() - int((horizon_s - 3600) * 1e9))
    for batch in (old, young):
        await write_batch(memory_store, batch, derived_entries=False)

    await run_full_audit(ctx)

    restored = await derived_keys_in(memory_store)
    assert (
        restored == (old.derived_keys - {old.entry_key("raw-blobs-by-time")}) | young.derived_keys
    )
