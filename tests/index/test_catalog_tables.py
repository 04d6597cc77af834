"""Catalog hours as Arrow columns (`index.catalog_tables`): the row that counts per key,
and the hour's totals computed in DuckDB equal to the row-by-row reference."""

from __future__ import annotations

import dataclasses
import io
import random
import tempfile

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from index.catalog import CatalogWriter, compacted_from_names, list_hour_files
from index.catalog_local import MergeLimits
from index.catalog_merge import merge_files
from index.catalog_rank import with_rank
from index.catalog_tables import (
    hour_totals,
    manifest_ids,
    newest_per_key,
    read_hour_table,
    read_hour_totals,
)
from index.rows import IndexFileError, accepted_row, encode, quarantine_row, table_of
from protocol import keys
from protocol.clock import ManualClock
from protocol.setsum import Setsum
from rollup.job.plan_sql import pending_items
from store.counting import CountingStore
from store.memory import MemoryStore
from tests.index.test_index_files import T0, conflict, manifest

agents = st.sampled_from(["agent-a", "b", "x" * 128, "é" * 40, "y" * 125])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(agents, st.integers(0, 2**64 - 2)), min_size=1, max_size=40))
def test_hour_totals_equal_the_row_by_row_setsum(pairs: list[tuple[str, int]]) -> None:
    rows = [accepted_row(manifest(seq, agent=agent)) for agent, seq in dict.fromkeys(pairs)]
    table = table_of(rows)
    assert manifest_ids(table).to_pylist() == [row.manifest_id for row in rows]
    totals = hour_totals(table)
    expected = Setsum.of((row.manifest_id, row.frame_sha256) for row in rows)
    assert (totals.batches, totals.records, totals.setsum) == (
        len(rows),
        sum(row.record_count or 0 for row in rows),
        expected,
    )


def test_the_newest_file_row_counts_for_a_key() -> None:
    old = accepted_row(manifest(1))
    newer = dataclasses.replace(old, etag="new", source="audit")
    other = accepted_row(manifest(2))
    named = [([old, other], 5), ([newer], 6), ([], 7)]  # catalog files of epoch 1
    table = newest_per_key(
        [with_rank(table_of(rows), keys.index_catalog_key(old.hour, 1, seq)) for rows, seq in named]
    )
    assert table.column("key").to_pylist() == sorted([old.key, other.key])
    by_key = dict(
        zip(table.column("key").to_pylist(), table.column("etag").to_pylist(), strict=True)
    )
    assert by_key == {old.key: "new", other.key: None}


async def test_read_hour_table_reads_only_the_columns_asked_for() -> None:
    store = MemoryStore()
    writer = CatalogWriter(store=store, clock=ManualClock(T0), rng=random.Random(1), epoch=1)
    hour = keys.UtcHour.from_unix_ns(T0)
    await writer.write(
        hour, [accepted_row(manifest(1)), quarantine_row(conflict(1))], writer="steady"
    )
    await writer.write(
        hour, [accepted_row(manifest(1)), accepted_row(manifest(2))], writer="steady"
    )
    read = await read_hour_table(store, hour, ["key", "kind", "frame_sha256"])
    assert read.table.column_names == ["key", "kind", "frame_sha256"]
    assert read.table.num_rows == 3 and read.accepted().num_rows == 2 and len(read.files) == 2


async def test_read_hour_totals_out_of_core_equal_the_reference_with_superseding_rows() -> None:
    store = MemoryStore()
    writer = CatalogWriter(store=store, clock=ManualClock(T0), rng=random.Random(1), epoch=1)
    hour = keys.UtcHour.from_unix_ns(T0)
    long_agent = accepted_row(manifest(3, agent="é" * 60))
    first = [accepted_row(manifest(1)), accepted_row(manifest(2)), long_agent]
    await writer.write(hour, [*first, quarantine_row(conflict(1))], writer="steady")
    # A superseding row for seq 2 (the store's record differs from the claim) and a repeat.
    truth = dataclasses.replace(
        first[1], frame_sha256="ab" * 32, raw_blob_key=keys.raw_blob_key("ab" * 32)
    )
    await writer.write(hour, [truth, first[0]], writer="steady")

    totals = await read_hour_totals(store, hour)

    expected = [first[0], truth, long_agent]
    assert (totals.batches, totals.records) == (3, sum(r.record_count or 0 for r in expected))
    assert totals.setsum == Setsum.of((r.manifest_id, r.frame_sha256) for r in expected)
    assert (await read_hour_totals(store, hour.next())).batches == 0


async def test_read_hour_totals_refuses_a_row_of_another_hour() -> None:
    store = MemoryStore()
    hour = keys.UtcHour.from_unix_ns(T0)
    stray = accepted_row(manifest(1, at_ns=T0 + 2 * 3600 * 10**9))
    await store.put(keys.index_catalog_key(hour, 1, 1), encode([stray]))
    with pytest.raises(IndexFileError, match="malformed"):
        await read_hour_totals(store, hour)


