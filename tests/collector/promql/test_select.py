"""`collector.promql.select` directly over the read world's snapshot and window: the
series model against the per-sample oracle, the metric bounds pushed down to files and
row groups, max_read_samples counted before anything is cut, and queries that select
nothing (no matchers, an empty range)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from collector.promql.matchers import compile_matcher
from collector.promql.select import (
    ReadQuery,
    SeriesCache,
    TooManySamples,
    resolve_series,
    select_series,
)
from collector.query.points_scan import MetricBounds
from config.tokens import Principal

from .read_world import ALL, H0, H1, Matcher, World, bits, make_world, oracle

START_MS, END_MS = H0.start_ns // 1_000_000, H1.start_ns // 1_000_000
READER = Principal(name="reader", token_sha256="0" * 64, read=True)


def read(world: World, parts: tuple[Any, Any], matchers: list[Matcher], **kwargs: int) -> Any:
    snapshot, frames = parts
    filesystem, root = world.endpoint._arrow()
    query = ReadQuery(
        kwargs.pop("start_ms", START_MS),
        kwargs.pop("end_ms", END_MS),
        tuple(compile_matcher(*m) for m in matchers),
    )
    return select_series(
        query, snapshot, frames, filesystem, root, max_samples=kwargs.pop("max_samples", 10_000)
    )


def answer(selection: Any) -> list[Any]:
    columns = selection.columns
    out = []
    for i, label_set in enumerate(columns.label_sets):
        a, b = int(columns.offsets[i]), int(columns.offsets[i + 1])
        ts = columns.timestamps_ms[a:b].tolist()
        out.append(
            (label_set, [(t, bits(v)) for t, v in zip(ts, columns.values[a:b], strict=True)])
        )
    return out


@pytest.mark.parametrize("series", [False, True], ids=["points-only", "series-index"])
async def test_selection_equals_the_oracle_and_pushes_metric_bounds_down(
    tmp_path: Path, series: bool
) -> None:
    # 1,013 committed rows in 11 row groups; with or without the hour's series index.
    world = await make_world(tmp_path, fill=1000, series=series)
    parts = await world.endpoint._parts(READER)
    for matchers in (
        [("RE", "__name__", ".+")],
        [("EQ", "__name__", "cpu")],
        [("EQ", "__name__", "http_server_duration")],
        [("RE", "__name__", "fill|temp"), ("NEQ", "a_b", "zzz")],
    ):
        selection = read(world, parts, matchers)
        assert answer(selection) == oracle(world.batches, matchers, START_MS, END_MS), matchers
        columns = selection.columns
        for i in range(len(columns.label_sets)):
            ts = columns.timestamps_ms[columns.offsets[i] : columns.offsets[i + 1]]
            assert (ts[1:] > ts[:-1]).all()  # strictly increasing within a series
    # "fill" rows sit in their own row groups (the file is sorted by series): a cpu read
    # skips them by the row groups' metric statistics.
    cpu = read(world, parts, [("EQ", "__name__", "cpu")])
    work = cpu.work
    assert work.row_groups_skipped >= 9 and work.row_groups_read <= 2
    assert work.index_files == (1 if series else 0)
    everything = read(world, parts, [("RE", "__name__", ".+")]).work
    assert everything.row_groups_read == 11 and everything.row_groups_skipped == 0
    assert everything.label_maps_read == 2  # only where a series starts: fill's 9 groups reuse


async def test_known_series_skip_their_label_maps(tmp_path: Path) -> None:
    world = await make_world(tmp_path, fill=1000)
    snapshot, frames = await world.endpoint._parts(READER)
    filesystem, root = world.endpoint._arrow()
    cache = SeriesCache()
    everything = [("RE", "__name__", ".+")]
    query = ReadQuery(START_MS, END_MS, tuple(compile_matcher(*m) for m in everything))
    works = []
    for _ in range(2):
        selection = select_series(
            query, snapshot, frames, filesystem, root, max_samples=10_000, cache=cache
        )
        assert answer(selection) == oracle(world.batches, everything, START_MS, END_MS)
        works.append(selection.work)
    assert works[0].label_maps_read == 2 and works[1].label_maps_read == 0
    assert len(cache) == 7  # every stored series read: 6 committed (fill too), live mem


def test_resolve_series_bounds() -> None:
    def bounds(value: str) -> MetricBounds:
        return resolve_series([compile_matcher("EQ", "__name__", value)])

    assert bounds("cpu") == MetricBounds(exact="cpu")
    assert bounds("http_server_duration") == MetricBounds(low="http", high="htt" + "q")
    assert bounds("_1abc") == MetricBounds()  # a digit-prefixed name: no bound
    assert resolve_series([compile_matcher("RE", "__name__", "cpu")]) == MetricBounds()
    # Every stored name presenting as the wanted one is within its bounds.
    for stored in ("http.server_duration", "http-server.duration", "http_server_duration"):
        found = bounds("http_server_duration")
        assert found.low is not None and found.high is not None
        assert found.low <= stored < found.high


async def test_max_read_samples_and_empty_queries(world_path: Path) -> None:
    world = await make_world(world_path)
    parts = await world.endpoint._parts(READER)
    everything = [("RE", "__name__", ".+")]
    total = sum(len(s) for _, s in oracle(ALL, everything, START_MS, END_MS))
    with pytest.raises(TooManySamples) as caught:
        read(world, parts, everything, max_samples=total - 1)
    assert caught.value.limit == total - 1
    # The rows counted include the ties merged at one millisecond: never fewer.
    assert read(world, parts, everything, max_samples=total + 4).columns.sample_count == total
    assert read(world, parts, []).columns.sample_count == 0
    empty_range = read(world, parts, everything, start_ms=END_MS, end_ms=START_MS)
    assert empty_range.columns.sample_count == 0


@pytest.fixture
def world_path(tmp_path: Path) -> Path:
    return tmp_path
