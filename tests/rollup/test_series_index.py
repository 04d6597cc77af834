"""The series index and the read layout of ``points`` (PROTOCOL §4 ``series``/``series_day``,
§5 "Matchers" and "Names"; issue 32 items 3-5).

- A ``points`` file holding many series is sorted by series then time in small row groups
  with ``series`` statistics, so a single-series selector reads few row groups (counted
  through pyarrow's statistics pruning; the same rows unsorted read every group).
- Through the real job on the shared Spark session, with store time on a manual clock:
  ``series`` rows equal what ``points`` holds (presented names of a dotted name, of two
  stored series presenting one label set, of a label-name clash); a late batch adds a row
  in a new file and the combined rows are right; a day gets its ``series_day`` only once
  it ended plus the settle margin; a late batch into a written day adds a file to it;
  `read_series_rows` reads days for whole days and hours at the edges; a delete lists
  until compaction recomputes the hour and rewrites the day; Iceberg metadata reads both
  tables. (Retention: tests.rollup.test_retention; retraction: tests.rollup.test_retraction.)
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from pyiceberg.table import StaticTable
from pyspark.sql import SparkSession

from collector.promql.matchers import compile_matcher
from collector.query.file_cache import FileCache
from collector.query.series_first import resolve_stored_series
from protocol import keys
from protocol.clock import ManualClock
from rollup.iceberg.publish import table_url
from rollup.job.frame_stage import PointsFile
from rollup.job.tasks import WriteOptions
from rollup.lifecycle.compaction import compact
from rollup.lifecycle.delete import DeleteRequest, delete
from rollup.read import sql
from rollup.read.reader import scan
from rollup.read.series_index import index_files, read_series_rows
from rollup.table.commit import load_latest
from rollup.table.manifest import Snapshot
from rollup.table.schemas import POINTS_ROW_GROUP_ROWS, POINTS_SCHEMA, TS_TYPE
from rollup.table.series import series_array
from rollup.table.storage import StoreAccess
from rollup.table.tombstones import TombstoneError
from store.fs import FileSystemStore
from tests.rollup.conftest import (
    DATA_START_NS,
    SentFrame,
    accept,
    expected_index,
    index_rows,
    make_frame,
    run,
)
from tests.rollup.test_iceberg import canonical

S = 1_000_000_000
H = 3600 * S
DAY_START_NS = DATA_START_NS - 10 * H  # 2026-11-21T00
HOUR = keys.UtcHour.from_unix_ns(DATA_START_NS)


def _many_series(series: int, per_series: int) -> pa.Table:
    """``points`` rows of ``series`` series x ``per_series`` points, shuffled."""
    rows = series * per_series
    order = np.random.default_rng(7).permutation(rows)
    ids = pa.array((np.arange(rows) % series)[order])
    metric = pa.array([f"m{i % 7}" for i in range(series)])
    labels = pa.MapArray.from_arrays(
        pa.array(np.arange(series + 1, dtype=np.int32)),
        pa.array(["host"] * series),
        pa.array([f"h{i:05d}" for i in range(series)]),
    )
    names = series_array(metric, labels)
    ts = pa.array(DATA_START_NS // 1000 + order.astype(np.int64), pa.int64()).cast(TS_TYPE)
    return pa.Table.from_arrays(
        [
            ts,
            metric.take(ids),
            labels.take(ids),
            pa.array(np.ones(rows)),
            names.take(ids),
            pa.repeat(pa.scalar("agent-a"), rows),
            pa.repeat(pa.scalar("boot"), rows),
            pa.array(np.arange(rows, dtype=np.int64)),
        ],
        schema=POINTS_SCHEMA,
    )


def _groups_read(path: Path, series: str) -> tuple[int, int]:
    """``(row groups the selector's statistics cannot exclude, rows of the series in
    them)``: what a reader pruning by row-group statistics reads."""
    (fragment,) = ds.dataset(str(path), format="parquet").get_fragments()
    wanted = pc.field("series") == series
    groups = fragment.split_by_row_group(filter=wanted)
    rows = sum(g.to_table(filter=wanted).num_rows for g in groups)
    return len(groups), rows


def test_a_single_series_selector_reads_few_row_groups(tmp_path: Path) -> None:
    points = _many_series(series=2_500, per_series=120)  # 300,000 rows
    options = WriteOptions(access=StoreAccess(f"file://{tmp_path}"))
    written = PointsFile(options, HOUR)  # the job's points writer (stage 1)
    written.write(points)
    written.close()
    path = tmp_path / written.path
    metadata = pq.ParquetFile(path).metadata
    total = metadata.num_row_groups
    assert total == -(-points.num_rows // POINTS_ROW_GROUP_ROWS) == 5
    column = POINTS_SCHEMA.get_field_index("series")
    for group in range(total):  # series statistics are written for every row group
        assert metadata.row_group(group).column(column).statistics.has_min_max
    selectors = pc.unique(points.column("series")).to_pylist()[::499]
    for series in selectors:
        groups, rows = _groups_read(path, series)
        assert rows == 120 and groups <= 2, (series, groups)
    # The same rows as they arrive (unsorted): every selector reads every row group.
    unsorted = tmp_path / "unsorted.parquet"
    pq.write_table(points, unsorted, row_group_size=POINTS_ROW_GROUP_ROWS)
    assert _groups_read(unsorted, selectors[0]) == (total, 120)


def test_deletes_never_name_the_series_index() -> None:
    """The index is derived from points: a delete names points (and rollup_1m), and the
    compaction that applies it recomputes the index (PROTOCOL §4)."""
    request = DeleteRequest(metric="cpu", reason="test", requested_by="t")
    assert request.tombstone(now_ns=DATA_START_NS).tables == ("points", "rollup_1m")
    for table in ("series", "series_day"):
        with pytest.raises(TombstoneError, match="series index"):
            replace(request, tables=(table,)).tombstone(now_ns=DATA_START_NS)


def _frame(agent: str, rows: list[tuple[int, str, dict[str, str] | None]]) -> SentFrame:
    return make_frame(
        [(ts, metric, 1.0, labels) for ts, metric, labels in rows],
        agent_id=agent,
        boot_id=uuid.UUID(int=len(agent)),
        accepted_at_ns=DATA_START_NS,
    )


async def test_series_rows_follow_points_late_batches_days_and_deletes(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    t = DATA_START_NS
    dotted = 'http.server.duration{route="/a"}'
    first = _frame(
        "agent-a",
        [
            *[(t + i * S, "http.server.duration", {"route": "/a"}) for i in range(10, 13)],
            *[(t + i * S, "a.b", {"x": "1"}) for i in range(2)],
            *[(t + i * S, "a_b", {"x": "1"}) for i in range(2, 4)],
            (t + 5 * S, "up", {"k.1": "v", "k_1": "w"}),
            (t + H + S, "cpu", {"host": "h"}),
        ],
    )
    await accept(fs_store, [first])
    clock = ManualClock(t + 2 * H)  # the day (ends at DAY_START + 24 h) is not over
    assert (await run(spark, fs_store, clock=clock)).batches == 1
    assert await index_rows(fs_store, "series") == await expected_index(fs_store)
    assert await index_rows(fs_store, "series_day") == {}
    rows = {r["series"]: r for r in (await _read(fs_store, "series")).to_pylist()}
    assert rows[dotted]["presented_name"] == "http_server_duration"
    assert rows[dotted]["presented_labels"] == [("route", "/a")]
    # Two stored series presenting one label set: both rows, the same presented names.
    same = [
        (rows[s]["presented_name"], rows[s]["presented_labels"])
        for s in ('a.b{x="1"}', 'a_b{x="1"}')
    ]
    assert same == [("a_b", [("x", "1")])] * 2
    assert rows['up{k.1="v",k_1="w"}']["presented_labels"] == [("k_1", "w")]  # a name clash
    for data_file in (await _snapshot(fs_store)).data_files("points"):
        stored = pq.read_table(fs_store.root / data_file.path, columns=["series", "ts"])
        assert (
            stored.to_pylist()
            == stored.sort_by([("series", "ascending"), ("ts", "ascending")]).to_pylist()
        )

    # Nothing new: no commit while the day is not over; once it ended plus the settle
    # margin, a run with no batches writes it (one file, in the day's last hour).
    assert (await run(spark, fs_store, clock=clock)).outcome == "up-to-date"
    clock.advance(14 * 3600)  # the day ended 2 h ago (settle margin: 1 h)
    assert (await run(spark, fs_store, clock=clock)).outcome == "committed"
    (day_file,) = (await _snapshot(fs_store)).data_files("series_day")
    assert day_file.partition.iso == "2026-11-21T23"
    assert await index_rows(fs_store, "series_day") == await expected_index(fs_store, by_day=True)
    assert (await run(spark, fs_store, clock=clock)).outcome == "up-to-date"

    # A late batch into hour 0 of the written day (earlier points of a known series, and a
    # new one): a second series file in the hour and a second series_day file, same commit.
    late = _frame(
        "agent-b",
        [(t + i * S, "http.server.duration", {"route": "/a"}) for i in range(2)]
        + [(t + 7 * S, "new", None)],
    )
    await accept(fs_store, [late])
    summary = await run(spark, fs_store, clock=clock)
    assert summary.batches == 1 and summary.version is not None
    version = summary.version
    snapshot = await _snapshot(fs_store)
    hour_files = [f for f in snapshot.data_files("series") if f.partition == HOUR]
    assert len(hour_files) == 2 and len(snapshot.data_files("series_day")) == 2
    for data_file in hour_files:  # per file at most one row per (hour, series)
        stored = pq.read_table(fs_store.root / data_file.path).column("series").to_pylist()
        assert len(stored) == len(set(stored))
    assert await index_rows(fs_store, "series") == await expected_index(fs_store)
    by_day = await expected_index(fs_store, by_day=True)
    assert await index_rows(fs_store, "series_day") == by_day
    assert by_day[(DAY_START_NS // 1000, dotted)][0] == 5
    # The index counts every points row the job wrote, so a remote read resolves its
    # matchers against it in every hour, by days and by hours (collector.query.series_first).
    points_hours = {f.partition for f in snapshot.data_files("points")}
    wanted = [compile_matcher("EQ", "__name__", "http_server_duration")]
    for low, high in ((DAY_START_NS, DAY_START_NS + 24 * H), (t, t + 2 * H)):
        found = resolve_stored_series(
            snapshot,
            pafs.LocalFileSystem(),
            str(fs_store.root),
            low_us=low // 1000,
            high_us=high // 1000,
            matchers=wanted,
            cache=FileCache(0),
        )
        assert found is not None and found.indexed == points_hours and found.wanted == (dotted,)

    # Reads: whole days from series_day, edge hours from series; counts combined.
    fs, root = pafs.LocalFileSystem(), str(fs_store.root)
    day = _moment(DAY_START_NS)
    days, hours = index_files(snapshot, day - _hours(12), day + _hours(25))
    assert len(days) == 2 and hours == []  # the day's hours are inside the whole day
    days, hours = index_files(snapshot, _moment(t), day + _hours(24))  # a partial day
    assert days == [] and {f.partition.iso for f in hours} == {HOUR.iso, HOUR.next().iso}
    listed = read_series_rows(snapshot, fs, root, day - _hours(12), day + _hours(25))
    assert {
        s: c for s, c in zip(listed["series"].to_pylist(), listed["count"].to_pylist(), strict=True)
    } == {series: count for (_, series), (count, _, _) in by_day.items()}
    edge = read_series_rows(
        snapshot, fs, root, _moment(t), _moment(t + H), columns=["presented_name"]
    )
    assert edge.column_names == ["presented_name"] and edge.num_rows == 5  # hour 0's series

    # Iceberg readers see both tables as the commit left them.
    connection = sql.open_duckdb()
    for table in ("series", "series_day"):
        ours = canonical(await scan(fs_store, table, filesystem=fs, root=root))
        location = str(fs_store.root / keys.rollup_iceberg_metadata_key(table, version))
        assert canonical(StaticTable.from_metadata(location).scan().to_arrow()) == ours
        theirs = connection.sql(f"SELECT * FROM iceberg_scan('{table_url(fs_store.url, table)}')")
        assert canonical(theirs.to_arrow_table()) == ours

    # A delete: the listing may still name the series until compaction applies it, then
    # the hour's rows are recomputed and the written day rewritten as one file.
    request = DeleteRequest(metric="a_b", labels=(("x", "1"),), reason="test", requested_by="t")
    await delete(fs_store, request, clock=clock)
    snapshot = await _snapshot(fs_store)
    assert (
        'a_b{x="1"}'
        in read_series_rows(snapshot, fs, root, day, day + _hours(24))["series"].to_pylist()
    )
    report = await compact(fs_store, access=StoreAccess(fs_store.url), clock=clock)
    masked = {(h["table"], h["hour"]): h["rows_masked"] for h in report.hours}
    assert masked[("points", HOUR.iso)] == 2
    snapshot = await _snapshot(fs_store)
    assert len(snapshot.data_files("series_day")) == 1
    assert len([f for f in snapshot.data_files("series") if f.partition == HOUR]) == 1
    assert await index_rows(fs_store, "series") == await expected_index(fs_store)
    assert await index_rows(fs_store, "series_day") == await expected_index(fs_store, by_day=True)
    assert (
        'a_b{x="1"}'
        not in read_series_rows(snapshot, fs, root, day, day + _hours(24))["series"].to_pylist()
    )


async def _snapshot(store: FileSystemStore) -> Snapshot:
    latest = await load_latest(store)
    assert latest is not None
    return latest.snapshot


async def _read(store: FileSystemStore, table: str) -> pa.Table:
    return await scan(store, table, filesystem=pafs.LocalFileSystem(), root=str(store.root))


def _moment(unix_ns: int) -> datetime:
    return datetime.fromtimestamp(unix_ns / 1e9, tz=UTC)


def _hours(count: int) -> timedelta:
    return timedelta(hours=count)
