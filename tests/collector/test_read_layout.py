"""The read path's layout (issue 32 item 4, PROTOCOL §5 "Matchers", "Cost and scale"):
matchers resolved against the ``series`` index first (`collector.query.series_first`),
then only the ``points`` row groups of the selected stored series read
(`collector.query.points_scan`, the row groups counted); hours without the index read
as before; snapshot files and footers cached within ``query.cache_bytes``
(`collector.query.file_cache`: a repeated read opens no file, the bound holds); and the
store requests of the same 1 h read equal at 1 day and at 30 days of history.

Histories are committed directly (`tests.collector.read_history`, no Spark); file opens
are counted by a counting pyarrow filesystem, store requests by `store.counting`."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pytest

from collector.auth import Authenticator
from collector.metrics import CollectorMetrics
from collector.promql.matchers import compile_matcher
from collector.promql.read_endpoint import ReadEndpoint
from collector.promql.select import ReadQuery, Selection, select_series
from collector.query.committed import SnapshotSource
from collector.query.file_cache import FileCache
from collector.query.points_scan import MetricBounds, ScanWork, committed_parts
from collector.query.series_first import resolve_stored_series
from collector.query.window import LiveWindow
from config import Principal, TokenTable
from config.settings import QuerySettings
from protocol import keys
from protocol.clock import ManualClock
from rollup.table.commit import load_latest
from rollup.table.manifest import Snapshot
from rollup.table.series_rows import hour_counts, series_table
from store.counting import CountingStore
from store.fs import FileSystemStore
from tests.rollup.test_reader import CountingHandler

from .read_history import NS, Hour, commit_hours, hour_points, shifted

H0 = keys.UtcHour.from_unix_ns(1_795_000_000 * NS)
H1, H2 = H0.next(), H0.next().next()
HOSTS = [f"h{i:04d}" for i in range(400)]
PER_SERIES = 25  # 10,000 rows an hour: 20 row groups of 500
GROUP = 500
READER = Principal(name="reader", token_sha256="0" * 64, read=True)


def ms(hour: keys.UtcHour) -> int:
    return hour.start_ns // 1_000_000


async def many_series(tmp_path: Path) -> tuple[FileSystemStore, Snapshot]:
    """H0 indexed; H1 committed before the index (no series file); H2 an old file and
    a late batch's file with only the late batch's series rows (the index does not count
    the hour's rows: read as before)."""
    clock = ManualClock(H2.next().start_ns + 60 * NS)
    store = FileSystemStore(tmp_path / "store", clock=clock)
    late = hour_points(H2, ["late"], 5)
    indexed = hour_points(H0, HOSTS, PER_SERIES)
    await commit_hours(
        store,
        clock,
        [
            Hour(H0, [indexed], indexed=[indexed]),
            Hour(H1, [hour_points(H1, HOSTS, PER_SERIES)]),
            Hour(H2, [hour_points(H2, HOSTS, PER_SERIES), late], indexed=[late]),
        ],
        row_group_size=GROUP,
    )
    loaded = await load_latest(store)
    assert loaded is not None
    return store, loaded.snapshot


def select(
    store: FileSystemStore,
    snapshot: Snapshot,
    matchers: list[tuple[str, str, str]],
    start: keys.UtcHour,
    end: keys.UtcHour,
    *,
    filesystem: pafs.FileSystem | None = None,
    file_cache: FileCache | None = None,
) -> Selection:
    query = ReadQuery(ms(start), ms(end) - 1, tuple(compile_matcher(*m) for m in matchers))
    return select_series(
        query,
        snapshot,
        [],
        filesystem or pafs.LocalFileSystem(),
        str(store.root),
        max_samples=1_000_000,
        file_cache=file_cache,
    )


def samples(selection: Selection) -> dict[str, int]:
    columns = selection.columns
    return {
        dict(s)["host"]: int(columns.offsets[i + 1] - columns.offsets[i])
        for i, s in enumerate(columns.label_sets)
    }


@pytest.fixture
async def world(tmp_path: Path) -> tuple[FileSystemStore, Snapshot]:
    return await many_series(tmp_path)


async def test_one_series_reads_few_row_groups_and_nothing_reads_none(world: Any) -> None:
    store, snapshot = world
    one = select(store, snapshot, [("EQ", "host", "h0123")], H0, H1)
    assert samples(one) == {"h0123": PER_SERIES}
    work = one.work
    assert work.index_files == 1
    assert work.row_groups_read <= 2 and work.row_groups_read + work.row_groups_skipped == 20
    regex = select(store, snapshot, [("RE", "host", "h000[0-9]|h0399")], H0, H1)
    assert samples(regex) == {h: PER_SERIES for h in [*HOSTS[:10], "h0399"]}
    assert regex.work.row_groups_read <= 3  # the first group and the last
    nothing = select(store, snapshot, [("EQ", "host", "nope")], H0, H1)
    assert samples(nothing) == {}
    assert nothing.work.row_groups_read == 0 and nothing.work.files == 0
    assert nothing.work.files_skipped == 1  # never opened


async def test_hours_the_index_does_not_count_are_read_as_before(world: Any) -> None:
    store, snapshot = world
    found = select(store, snapshot, [("EQ", "host", "h0123")], H0, H2.next())
    # H1 (no series file) and H2 (its series file holds only the late batch's series)
    # are read whole: the old points are there.
    assert samples(found) == {"h0123": 3 * PER_SERIES}
    assert found.work.row_groups_read <= 2 + 20 + 20 + 1
    assert found.work.row_groups_read >= 40
    late = select(store, snapshot, [("EQ", "host", "late")], H2, H2.next())
    assert samples(late) == {"late": 5}


async def test_a_file_the_range_prunes_still_counts_for_its_hour(tmp_path: Path) -> None:
    """A read from the middle of an hour whose first file holds only earlier points: the
    hour's index still counts both files' rows, so the index is used."""
    clock = ManualClock(H1.start_ns)
    store = FileSystemStore(tmp_path / "store", clock=clock)
    whole = hour_points(H0, HOSTS, 60)  # a point a minute
    ts = pc.cast(whole.column("ts"), pa.int64())
    early = whole.filter(pc.less(ts, (H0.start_ns + 600 * NS) // 1000))
    late = whole.filter(pc.greater_equal(ts, (H0.start_ns + 3000 * NS) // 1000))
    both = [early, late]
    await commit_hours(store, clock, [Hour(H0, both, indexed=both)], row_group_size=GROUP)
    loaded = await load_latest(store)
    assert loaded is not None
    matchers = (compile_matcher("EQ", "host", "h0123"),)
    query = ReadQuery(ms(H0) + 1_800_000, ms(H1) - 1, matchers)
    found = select_series(
        query, loaded.snapshot, [], pafs.LocalFileSystem(), str(store.root), max_samples=1000
    )
    assert samples(found) == {"h0123": 10}
    assert found.work.files == 1 and found.work.row_groups_read <= 2  # of 8


async def test_a_repeated_read_opens_no_file_and_the_cache_keeps_its_bound(world: Any) -> None:
    store, snapshot = world
    handler = CountingHandler()
    filesystem = pafs.PyFileSystem(handler)
    lookups: Counter[tuple[str, bool]] = Counter()
    cache = FileCache(64 << 20, on_lookup=lambda kind, hit: lookups.update([(kind, hit)]))
    matchers = [("RE", "host", "h01.*")]
    first = select(
        store, snapshot, matchers, H0, H2.next(), filesystem=filesystem, file_cache=cache
    )
    assert sum(handler.opened.values()) >= 4  # 3 points files and the index files
    handler.opened.clear()
    second = select(
        store, snapshot, matchers, H0, H2.next(), filesystem=filesystem, file_cache=cache
    )
    assert sum(handler.opened.values()) == 0  # zero store GETs
    assert samples(second) == samples(first) and len(samples(first)) == 100
    assert lookups[("row_group", True)] == second.work.row_groups_read + second.work.label_maps_read
    assert lookups[("footer", True)] == 4 and lookups[("file", True)] == 2
    # A small bound: entries are evicted least recently used first, never past it.
    small = FileCache(200_000)
    for host in ("h0001", "h0150", "h0300", "h0001"):
        found = select(store, snapshot, [("EQ", "host", host)], H0, H1, file_cache=small)
        assert samples(found) == {host: PER_SERIES}
        assert 0 < small.nbytes <= small.max_bytes


async def test_the_cache_keeps_the_rows_a_read_selects_not_whole_row_groups(
    world: Any,
) -> None:
    store, snapshot = world
    lookups: Counter[tuple[str, bool]] = Counter()
    cache = FileCache(64 << 20, on_lookup=lambda kind, hit: lookups.update([(kind, hit)]))
    first = select(store, snapshot, [("EQ", "host", "h0123")], H0, H1, file_cache=cache)
    assert samples(first) == {"h0123": PER_SERIES}
    # Selected rows are (rows, row numbers) entries (a whole group's label maps, read
    # once to learn the series, is a table).
    kept = [value for value, _ in cache._entries.values() if isinstance(value, tuple)]
    assert kept and sum(rows.num_rows for rows, _ in kept) == PER_SERIES  # of 500 a group
    # The same series over half the hour: served from those rows, nothing decoded.
    query = ReadQuery(ms(H0), ms(H0) + 1_800_000 - 1, (compile_matcher("EQ", "host", "h0123"),))
    handler = CountingHandler()
    half = select_series(
        query,
        snapshot,
        [],
        pafs.PyFileSystem(handler),
        str(store.root),
        max_samples=100,
        file_cache=cache,
    )
    assert 0 < samples(half)["h0123"] < PER_SERIES
    assert sum(handler.opened.values()) == 0
    assert lookups[("row_group", False)] == first.work.row_groups_read + first.work.label_maps_read


async def test_files_read_ahead_on_threads_yield_what_one_at_a_time_does(world: Any) -> None:
    """``read_ahead`` (a remote store's files fetched at once): the same parts in the
    same order, the same work counted; a failing check stops the read."""
    store, snapshot = world

    def scan(
        read_ahead: int, check: Any = lambda: None
    ) -> tuple[list[Any], ScanWork, Counter[str]]:
        work = ScanWork()
        handler = CountingHandler()
        parts = committed_parts(
            snapshot,
            pafs.PyFileSystem(handler),
            str(store.root),
            low_us=ms(H0) * 1000,
            high_us=ms(H2.next()) * 1000,
            bounds=MetricBounds(),
            check=check,
            work=work,
            read_ahead=read_ahead,
        )
        rows = [
            (
                p.rows.column("series").to_pylist(),
                p.rows.column("ts").to_pylist(),
                p.metric_and_labels(np.array([0])).column("labels").to_pylist(),  # read now
            )
            for p in parts
        ]
        return rows, work, handler.opened

    one, one_work, one_opened = scan(1)
    ahead, ahead_work, ahead_opened = scan(4)
    assert one_work.files >= 3 and one == ahead
    # Label maps read while the part's file is still open: each file opened once.
    assert one_opened == ahead_opened and set(ahead_opened.values()) == {1}
    assert ahead_work.label_maps_read == one_work.label_maps_read == len(ahead)
    assert (one_work.files, one_work.row_groups_read, one_work.paths) == (
        ahead_work.files,
        ahead_work.row_groups_read,
        ahead_work.paths,
    )
    calls = Counter[str]()

    def failing() -> None:
        calls.update(["check"])
        if calls["check"] > 5:
            raise RuntimeError("client gone")

    with pytest.raises(RuntimeError, match="client gone"):
        scan(4, failing)


def test_the_cache_evicts_the_least_recently_used() -> None:
    cache = FileCache(800)  # entries up to 100 bytes
    for name in "abcdefgh":
        cache.put("file", name, name, 100)
    assert cache.nbytes == 800 and len(cache) == 8
    assert cache.get("file", "a") == "a"  # now the most recent
    cache.put("file", "i", "i", 100)
    assert cache.get("file", "b") is None and cache.get("file", "a") == "a"
    cache.put("file", "big", "x", 101)  # over an eighth of the bound: not kept
    assert cache.get("file", "big") is None and cache.nbytes == 800
    assert FileCache(0).max_entry_bytes == 0


async def read_requests(tmp_path: Path, days: int) -> tuple[int, int, dict[str, int]]:
    """(store requests, file opens, samples) of one cold 1 h remote read (its last full
    hour) over ``days`` of hourly history of 3 series, with the index and day files."""
    first = keys.UtcHour.from_unix_ns(1_795_000_000 * NS // (86_400 * NS) * 86_400 * NS)
    clock = ManualClock(first.start_ns + days * 86_400 * NS + 3600 * NS)
    store = FileSystemStore(tmp_path / f"store-{days}", clock=clock)
    points = hour_points(first, ["a", "b", "c"], 12)
    series = series_table(hour_counts(points))
    hours = []
    for index in range(days * 24):
        last = keys.UtcHour.from_unix_ns(first.start_ns + index * 3600 * NS)
        by_us = index * 3_600_000_000
        moved = shifted(points, by_us)
        hours.append(Hour(last, [moved], indexed=[moved], series=shifted(series, by_us)))
    await commit_hours(store, clock, hours, days=True)
    counting = CountingStore(store)
    handler = CountingHandler()
    endpoint = ReadEndpoint(
        authenticator=Authenticator(TokenTable([])),
        settings=QuerySettings(),
        snapshots=SnapshotSource(counting, refresh_interval_s=0.0, max_travel_versions=10),
        filesystem=lambda: (pafs.PyFileSystem(handler), str(store.root)),
        metrics=CollectorMetrics(),
        now_ns=clock.now_ns,
        window=LiveWindow(window_s=3600, max_points=1000, max_bytes=1 << 20),
    )
    counting.clear()
    snapshot, frames = await endpoint._parts(READER)
    matchers = tuple(compile_matcher(*m) for m in [("EQ", "__name__", "m"), ("EQ", "host", "b")])
    query = ReadQuery(ms(last), ms(last.next()) - 1, matchers)
    selection = await endpoint._select(0, query, snapshot, frames, threading.Event())
    found = len(counting.requests), sum(handler.opened.values()), samples(selection)
    # The whole history: the index is read a day file a day (series_day), not by hours.
    stored = resolve_stored_series(
        snapshot,
        pafs.LocalFileSystem(),
        str(store.root),
        low_us=0,  # wider than the history: clamped to its days, which stay whole
        high_us=last.next().start_ns // 1000 + 10 * 86_400_000_000,
        matchers=matchers,
        cache=FileCache(0),
    )
    assert stored is not None and stored.index_files == days
    assert stored.wanted == ('m{host="b"}',) and len(stored.indexed) == 24 * days
    return found


async def test_store_requests_of_a_1h_read_do_not_grow_with_history(tmp_path: Path) -> None:
    day = await read_requests(tmp_path, 1)
    month = await read_requests(tmp_path, 30)
    assert day == month == (2, 2, {"b": 12})  # pointer + manifest; series + points file
