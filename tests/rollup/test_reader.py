"""The Spark-free reader: projection, pruning, version travel, and DuckDB agreement."""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from protocol.clock import ManualClock
from rollup.read import reader
from rollup.read.reader import Predicate, ScanStats, parse_predicate, plan_files, scan
from rollup.table.commit import LoadedSnapshot
from rollup.table.owner import OwnerLease
from rollup.table.schemas import POINTS_SCHEMA, ROLLUP_1M_SCHEMA
from store.fs import FileSystemStore
from tests.rollup.dataset_builder import commit_rows, hour_at, hour_start, points


class CountingHandler(pafs.FileSystemHandler):
    """A local filesystem that remembers which files were opened for reading."""

    def __init__(self) -> None:
        self.fs = pafs.LocalFileSystem()
        self.opened: Counter[str] = Counter()

    def __eq__(self, other: object) -> bool:
        return other is self

    def __ne__(self, other: object) -> bool:
        return other is not self

    def get_type_name(self) -> str:
        return "counting"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> Any:
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector: Any) -> Any:
        return self.fs.get_file_info(selector)

    def open_input_file(self, path: str) -> Any:
        self.opened[path] += 1
        return self.fs.open_input_file(path)

    def open_input_stream(self, path: str) -> Any:
        self.opened[path] += 1
        return self.fs.open_input_stream(path)

    def create_dir(self, path: str, recursive: bool) -> None:
        raise NotImplementedError

    def delete_dir(self, path: str) -> None:
        raise NotImplementedError

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        raise NotImplementedError

    def delete_root_dir_contents(self) -> None:
        raise NotImplementedError

    def delete_file(self, path: str) -> None:
        raise NotImplementedError

    def move(self, src: str, dest: str) -> None:
        raise NotImplementedError

    def copy_file(self, src: str, dest: str) -> None:
        raise NotImplementedError

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        raise NotImplementedError

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        raise NotImplementedError


class Dataset:
    """Three hours of points (cpu, mem, cpu with a NaN), then a version that rewrites
    the first hour; a rollup_1m file; files on the fs store under ``root``."""

    def __init__(self, store: FileSystemStore, root: str) -> None:
        self.store = store
        self.root = root
        self.handler = CountingHandler()
        self.fs = pafs.PyFileSystem(self.handler)
        self.v1: LoadedSnapshot
        self.v2: LoadedSnapshot

    async def build(self) -> None:
        clock = ManualClock(hour_at(3).start_ns)
        owner = await OwnerLease.acquire(self.store, "job", 600, clock)
        nan_hour = points(hour_at(2), 10, metric="cpu", seq_start=20, labels={"host": "b"})
        values = nan_hour.column("value").to_pylist()
        values[3] = math.nan
        nan_hour = nan_hour.set_column(3, "value", pa.array(values, pa.float64()))
        window = pa.table(
            {
                "window_start": [hour_start(hour_at(0))],
                "series": ["cpu"],
                "metric": ["cpu"],
                "labels": pa.array([None], POINTS_SCHEMA.field("labels").type),
                "count": [10],
                "sum": [45.0],
                "min": [0.0],
                "max": [9.0],
                "first_ts": [hour_start(hour_at(0))],
                "first": [0.0],
                "last_ts": [hour_start(hour_at(0)) + timedelta(seconds=9)],
                "last": [9.0],
            },
            schema=ROLLUP_1M_SCHEMA,
        )
        self.v1 = await commit_rows(
            self.store,
            owner,
            clock,
            data=[
                ("points", hour_at(0), points(hour_at(0), 10, metric="cpu")),
                ("points", hour_at(1), points(hour_at(1), 10, metric="mem", seq_start=10)),
                ("points", hour_at(2), nan_hour),
                ("rollup_1m", hour_at(0), window),
            ],
        )
        first = self.v1.snapshot.data_files("points")[0]
        self.v2 = await commit_rows(
            self.store,
            owner,
            clock,
            data=[("points", hour_at(0), points(hour_at(0), 5, metric="cpu", value_start=100))],
            remove=[first.path],
        )

    async def scan(self, table: str = "points", **options: Any) -> tuple[pa.Table, ScanStats]:
        stats = ScanStats()
        self.handler.opened.clear()
        result = await scan(
            self.store, table, filesystem=self.fs, root=self.root, stats=stats, **options
        )
        assert stats.files_read == len(self.handler.opened)  # what was opened, was counted
        return result, stats


