"""Deletes and the Spark job: a re-run never resurrects deleted rows (the rewritten
``rollup_1m`` hour drops them, late points in a deleted range are left out), a delete
committed while a run is in flight makes the run re-plan, and ``verify`` still proves
every batch was included once."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from pyspark.sql import SparkSession

from protocol.clock import ManualClock
from rollup.job.run import RunHooks
from rollup.lifecycle import compaction
from rollup.lifecycle import delete as delete_mod
from rollup.read.verify import verify
from rollup.table.commit import load_latest
from rollup.table.manifest import Changes
from rollup.table.storage import StoreAccess
from store.fs import FileSystemStore
from tests.rollup.conftest import (
    DATA_START_NS,
    accept,
    assert_rollup_equal,
    committed_rollup,
    expected_rollup,
    make_frame,
    read_table,
    run,
)

S = 1_000_000_000
BOOT = uuid.UUID("00000000-0000-4000-8000-000000000001")
START = datetime.fromtimestamp(DATA_START_NS / S, tz=UTC)


def _frame(host: str, seconds: range, *, seq_start: int, agent: str = "agent-a") -> object:
    rows = [(DATA_START_NS + i * S, "cpu", float(i), {"host": host}) for i in seconds]
    return make_frame(rows, agent_id=agent, boot_id=BOOT, seq_start=seq_start)


def _hosts(table: object) -> dict[str, int]:
    counts: dict[str, int] = {}
    for labels in table.column("labels").to_pylist():  # type: ignore[attr-defined]
        host = dict(labels)["host"]
        counts[host] = counts.get(host, 0) + 1
    return counts


def _request(host: str) -> delete_mod.DeleteRequest:
    return delete_mod.DeleteRequest(
        metric="cpu",
        labels=(("host", host),),
        end=START + timedelta(hours=2),  # explicit: the test must not depend on today
        reason=f"remove {host}",
        requested_by="test",
    )


async def test_rerun_and_late_batches_never_resurrect_deleted_rows(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    a = _frame("a", range(0, 120), seq_start=0)
    b = _frame("b", range(0, 120), seq_start=0, agent="agent-b")
    await accept(fs_store, [a, b])
    assert (await run(spark, fs_store)).version == 1
    clock = ManualClock(DATA_START_NS + 3 * 3600 * S)
    await delete_mod.delete(fs_store, _request("a"), clock=clock)  # version 2

    # Late points of both series in the same (already rolled up) minutes.
    late_a = _frame("a", range(200, 260), seq_start=120)
    late_b = _frame("b", range(200, 260), seq_start=120, agent="agent-b")
    await accept(fs_store, [late_a, late_b])
    summary = await run(spark, fs_store)

    assert summary.outcome == "committed" and summary.version == 3
    assert summary.batches == 2 and summary.points == 120  # included: in the ledger
    assert _hosts(await read_table(fs_store, "points")) == {"b": 180}
    got = await committed_rollup(fs_store)
    assert_rollup_equal(got, expected_rollup([b, late_b]))
    # The rewritten rollup_1m file itself no longer holds host a (applied, not masked).
    latest = await load_latest(fs_store)
    assert latest is not None
    rewritten = [f for f in latest.snapshot.data_files("rollup_1m") if f.added_version == 3]
    assert rewritten and sum(f.row_count for f in rewritten) == len(got)
    report = await verify(fs_store)
    assert report.ok and sum(h.ledger.batches for h in report.hours) == 4


async def test_a_delete_committed_during_a_run_makes_it_replan(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    a = _frame("a", range(0, 90), seq_start=0)
    c = _frame("c", range(0, 90), seq_start=0, agent="agent-c")
    await accept(fs_store, [a])
    assert (await run(spark, fs_store)).version == 1
    await accept(fs_store, [c])
    clock = ManualClock(DATA_START_NS + 3 * 3600 * S)
    seen: list[int] = []

    async def delete_meanwhile(attempt: int, changes: Changes) -> None:
        seen.append(attempt)
        if attempt == 0:  # the run's files are written; its commit comes next
            await delete_mod.delete(fs_store, _request("c"), clock=clock)

    summary = await run(spark, fs_store, hooks=RunHooks(before_commit=delete_meanwhile))

    assert seen == [0, 1] and summary.commit_conflicts == 1
    assert summary.version == 3 and summary.batches == 1  # planned again on version 2
    assert _hosts(await read_table(fs_store, "points")) == {"a": 90}
    assert_rollup_equal(await committed_rollup(fs_store), expected_rollup([a]))
    assert (await verify(fs_store)).ok


async def test_compaction_racing_a_run_never_loses_or_doubles_a_point(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    """Three runs leave hour 0 with three points files; compaction (which also applies a
    delete) commits while a fourth run is between writing and committing: the run
    re-plans on the compacted snapshot, and totals are exact."""
    frames = [_frame("b", range(i * 100, i * 100 + 50), seq_start=i * 50) for i in range(4)]
    doomed = _frame("a", range(0, 30), seq_start=0, agent="agent-z")
    for frame in frames[:3]:
        await accept(fs_store, [frame] + ([doomed] if frame is frames[0] else []))
        await run(spark, fs_store)
    clock = ManualClock(DATA_START_NS + 3 * 3600 * S)
    await delete_mod.delete(fs_store, _request("a"), clock=clock)
    await accept(fs_store, [frames[3]])
    reports: list[object] = []

    async def compact_meanwhile(attempt: int, changes: Changes) -> None:
        if attempt == 0:
            reports.append(
                await compaction.compact(fs_store, access=StoreAccess(fs_store.url), clock=clock)
            )

    summary = await run(spark, fs_store, hooks=RunHooks(before_commit=compact_meanwhile))

    (report,) = reports
    masked = {h["table"]: h["rows_masked"] for h in report.hours}  # type: ignore[attr-defined]
    assert masked == {"points": 30, "rollup_1m": 1}  # host a's 30 points: one minute window
    assert report.rows_before - 31 == report.rows_after  # type: ignore[attr-defined]
    assert summary.commit_conflicts == 1 and summary.batches == 1
    assert _hosts(await read_table(fs_store, "points")) == {"b": 200}
    assert_rollup_equal(await committed_rollup(fs_store), expected_rollup(frames))
    assert (await verify(fs_store)).ok


async def test_compact_after_run_leaves_one_file_per_table_hour(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    frames = [_frame("b", range(i * 100, i * 100 + 40), seq_start=i * 40) for i in range(3)]
    for frame in frames:
        await accept(fs_store, [frame])
        summary = await run(spark, fs_store, compact_after_run=True)
        assert summary.compaction is not None
    # Runs commit v1, v2 and v4; compactions v3 and v5: hour 0's 2 points files -> 1, and
    # its 2 series files and its day's 2 series_day files (the day settled long ago: each
    # run adds its rows to the written day) -> 1 each.
    assert summary.compaction == {
        "version": 5,
        "hours": 3,
        "files_before": 6,
        "files_after": 3,
        "rows_masked": 0,
    }
    latest = await load_latest(fs_store)
    assert latest is not None and len(latest.snapshot.data_files("points")) == 1
    for table in ("series", "series_day"):  # merged: one row per series, counts added
        assert len(latest.snapshot.data_files(table)) == 1
        rows = await read_table(fs_store, table)
        assert rows.column("count").to_pylist() == [120]
    assert _hosts(await read_table(fs_store, "points")) == {"b": 120}
    assert_rollup_equal(await committed_rollup(fs_store), expected_rollup(frames))
    assert (await verify(fs_store)).ok


async def test_a_tie_with_a_point_deleted_by_agent_and_compacted_away_does_not_wedge(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    """Issue 24 item 5: agent-m's point is minute 0's committed first and last sample;
    ``delete --agent agent-m`` (points only) and compaction remove it from points while
    rollup_1m keeps it. A late sample on the same ts made stage 2 raise on every run
    (the rollup wedged); now the committed sample keeps its place."""
    m = make_frame([(DATA_START_NS, "cpu", 1.0, {"host": "h"})], agent_id="agent-m", boot_id=BOOT)
    await accept(fs_store, [m])
    assert (await run(spark, fs_store)).version == 1
    clock = ManualClock(DATA_START_NS + 3 * 3600 * S)
    by_agent = delete_mod.DeleteRequest(
        metric="cpu",
        agent_id="agent-m",
        end=START + timedelta(hours=2),
        reason="x",
        requested_by="t",
    )
    await delete_mod.delete(fs_store, by_agent, clock=clock)
    await compaction.compact(fs_store, access=StoreAccess(fs_store.url), clock=clock)
    assert (await read_table(fs_store, "points")).num_rows == 0
    late = make_frame(
        [(DATA_START_NS, "cpu", -5.0, {"host": "h"})], agent_id="agent-a", boot_id=BOOT
    )
    await accept(fs_store, [late])

    summary = await run(spark, fs_store)

    assert summary.outcome == "committed" and summary.batches == 1, summary
    (minute0,) = (await committed_rollup(fs_store)).values()
    # The committed sample wins the tie on ts both ways (its key is unknown).
    assert (minute0["count"], minute0["first"], minute0["last"]) == (2, 1.0, 1.0)
    assert (await verify(fs_store)).ok
