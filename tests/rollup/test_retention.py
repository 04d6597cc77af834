"""Retention (PROTOCOL §4.1) with the Spark job: a run drops each table's expired hours
from the snapshot (metadata only), never writes rows into them, records a batch whose
hours are all gone as late and excluded, and ``verify`` still proves every batch was
included once, reporting retired hours. Time is a manual store clock: nothing here
depends on today's date."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import SparkSession

from protocol import keys
from protocol.clock import ManualClock
from rollup.job.run import RunSummary, run_rollup
from rollup.read.verify import verify
from rollup.table.commit import load_latest
from rollup.table.storage import StoreAccess
from store.fs import FileSystemStore
from tests.rollup.conftest import DATA_START_NS, accept, make_frame, read_table, settings

S = 1_000_000_000
H = 3600 * S


def _frame(hours: float, count: int, *, seq_start: int, accepted_h: float) -> object:
    start = DATA_START_NS + int(hours * H)
    rows = [(start + i * S, "cpu", 1.0, {"host": "a"}) for i in range(count)]
    return make_frame(rows, seq_start=seq_start, accepted_at_ns=DATA_START_NS + int(accepted_h * H))


async def _run(spark: SparkSession, store: FileSystemStore, at_h: float) -> RunSummary:
    return await run_rollup(
        spark,
        store,
        access=StoreAccess(store.url),
        settings=settings(retention_points_days=1, retention_rollup_1m_days=2),
        clock=ManualClock(DATA_START_NS + int(at_h * H)),
    )


def _hours(table: object, column: str) -> set[int]:
    return {
        keys.UtcHour.from_unix_ns(v.value * 1000).start_ns
        for v in table.column(column)  # type: ignore[attr-defined]
    }


async def _index(store: FileSystemStore, table: str) -> list[tuple[int, int]]:
    """``(hour_start or day_start ns, count)`` of every row of a series-index table."""
    rows = await read_table(store, table)
    starts = rows.column(0).cast(pa.int64()).to_pylist()
    return sorted(zip([v * 1000 for v in starts], rows.column("count").to_pylist(), strict=True))


async def test_retention_drops_expired_hours_and_late_batches_are_excluded(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    a = _frame(0, 30, seq_start=0, accepted_h=35)  # hour H0
    b = _frame(30, 20, seq_start=30, accepted_h=35)  # hour H0 + 30
    await accept(fs_store, [a, b])
    # Now H0+40h: points keep from H0+16h, rollup_1m from H0-8h.
    first = await _run(spark, fs_store, 40)
    assert first.version == 1 and first.batches == 2 and first.late_excluded == 0
    assert (await read_table(fs_store, "points")).num_rows == 20  # a's hour is gone
    assert sum((await read_table(fs_store, "rollup_1m")).column("count").to_pylist()) == 50
    # The series index keeps what points keep: b's hour; b's day (H0+14h..H0+38h) ended
    # more than series_day_settle_s (1 h) ago, so it is written too.
    assert await _index(fs_store, "series") == [(DATA_START_NS + 30 * H, 20)]
    assert await _index(fs_store, "series_day") == [(DATA_START_NS + 14 * H, 20)]

    # Now H0+60h: points keep from H0+36h, rollup_1m from H0+12h. c falls wholly before
    # both (late: excluded), d is recent.
    c = _frame(0.5, 10, seq_start=50, accepted_h=59)
    d = _frame(59, 5, seq_start=60, accepted_h=59)
    await accept(fs_store, [c, d])
    second = await _run(spark, fs_store, 60)
    assert second.version == 2 and second.batches == 2 and second.late_excluded == 1
    latest = await load_latest(fs_store)
    assert latest is not None
    points_kept = keys.UtcHour.from_unix_ns(DATA_START_NS + 36 * H).iso
    assert latest.snapshot.retention == {
        "points": points_kept,
        "rollup_1m": keys.UtcHour.from_unix_ns(DATA_START_NS + 12 * H).iso,
        "series": points_kept,
        "series_day": points_kept,
    }
    # b's hour left with its points; its day stays while its last hour (H0+37h) is kept.
    assert await _index(fs_store, "series") == [(DATA_START_NS + 59 * H, 5)]
    assert await _index(fs_store, "series_day") == [(DATA_START_NS + 14 * H, 20)]
    points = await read_table(fs_store, "points")
    assert points.num_rows == 5 and _hours(points, "ts") == {DATA_START_NS + 59 * H}
    rollup = await read_table(fs_store, "rollup_1m")
    assert sum(rollup.column("count").to_pylist()) == 25  # b + d; a's hour dropped, c never
    report = await verify(fs_store)
    assert report.ok and sum(h.ledger.batches for h in report.hours) == 4
    (late_hour,) = [h for h in report.hours if h.late.batches]
    assert late_hour.late.batches == 1 and "1 late, excluded" in late_hour.describe()

    # Nothing new at H0+100h: a retention-only commit drops d's points and b's rollup.
    third = await _run(spark, fs_store, 100)
    assert third.outcome == "committed" and third.version == 3 and third.batches == 0
    assert (await read_table(fs_store, "points")).num_rows == 0
    assert await _index(fs_store, "series") == await _index(fs_store, "series_day") == []
    rollup = await read_table(fs_store, "rollup_1m")
    assert sum(rollup.column("count").to_pylist()) == 5
    report = await verify(fs_store)
    assert report.ok
    described = {h.hour: h.describe() for h in report.hours}
    accepted_35 = keys.UtcHour.from_unix_ns(DATA_START_NS + 35 * H).iso
    assert described[accepted_35] == "retired (2 batches)"
    # And once more: nothing moves, nothing is committed.
    assert (await _run(spark, fs_store, 100)).outcome == "up-to-date"