@pytest.fixture
async def dataset(tmp_path: Path) -> Dataset:
    store = FileSystemStore(tmp_path / "store", clock=ManualClock())
    built = Dataset(store, str(tmp_path / "store"))
    await built.build()
    return built


async def test_full_scan_and_projection(dataset: Dataset) -> None:
    table, stats = await dataset.scan()
    assert table.schema.equals(POINTS_SCHEMA)
    assert table.num_rows == 25
    assert (stats.files_total, stats.files_pruned, stats.files_read) == (3, 0, 3)
    projected, _ = await dataset.scan(columns=["value", "ts"])
    assert projected.column_names == ["value", "ts"]
    assert projected.num_rows == 25
    windows, _ = await dataset.scan("rollup_1m")
    assert windows.schema.equals(ROLLUP_1M_SCHEMA) and windows.num_rows == 1


async def test_time_range_prunes_by_partition(dataset: Dataset) -> None:
    start = hour_start(hour_at(1))
    table, stats = await dataset.scan(start=start, end=start + timedelta(hours=1))
    assert table.num_rows == 10 and set(table.column("metric").to_pylist()) == {"mem"}
    assert (stats.files_pruned, stats.files_read) == (2, 1)
    table, stats = await dataset.scan(
        start=start + timedelta(seconds=5), end=start + timedelta(seconds=7)
    )
    assert table.column("seq").to_pylist() == [15, 16]
    assert stats.files_read == 1


async def test_predicates_prune_by_min_max_and_filter_rows(dataset: Dataset) -> None:
    table, stats = await dataset.scan(where=[parse_predicate("metric = mem", POINTS_SCHEMA)])
    assert table.num_rows == 10 and stats.files_read == 1
    table, stats = await dataset.scan(where=[parse_predicate("seq >= 25", POINTS_SCHEMA)])
    assert sorted(table.column("seq").to_pylist()) == list(range(25, 30))
    assert stats.files_read == 1
    _, stats = await dataset.scan(
        where=[parse_predicate("ts >= '2026-11-21T11:00:05Z'", POINTS_SCHEMA)]
    )
    assert stats.files_pruned == 1  # hour 10 cannot match
    # The NaN file has no value statistics, so it is read; the other two are pruned.
    table, stats = await dataset.scan(where=[parse_predicate("value > 1000", POINTS_SCHEMA)])
    assert table.num_rows == 0 and stats.files_read == 1
    assert table.schema.equals(POINTS_SCHEMA)
    table, stats = await dataset.scan(
        columns=["seq"],
        where=[parse_predicate("metric != cpu", POINTS_SCHEMA), Predicate("seq", "<", 12)],
    )
    assert table.column_names == ["seq"] and table.column("seq").to_pylist() == [10, 11]
    assert stats.files_read == 1


async def test_version_travel(dataset: Dataset) -> None:
    latest, _ = await dataset.scan(start=hour_start(hour_at(0)), end=hour_start(hour_at(1)))
    old, _ = await dataset.scan(version=1, start=hour_start(hour_at(0)), end=hour_start(hour_at(1)))
    assert latest.column("value").to_pylist() == [100.0 + i for i in range(5)]
    assert old.column("value").to_pylist() == [float(i) for i in range(10)]


async def test_duckdb_reads_the_files_as_they_are_and_agrees(dataset: Dataset) -> None:
    snapshot = dataset.v2.snapshot
    paths = [f"{dataset.root}/{f.path}" for f in snapshot.data_files("points")]
    ours, _ = await dataset.scan(where=[parse_predicate("value < 5", POINTS_SCHEMA)])
    connection = duckdb.connect()
    theirs = connection.sql(
        "SELECT ts, metric, labels, value, series, agent_id, boot_id, seq "
        "FROM read_parquet(?) WHERE value < 5 ORDER BY seq",
        params=[paths],
    ).to_arrow_table()
    assert theirs.num_rows == ours.num_rows == 9  # NaN matches in neither
    assert theirs.column("seq").to_pylist() == sorted(ours.column("seq").to_pylist())
    assert theirs.column("ts").to_pylist() == ours.sort_by("seq").column("ts").to_pylist()
    labels = connection.sql(
        "SELECT labels['host'] FROM read_parquet(?) WHERE metric = 'cpu' AND seq = 20",
        params=[paths],
    ).fetchall()
    assert labels in ([("b",)], [(["b"],)])
    (total,) = connection.sql("SELECT count(*) FROM read_parquet(?)", params=[paths]).fetchall()[0]
    assert total == sum(f.row_count for f in snapshot.data_files("points")) == 25


