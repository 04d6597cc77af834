"""Catalog hours as Arrow columns (`index.catalog_tables`): the newest file's row per key,
and the hour's totals computed in DuckDB equal to the row-by-row reference."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from index.catalog import CatalogWriter
from index.catalog_tables import hour_totals, manifest_ids, newest_per_key, read_hour_table
from index.rows import accepted_row, quarantine_row, table_of
from protocol import keys
from protocol.clock import ManualClock
from protocol.setsum import Setsum
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
    table = newest_per_key([table_of([old, other]), table_of([newer]), table_of([])])
    assert table.column("key").to_pylist() == sorted([old.key, other.key])
    by_key = dict(
        zip(table.column("key").to_pylist(), table.column("etag").to_pylist(), strict=True)
    )
    assert by_key == {old.key: "new", other.key: None}


async def test_read_hour_table_reads_only_the_columns_asked_for() -> None:
    store = MemoryStore()
    writer = CatalogWriter(store=store, clock=ManualClock(T0), rng=random.Random(1), epoch=1)
    hour = keys.UtcHour.from_unix_ns(T0)
    await writer.write(hour, [accepted_row(manifest(1)), quarantine_row(conflict(1))])
    await writer.write(hour, [accepted_row(manifest(1)), accepted_row(manifest(2))])
    read = await read_hour_table(store, hour, ["key", "kind", "frame_sha256"])
    assert read.table.column_names == ["key", "kind", "frame_sha256"]
    assert read.table.num_rows == 3 and read.accepted().num_rows == 2 and len(read.files) == 2
