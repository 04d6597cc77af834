"""The PromQL benchmark's fixture writer (`bench.promql.fixture`): one committed hour of
the fleet (1,000 series at 15 s) reads back through ``POST /api/v1/read`` (real HTTP to
the app in this process) as exactly the fleet's samples, and the OpenMetrics text the
reference is backfilled from says the same samples."""

from __future__ import annotations

from pathlib import Path

import cramjam
import numpy as np
import pyarrow as pa

from bench.promql import fixture
from bench.promql.fleet import T_END_S, hour_rows, make_fleet
from collector.auth import Authenticator
from collector.metrics import CollectorMetrics
from collector.promql.proto import read_pb2
from collector.promql.read_endpoint import PATH, ReadEndpoint
from collector.query.committed import SnapshotSource
from config.settings import QuerySettings
from rollup.table.storage import arrow_filesystem
from store.fs import FileSystemStore
from tests.collector.inprocess import in_process_collector
from tests.collector.promql.read_client import body, post, query
from tests.collector.promql.read_world import READ_TOKEN, TOKENS

HOUR_S = T_END_S - 3600


async def test_a_committed_hour_reads_back_as_the_fleet(tmp_path: Path) -> None:
    fleet = make_fleet()
    written = await fixture.write_store(
        tmp_path / "store", fleet, HOUR_S, sparse_before_s=HOUR_S, sparse_step_s=300
    )
    assert written == {"samples": 240_000, "files": 2}  # points and series, no whole day
    store = FileSystemStore(tmp_path / "store")
    endpoint = ReadEndpoint(
        authenticator=Authenticator(TOKENS),
        settings=QuerySettings(),
        snapshots=SnapshotSource(store, refresh_interval_s=0.0, max_travel_versions=10),
        filesystem=lambda: arrow_filesystem(store.url),
        metrics=CollectorMetrics(),
        now_ns=lambda: T_END_S * 1_000_000_000,
    )
    request = body([query([("RE", "__name__", ".+")], HOUR_S * 1000, T_END_S * 1000)])
    async with in_process_collector(remote_read=endpoint) as collector:
        status, _, payload = await post(collector.base_url + PATH, request, token=READ_TOKEN)
    assert status == 200, payload[:300]
    answer = read_pb2.ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(payload)))
    got = {
        tuple((label.name, label.value) for label in series.labels): series
        for series in answer.results[0].timeseries
    }
    assert len(got) == fleet.size
    rows = hour_rows(fleet, HOUR_S, sparse_step_s=None)
    values = fleet.values(rows.index, rows.k)
    for i in (0, 1, 499, 998, 999):
        labels = tuple(sorted({"__name__": fleet.metric[i], **fleet.labels[i]}.items()))
        series = got[labels]
        mine = rows.index == i
        assert [s.timestamp for s in series.samples] == (rows.ts_s[mine] * 1000).tolist()
        assert np.array_equal([s.value for s in series.samples], values[mine])


def test_the_openmetrics_text_holds_the_same_samples(tmp_path: Path) -> None:
    fleet = make_fleet()
    rows = hour_rows(fleet, HOUR_S, sparse_step_s=300)
    text = fixture.hour_text(fleet, pa.array([p + " " for p in fleet.prefixes()]), rows)
    lines = bytes(text).decode().splitlines()
    assert len(lines) == len(rows.index) == 10 * 240 + 990 * 12
    values = fleet.values(rows.index, rows.k)
    for at in (0, 1, len(lines) // 2, len(lines) - 1):
        series, value, ts = lines[at].rsplit(" ", 2)
        assert series == fleet.prefixes()[rows.index[at]]
        assert (float(value), int(ts)) == (values[at], rows.ts_s[at])