async def test_an_empty_dataset_and_bad_requests(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path / "s")
    fs = pafs.LocalFileSystem()
    empty = await scan(store, "points", filesystem=fs, root=str(tmp_path / "s"), columns=["ts"])
    assert empty.num_rows == 0 and empty.column_names == ["ts"]
    with pytest.raises(KeyError, match="unknown table"):
        await scan(store, "nope", filesystem=fs, root=str(tmp_path))
    with pytest.raises(ValueError, match="no column"):
        reader.read_files([], "points", fs, "", columns=["nope"])
    for bad, problem in [
        ("value", "not 'column op value'"),
        ("nope = 1", "no column"),
        ("seq = x", "invalid literal"),
        ("labels = x", "cannot compare"),
        ("ts > yesterday", "RFC 3339"),
    ]:
        with pytest.raises(ValueError, match=problem):
            parse_predicate(bad, POINTS_SCHEMA)
    with pytest.raises(ValueError, match="unknown operator"):
        Predicate("seq", "~", 1)


async def test_plan_files_is_pure_and_ordered(dataset: Dataset) -> None:
    snapshot = dataset.v2.snapshot
    planned = plan_files(snapshot, "points")
    assert [f.partition for f in planned] == [hour_at(0), hour_at(1), hour_at(2)]
    assert plan_files(snapshot, "points", where=[Predicate("seq", "=", 10**9)]) == []


def test_query_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.rollup.test_verify import run_cli

    async def build() -> None:
        store = FileSystemStore(tmp_path, clock=ManualClock())
        await Dataset(store, str(tmp_path)).build()
        await store.close()

    asyncio.run(build())
    capsys.readouterr()
    assert (
        run_cli(
            tmp_path,
            "query",
            "points",
            "--where",
            "metric = mem",
            "--where",
            "seq < 12",
            "--columns",
            "seq,ts,labels",
            "--format",
            "csv",
        )
        == 0
    )
    assert capsys.readouterr().out.splitlines() == [
        "seq,ts,labels",
        "10,2026-11-21T11:00:00Z,",
        "11,2026-11-21T11:00:01Z,",
    ]
    assert (
        run_cli(
            tmp_path,
            "query",
            "points",
            "--from",
            "2026-11-21T12:00:00Z",
            "--to",
            "2026-11-21T12:00:02Z",
            "--format",
            "json",
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["seq"] for r in rows] == [20, 21] and rows[0]["labels"] == {"host": "b"}
    assert rows[0]["series"] == 'cpu{host="b"}'
    assert run_cli(tmp_path, "query", "rollup_1m", "--version", "1", "--limit", "1") == 0
    table_lines = capsys.readouterr().out.splitlines()
    assert (
        table_lines[0].split()[:3] == ["window_start", "series", "metric"] and len(table_lines) == 2
    )
    assert run_cli(tmp_path, "query", "points", "--where", "nope = 1") == 2
    assert "no column" in capsys.readouterr().err


def test_table_output_rounds_float_noise_but_csv_and_json_keep_every_digit() -> None:
    import io

    from rollup.read.render import render

    rows = [{"sum": 157.18099999999998, "count": 3}]
    outputs = {}
    for fmt in ("table", "csv", "json"):
        out = io.StringIO()
        render(rows, ["sum", "count"], fmt, out)
        outputs[fmt] = out.getvalue()
    assert outputs["table"].splitlines()[1].split() == ["157.181", "3"]
    assert "157.18099999999998" in outputs["csv"]
    assert json.loads(outputs["json"])[0]["sum"] == 157.18099999999998
