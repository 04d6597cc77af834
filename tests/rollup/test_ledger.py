"""Ledger files: encoding, per-hour totals, and reading a snapshot's ledger by hour."""

from __future__ import annotations

import pytest

from protocol.clock import ManualClock
from protocol.setsum import Setsum
from rollup.table.ledger import (
    decode_ledger,
    encode_ledger,
    included_manifest_ids,
    ledger_file_hour,
    ledger_rows,
    ledger_table,
    ledger_totals,
    read_ledger,
)
from rollup.table.manifest import LedgerHour, RollupManifestError
from rollup.table.owner import OwnerLease
from rollup.table.schemas import LEDGER_SCHEMA
from store.memory import MemoryStore
from tests.rollup.dataset_builder import commit_rows, hour_at, make_batch, parquet_bytes, points


def test_table_round_trip_and_totals() -> None:
    rows = [make_batch(hour_at(h), n).row for h in (0, 1) for n in range(3)]
    table = ledger_table(rows)
    assert table.schema.equals(LEDGER_SCHEMA)
    assert ledger_rows(decode_ledger(encode_ledger(table))) == rows
    totals = ledger_totals(table)
    assert list(totals) == [hour_at(0).iso, hour_at(1).iso]
    expected = Setsum.of((r.manifest_id, r.frame_sha256) for r in rows[:3]).hex
    assert totals[hour_at(0).iso] == LedgerHour(3, 30, expected)
    assert ledger_totals(ledger_table([])) == {}


def test_decode_refuses_what_is_not_a_ledger() -> None:
    with pytest.raises(RollupManifestError, match="unreadable"):
        decode_ledger(b"not parquet", key="k")
    with pytest.raises(RollupManifestError, match="unreadable"):
        decode_ledger(parquet_bytes(points(hour_at(0), 2)), key="k")
    with pytest.raises(ValueError, match="LEDGER_SCHEMA"):
        encode_ledger(points(hour_at(0), 1))


def test_ledger_file_hour() -> None:
    assert ledger_file_hour("rollup/v1/ledger/date=2026-11-21/hour=10/x.parquet") == "2026-11-21T10"
    assert ledger_file_hour("rollup/v1/ledger/x.parquet") is None


async def test_read_ledger_by_hour() -> None:
    store = MemoryStore()
    clock = ManualClock()
    owner = await OwnerLease.acquire(store, "job", 60, clock)
    first = [make_batch(hour_at(0), n).row for n in range(2)]
    second = [make_batch(hour_at(0), 5).row, make_batch(hour_at(1), 0).row]
    await commit_rows(store, owner, clock, ledger=first)
    loaded = await commit_rows(store, owner, clock, ledger=second)
    snapshot = loaded.snapshot
    assert len(snapshot.ledger_files) == 3
    everything = await read_ledger(store, snapshot)
    assert sorted(ledger_rows(everything), key=str) == sorted(first + second, key=str)
    only_h1 = await read_ledger(store, snapshot, {hour_at(1).iso})
    assert ledger_rows(only_h1) == [second[1]]
    ids = await included_manifest_ids(store, snapshot, {hour_at(0).iso, hour_at(5).iso})
    assert ids == {
        hour_at(0).iso: {r.manifest_id for r in first} | {second[0].manifest_id},
        hour_at(5).iso: set(),
    }
    assert ledger_totals(everything) == dict(snapshot.ledger_hours)


def test_ledger_rows_carry_the_point_range_and_old_files_read_as_null() -> None:
    """PROTOCOL §4: ledger rows record the batch's point range (``min_ts``, ``max_ts``);
    a file written before those columns reads with them null."""
    from io import BytesIO

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rollup.table.ledger import LedgerRow

    row = LedgerRow("m", "a" * 64, 3, "2026-11-21T10", 1_000_000, 2_000_000)
    assert ledger_rows(decode_ledger(encode_ledger(ledger_table([row])))) == [row]
    old = pa.table(
        {
            "manifest_id": ["m"],
            "frame_sha256": ["a" * 64],
            "record_count": pa.array([3], pa.int64()),
            "accepted_hour": ["2026-11-21T10"],
        }
    )
    sink = BytesIO()
    pq.write_table(old, sink)
    (read,) = ledger_rows(decode_ledger(sink.getvalue()))
    assert (read.min_ts, read.max_ts) == (None, None)
    assert read.record_count == 3