async def test_files_merged_into_another_are_counted_once_through_it() -> None:
    store = MemoryStore()
    writer = CatalogWriter(store=store, clock=ManualClock(T0), rng=random.Random(1), epoch=1)
    hour = keys.UtcHour.from_unix_ns(T0)
    await writer.write(
        hour, [accepted_row(manifest(1)), accepted_row(manifest(2))], writer="steady"
    )
    await writer.write(hour, [accepted_row(manifest(3))], writer="steady")
    before = await read_hour_totals(store, hour)
    merged = await merge_files(store, writer, hour, await list_hour_files(store, hour), level=1)
    await writer.write(hour, [accepted_row(manifest(4))], writer="steady")  # after the merge

    after = await read_hour_totals(store, hour)

    assert len(merged.inputs) == 2 and len(await list_hour_files(store, hour)) == 4
    assert before.batches == 3 and after.batches == 4
    assert after.setsum == before.setsum + Setsum.of(
        [(accepted_row(manifest(4)).manifest_id, manifest(4).frame_sha256)]
    )


async def test_an_hour_whose_merge_inputs_await_deletion_fetches_the_merged_file_only() -> None:
    """While compaction's inputs wait out the readers' grace, a reader fetches the merged
    file (which holds their rows) and the files written since, not the inputs: one GET of
    the hour's rows, not one per level. A merge of such a listing still fetches every
    input, so that the names it records stay transitive."""
    store = CountingStore(MemoryStore())
    writer = CatalogWriter(store=store, clock=ManualClock(T0), rng=random.Random(1), epoch=1)
    hour = keys.UtcHour.from_unix_ns(T0)
    for n in range(3):
        await writer.write(
            hour, [accepted_row(manifest(10 * n + i)) for i in range(5)], writer="steady"
        )
    inputs = await list_hour_files(store, hour)
    merged = await merge_files(store, writer, hour, inputs, level=1)
    later = await writer.write(hour, [accepted_row(manifest(99))], writer="steady")
    store.clear()

    totals = await read_hour_totals(store, hour)
    with tempfile.TemporaryDirectory() as tmp:
        planned = await pending_items(store, [hour], [], MergeLimits(spill_dir=tmp))

    rows = [accepted_row(manifest(10 * n + i)) for n in range(3) for i in range(5)]
    rows.append(accepted_row(manifest(99)))
    assert totals.batches == 16
    assert totals.setsum == Setsum.of((r.manifest_id, r.frame_sha256) for r in rows)
    assert sorted(planned.column("manifest_id").to_pylist()) == sorted(r.manifest_id for r in rows)
    fetched = store.keys_of("get", keys.index_catalog_hour_prefix(hour))
    assert sorted(fetched) == sorted([merged.merged_key, later] * 2)

    store.clear()
    listing = await list_hour_files(store, hour)
    again = await merge_files(store, writer, hour, listing, level=2)
    assert sorted(store.keys_of("get", keys.index_catalog_hour_prefix(hour))) == sorted(
        info.key for info in listing
    )
    assert again.rows == 16
    body, _etag = await store.get(again.merged_key)
    names = compacted_from_names(pq.ParquetFile(io.BytesIO(body)).schema_arrow.metadata)
    assert set(names) == {info.key for info in inputs} | {merged.merged_key, later}


async def test_a_key_twice_in_one_file_counts_once_and_merges_into_one_row() -> None:
    """Two log rows of one key can land in one catalog file (one chunk met the key twice).
    The hour totals count it once, and compaction merges such a file (before: the newest
    file's two rows both counted, and the merge refused its own output for holding a key
    twice, so the hour could never be compacted)."""
    store = MemoryStore()
    writer = CatalogWriter(store=store, clock=ManualClock(T0), rng=random.Random(1), epoch=1)
    hour = keys.UtcHour.from_unix_ns(T0)
    once, twice = accepted_row(manifest(1)), accepted_row(manifest(2))
    await writer.write(hour, [once, twice], writer="steady")
    await writer.write(hour, [twice, twice], writer="steady")  # newest file: the key twice

    totals = await read_hour_totals(store, hour)
    merged = await merge_files(store, writer, hour, await list_hour_files(store, hour), level=1)

    assert totals.batches == 2
    assert totals.setsum == Setsum.of((r.manifest_id, r.frame_sha256) for r in (once, twice))
    assert merged.rows == 2
    assert (await read_hour_totals(store, hour)).batches == 2


async def test_one_file_holding_a_key_twice_counts_it_once() -> None:
    """One file is read without the newest-per-key aggregate only when it is a merged
    file (its keys distinct); a steady pass's file can hold a key twice."""
    store = MemoryStore()
    writer = CatalogWriter(store=store, clock=ManualClock(T0), rng=random.Random(1), epoch=1)
    hour = keys.UtcHour.from_unix_ns(T0)
    twice = accepted_row(manifest(2))
    await writer.write(hour, [twice, twice], writer="steady")
    totals = await read_hour_totals(store, hour)
    assert (totals.batches, totals.setsum) == (
        1,
        Setsum.of([(twice.manifest_id, twice.frame_sha256)]),
    )
