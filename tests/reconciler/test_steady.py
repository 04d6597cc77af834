"""The steady pass (PROTOCOL §3.7): catalog what the log names, each record read once, the
checkpoint moved past consumed segments (by CAS, fenced by epoch); consumed segments never
read again; an unreadable segment or a failing record never blocks the log; and a pass
costs the same whatever the store's age."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from chaos.faulty_store import Fault, FaultyStore
from index.rows import accepted_row, blob_row
from protocol import keys
from protocol.clock import ManualClock
from protocol.records import IndexCheckpoint, ProblemRecord
from reconciler.steady import SteadyScanner, read_checkpoint
from store.counting import CountingStore, Tally
from store.lease import LeaseLost
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    HOUR_NS,
    T0_NS,
    catalog_keys,
    catalog_rows,
    context,
    keys_under,
    log_rows,
    make_settings,
    write_batches,
    write_conflict,
)

S = keys.NS_PER_S


async def test_a_pass_catalogs_what_the_log_names_once_and_advances_the_checkpoint(
    clock: ManualClock,
) -> None:
    store = CountingStore(MemoryStore(clock=clock))
    batches = await write_batches(store, agents=2, per_agent=5)
    conflict = await write_conflict(store, batches[0], T0_NS + 5 * S)
    first = await log_rows(store, clock, batches[:6], [conflict], writer_id="c1")
    # A second collector re-logs batches 3..5 (duplicates it answered) along with 6..9.
    second = await log_rows(store, clock, batches[3:], writer_id="c2")
    ctx = await context(store, clock)
    store.clear()

    result = await SteadyScanner(ctx).run_pass()

    assert result.complete and result.segments_read == 2
    assert (result.records_read, result.rows_cataloged, result.problems) == (11, 11, 0)
    assert sorted(store.keys_of("get", keys.ACCEPTED_PREFIX)) == sorted(b.key for b in batches)
    assert store.keys_of("get", keys.QUARANTINE_PREFIX) == [conflict.quarantine_key]
    rows = await catalog_rows(store)
    assert set(rows) == {b.key for b in batches} | {conflict.quarantine_key}
    # Rows written before own_create existed are read back: the store's record and ETag.
    for b in batches:
        _body, etag = await store.get(b.key)
        assert rows[b.key] == replace(accepted_row(b.manifest), etag=etag, source="read-back")
    markers = await keys_under(store, keys.ROLLUP_WORK_PREFIX)
    assert {keys.parse_rollup_work_marker_key(m) for m in markers} == await keys_under(
        store, keys.INDEX_CATALOG_PREFIX
    )
    checkpoint = await read_checkpoint(store)
    assert checkpoint is not None and checkpoint == result.checkpoint
    assert checkpoint.owner_epoch == ctx.epoch
    assert set(checkpoint.log_seen) == {*first, *second}
    assert checkpoint.log_through_ns == keys.parse_index_log_segment_key(second[0]).time_ns
    assert checkpoint.totals == {
        "segments": 2,
        "accepted_rows": 13,
        "records_read": 11,
        "catalog_files": result.catalog_files,
        "markers": result.catalog_files,
        "checkpoints": 1,
    }

    store.clear()
    again = await SteadyScanner(ctx).run_pass()  # a new scanner: nothing remembered in memory
    assert (again.segments_read, again.records_read) == (0, 0)
    assert store.keys_of("get", keys.INDEX_LOG_PREFIX) == []
    assert store.count("put") == 0


async def test_an_idle_pass_of_the_same_term_is_one_log_listing(clock: ManualClock) -> None:
    # The term's leader is the checkpoint's only writer and problems are listed only when
    # a record is read: an idle pass costs one LIST, and the totals keep adding up.
    store = CountingStore(MemoryStore(clock=clock), overlap=True)
    batches = await write_batches(store, agents=1, per_agent=4)
    ctx = await context(store, clock)
    scanner = SteadyScanner(ctx)
    await log_rows(store, clock, batches[:2], writer_id="c1")
    await scanner.run_pass()
    clock.advance(5)
    store.clear()

    idle = await scanner.run_pass()

    assert idle.complete and idle.segments_read == 0
    assert len(store.lists) == 1 and store.lists[0][0].startswith(keys.INDEX_LOG_PREFIX)
    assert len(store.requests) == 1

    await log_rows(store, clock, batches[2:], writer_id="c2")
    store.clear()
    await scanner.run_pass()
    # Two records read at once: the problem records are listed once, not once per record.
    assert [prefix for prefix, _ in store.lists].count(keys.RECONCILER_PROBLEMS_PREFIX) == 1
    checkpoint = await read_checkpoint(store)
    assert checkpoint is not None
    assert (checkpoint.totals["segments"], checkpoint.totals["accepted_rows"]) == (2, 4)
    assert checkpoint.totals["checkpoints"] == 2


async def test_consumed_segments_are_never_read_again_and_late_ones_are_found(
    clock: ManualClock,
) -> None:
    store = CountingStore(MemoryStore(clock=clock))
    early = await write_batches(store, agents=1, per_agent=3, start_ns=T0_NS - 100 * S)
    batches = await write_batches(store, agents=1, per_agent=3, first_agent=1)
    ctx = await context(store, clock)
    scanner = SteadyScanner(ctx)
    consumed = await log_rows(store, clock, batches, writer_id="c1")
    await scanner.run_pass()
    clock.advance(600)
    newer = await write_batches(
        store, agents=1, per_agent=2, first_agent=2, start_ns=T0_NS + 200 * S
    )
    # A collector flushes late: its segment's rows (and name) are older than the position.
    late = await log_rows(store, clock, early, writer_id="c2")
    # Another logs new batches and a duplicate of an already cataloged one.
    fresh = await log_rows(store, clock, [*newer, batches[0]], writer_id="c3")
    store.clear()

    result = await scanner.run_pass()

    assert result.complete and result.segments_read == 2
    assert sorted(store.keys_of("get", keys.INDEX_LOG_PREFIX)) == sorted([*late, *fresh])
    assert not set(store.keys_of("get", keys.INDEX_LOG_PREFIX)) & set(consumed)
    # Each new record once; the duplicate's record was cataloged already: not read again.
    assert sorted(store.keys_of("get", keys.ACCEPTED_PREFIX)) == sorted(
        b.key for b in [*early, *newer]
    )
    # The listing starts from the position minus the lookback, never at the log's start.
    through = keys.parse_index_log_segment_key(consumed[0]).time_ns
    lookback_ns = int(ctx.settings.reconciler.lookback_s * S)
    assert [after for prefix, after in store.lists if prefix == keys.INDEX_LOG_PREFIX] == [
        keys.index_log_start_after(through - lookback_ns)
    ]
    assert await catalog_keys(store) == {b.key for b in [*early, *batches, *newer]}

    store.clear()
    assert (await scanner.run_pass()).segments_read == 0
    assert store.keys_of("get", keys.INDEX_LOG_PREFIX) == []


async def test_an_unreadable_segment_is_a_problem_and_does_not_block_the_log(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=2, per_agent=3)
    await log_rows(memory_store, clock, batches[:3], writer_id="c1")
    broken = keys.index_log_segment_key(T0_NS + 2 * S, "broken", 7)
    await memory_store.put(broken, b"PAR1 not parquet at all")
    await log_rows(memory_store, clock, batches[3:], writer_id="c2")
    store = CountingStore(memory_store)
    scanner = SteadyScanner(await context(store, clock))

    result = await scanner.run_pass()

    assert result.complete and (result.segments_read, result.problems) == (2, 1)
    assert await catalog_keys(memory_store) == {b.key for b in batches}
    body, _ = await memory_store.get(keys.problem_key("unreadable-index-file", broken))
    assert ProblemRecord.from_json(body).subject_key == broken
    checkpoint = await read_checkpoint(memory_store)
    assert checkpoint is not None and broken in checkpoint.log_seen  # passed, not retried
    store.clear()
    await scanner.run_pass()
    assert store.keys_of("get", keys.INDEX_LOG_PREFIX) == []


async def test_a_store_error_reading_one_record_fails_that_record_only(
    clock: ManualClock,
) -> None:
    inner = MemoryStore(clock=clock)
    batches = await write_batches(inner, agents=2, per_agent=4)
    segments = await log_rows(inner, clock, batches)
    faulty = FaultyStore(inner)
    victim = batches[5]
    faulty.script("get", victim.key, *[Fault.UNAVAILABLE] * 5)  # outlasts the bounded retries
    store = CountingStore(faulty)
    ctx = await context(store, clock)
    scanner = SteadyScanner(ctx)

    failed = await scanner.run_pass()

    assert not failed.complete and failed.failed == 1
    assert await catalog_keys(inner) == {b.key for b in batches} - {victim.key}
    assert ctx.metrics.store_failures.labels("catalog_read")._value.get() == 1
    assert await read_checkpoint(inner) is None  # the position stays before the segment

    store.clear()
    retried = await scanner.run_pass()

    assert retried.complete and retried.rows_cataloged == 1
    assert store.keys_of("get", keys.INDEX_LOG_PREFIX) == segments  # read again...
    assert store.keys_of("get", keys.ACCEPTED_PREFIX) == [victim.key]  # ...but only the victim
    assert await catalog_keys(inner) == {b.key for b in batches}
    checkpoint = await read_checkpoint(inner)
    assert checkpoint is not None and set(checkpoint.log_seen) == set(segments)


async def steady_pass_requests(history_hours: int) -> tuple[Tally, Counter[str]]:
    """Requests and listed keys of one steady pass over the same new work, on a store
    whose consumed history spans ``history_hours`` hours (two segments an hour)."""
    clock = ManualClock(T0_NS - (history_hours + 1) * HOUR_NS)
    store = CountingStore(MemoryStore(clock=clock))
    ctx = await context(store, clock, settings=make_settings(lookback_s=300.0))
    scanner = SteadyScanner(ctx)
    for half_hour in range(2 * history_hours):
        start = T0_NS - (history_hours + 1) * HOUR_NS + half_hour * HOUR_NS // 2
        clock.advance(1800)
        old = await write_batches(
            store, agents=1, per_agent=3, first_agent=100 + half_hour, start_ns=start
        )
        await log_rows(store, clock, old, writer_id=f"c{half_hour % 3}", seed=half_hour)
        assert (await scanner.run_pass()).complete
    clock.advance(3600 + 60)  # T0 + 60 s
    new = await write_batches(store, agents=2, per_agent=5)
    await log_rows(store, clock, new[:5], writer_id="c1", seed=1)
    await log_rows(store, clock, new[5:], writer_id="c2", seed=2)
    store.clear()

    result = await scanner.run_pass()

    assert result.complete and result.rows_cataloged == 10 and result.segments_read == 2
    return store.tally, store.listed


async def test_a_pass_costs_the_same_whatever_the_history() -> None:
    young_calls, young_listed = await steady_pass_requests(history_hours=3)
    old_calls, old_listed = await steady_pass_requests(history_hours=30)

    assert old_calls == young_calls and old_listed == young_listed
    assert young_calls[("get", "index-log")] == 2 and young_calls[("get", "accepted")] == 10
    # Listed: the two new segments and the newest consumed one, within the lookback behind
    # the position; the rest of the history is not even listed.
    assert young_listed["index-log"] == 3


async def test_a_checkpoint_written_by_a_newer_epoch_refuses_our_update(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=2)
    await log_rows(memory_store, clock, batches)
    ctx = await context(memory_store, clock)
    newer = IndexCheckpoint(
        log_through_ns=0, updated_at_unix_ns=clock.now_ns(), owner_epoch=ctx.epoch + 1
    )
    await memory_store.put(keys.RECONCILER_INDEX_CHECKPOINT_KEY, newer.to_json())

    with pytest.raises(LeaseLost):
        await SteadyScanner(ctx).run_pass()
    assert await read_checkpoint(memory_store) == newer


async def test_a_segment_from_a_clock_ahead_does_not_move_the_position_past_now(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    ctx = await context(memory_store, clock, settings=make_settings(lookback_s=70.0))
    scanner = SteadyScanner(ctx)
    ahead = await write_batches(memory_store, agents=1, per_agent=1, start_ns=T0_NS + HOUR_NS)
    await log_rows(memory_store, clock, ahead, writer_id="fast-clock")
    first = await scanner.run_pass()
    assert first.checkpoint is not None and first.checkpoint.log_through_ns <= clock.now_ns()

    clock.advance(120)
    on_time = await write_batches(
        memory_store, agents=1, per_agent=1, first_agent=1, start_ns=T0_NS + 120 * S
    )
    await log_rows(memory_store, clock, on_time, writer_id="right-clock")
    second = await scanner.run_pass()

    assert second.segments_read == 1 and second.rows_cataloged == 1
    assert await catalog_keys(memory_store) == {ahead[0].key, on_time[0].key}


async def test_blob_rows_nobody_references_become_orphan_suspects(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=3)
    orphan_sha = "ab" * 32
    await log_rows(
        memory_store, clock, batches, rows=[blob_row(orphan_sha, T0_NS + 10 * S)], writer_id="c1"
    )
    scanner = SteadyScanner(await context(memory_store, clock))

    await scanner.run_pass()

    assert scanner.suspects.take_older_than(T0_NS + 10 * S) == []  # younger than the horizon
    assert scanner.suspects.take_older_than(T0_NS + 11 * S) == [
        (orphan_sha, T0_NS + 10 * S, keys.raw_blob_key(orphan_sha))
    ]
    assert scanner.suspects.take_older_than(T0_NS + 11 * S) == []  # handed over once
