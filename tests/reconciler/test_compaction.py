"""Catalog compaction (PROTOCOL §3.7): a settled (or crowded) hour's files merged into one
with its own work marker; the inputs deleted only after the grace and only by the names
the merged file records, never a file written after the compaction listed the hour."""

from __future__ import annotations

import dataclasses
import io

import pyarrow.parquet as pq

from index import catalog
from index.catalog_merge import file_level
from protocol import keys
from protocol.clock import ManualClock
from reconciler.compaction import FANOUT, CatalogCompactor
from reconciler.context import ReconcilerContext
from reconciler.steady import SteadyScanner
from rollup.job.plan import make_plan
from store.counting import CountingStore
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    T0_NS,
    catalog_keys,
    context,
    keys_under,
    log_rows,
    write_batches,
)

HOUR = keys.UtcHour.from_unix_ns(T0_NS)


async def compacting_context(
    store: MemoryStore | CountingStore, clock: ManualClock
) -> tuple[ReconcilerContext, CatalogCompactor]:
    compactor = CatalogCompactor()
    ctx = await context(store, clock)
    return dataclasses.replace(ctx, on_catalog_written=compactor.touched), compactor


async def test_a_settled_hour_is_merged_its_inputs_deleted_after_the_grace(
    clock: ManualClock,
) -> None:
    store = CountingStore(MemoryStore(clock=clock))
    batches = await write_batches(store, agents=3, per_agent=4)
    ctx, compactor = await compacting_context(store, clock)
    scanner = SteadyScanner(ctx)
    for part in (batches[:4], batches[4:8], batches[8:]):
        await log_rows(store, clock, part)
        await scanner.run_pass()
    inputs = {info.key for info in await catalog.list_hour_files(store, HOUR)}
    assert len(inputs) == 3
    assert (await compactor.run(ctx)).hours_compacted == 0  # the hour is not settled yet

    clock.advance(3 * 3600)  # the hour's end is older than the lookback: settled
    result = await compactor.run(ctx)

    assert (result.hours_compacted, result.files_merged, result.inputs_deleted) == (1, 3, 0)
    files = {info.key for info in await catalog.list_hour_files(store, HOUR)}
    [merged] = files - inputs
    assert keys.rollup_work_marker_key(merged) in await keys_under(store, keys.ROLLUP_WORK_PREFIX)
    clock.advance(ctx.settings.reconciler.catalog_grace_s - 1)
    assert (await compactor.run(ctx)).inputs_deleted == 0  # within the grace: kept
    clock.advance(2)
    assert (await compactor.run(ctx)).inputs_deleted == 3
    assert [info.key for info in await catalog.list_hour_files(store, HOUR)] == [merged]
    assert await catalog_keys(store) == {b.key for b in batches}

    store.clear()
    plan = await make_plan(store, None)  # the rollup plans from the markers' hours only
    assert sorted(plan.manifest_ids()) == sorted(b.manifest.identity.manifest_id for b in batches)
    assert plan.hours_checked == (HOUR.iso,)
    assert store.keys_of("get", keys.ACCEPTED_PREFIX) == []  # no manifest read to plan


async def test_a_file_written_after_the_merge_is_never_deleted_with_the_inputs(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=2, per_agent=3)
    ctx, compactor = await compacting_context(memory_store, clock)
    scanner = SteadyScanner(ctx)
    for part in (batches[:2], batches[2:4]):
        await log_rows(memory_store, clock, part)
        await scanner.run_pass()
    clock.advance(3 * 3600)
    assert (await compactor.run(ctx)).hours_compacted == 1
    late = batches[4:]  # log rows of the settled hour that arrive after its merge
    await log_rows(memory_store, clock, late, writer_id="late-collector")
    await scanner.run_pass()
    files_before = {info.key for info in await catalog.list_hour_files(memory_store, HOUR)}
    assert len(files_before) == 4  # two inputs, the merged file, the late file

    clock.advance(ctx.settings.reconciler.catalog_grace_s + 1)
    assert (await compactor.run(ctx, force=True)).inputs_deleted == 2

    assert await catalog_keys(memory_store) == {b.key for b in batches}


async def test_a_busy_hour_is_compacted_by_levels_before_it_settles(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    """PROTOCOL §3.9: FANOUT level-0 files merge into one level-1 file, FANOUT of those into
    a level-2 file; a row is rewritten once per level, never "everything again"."""
    batches = await write_batches(memory_store, agents=1, per_agent=FANOUT * FANOUT)
    ctx, compactor = await compacting_context(memory_store, clock)
    scanner = SteadyScanner(ctx)
    merged_rows = 0
    for batch in batches:  # one catalog file per pass
        await log_rows(memory_store, clock, [batch], writer_id=f"c{batch.manifest.seq_start}")
        await scanner.run_pass()
        result = await compactor.run(ctx)
        merged_rows += result.files_merged
    files = await catalog.list_hour_files(memory_store, HOUR)
    levels = [
        file_level(pq.read_metadata(io.BytesIO((await memory_store.get(f.key))[0])).metadata)
        for f in files
    ]
    # 64 level-0 files -> 8 level-1 merges (64 inputs) -> 1 level-2 merge (8 inputs).
    assert merged_rows == FANOUT * FANOUT + FANOUT
    assert sorted(levels).count(2) == 1 and max(levels) == 2
    assert await catalog_keys(memory_store) == {b.key for b in batches}
