"""The names endpoints (PROTOCOL §5 "Names") through real HTTP: a committed snapshot's
``series`` rows (written as the rollup writes them: `rollup.table.series_rows`) plus the
live window's label sets (`read_world`: B1, B2 committed; B2, B3, B4 in the window).
Presented names, matchers, the range, limit, Prometheus' refusals and the ``partial:``
warning of a collector that follows only its own batches."""

from __future__ import annotations

import io
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from collector.auth import Authenticator
from collector.promql.names import PARTIAL_OWN, NamesEndpoint
from collector.query.committed import SnapshotSource
from collector.query.file_cache import FileCache
from collector.query.window import LiveWindow
from config.settings import QuerySettings
from protocol import keys
from protocol.clock import ManualClock
from rollup.table import series_rows
from rollup.table.commit import commit as commit_snapshot
from rollup.table.commit import load_latest
from rollup.table.data_file import describe_file
from rollup.table.manifest import Changes
from rollup.table.owner import OwnerLease
from rollup.table.points import points_rows
from rollup.table.storage import arrow_filesystem
from store.fs import FileSystemStore
from tests.rollup.test_reader import CountingHandler

from .read_world import COMMITTED, H0, H1, LIVE, NS, READ_TOKEN, TOKENS, WRITE_TOKEN

START, END = H0.start_ns // NS, H1.start_ns // NS + 3599


async def commit_series(store: FileSystemStore, clock: ManualClock) -> None:
    """A snapshot whose ``series`` file holds the committed batches' series of H0."""
    points = pa.concat_tables([points_rows(b.frame) for b in COMMITTED])
    rows = series_rows.series_table(series_rows.hour_counts(points))
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    base = await load_latest(store)
    key = keys.rollup_data_key("series", H0, str(uuid.uuid4()))
    sink = io.BytesIO()
    pq.write_table(rows, sink)
    await store.put(key, sink.getvalue())
    added = describe_file("series", key, H0, rows, size_bytes=len(sink.getvalue()), added_version=1)
    await commit_snapshot(
        store, base=base, changes=Changes(added_files=(added,)), owner=owner, clock=clock
    )
    await owner.release()


@asynccontextmanager
async def names_server(
    tmp_path: Path,
    *,
    window: bool = True,
    opened: CountingHandler | None = None,
    live: LiveWindow | None = None,
) -> AsyncIterator[str]:
    clock = ManualClock(H1.start_ns + 10 * NS)
    store = FileSystemStore(tmp_path / "store", clock=clock)
    await commit_series(store, clock)
    if live is None:
        live = LiveWindow(window_s=7200, max_points=1000, max_bytes=1 << 30)
        for b in LIVE:
            assert live.add(
                b.manifest_id, b.manifest.accepted_at_unix_ns, b.frame, now_ns=clock.now_ns()
            )

    def filesystem() -> tuple[pafs.FileSystem, str]:
        local, root = arrow_filesystem(store.url)
        return (local if opened is None else pafs.PyFileSystem(opened)), root

    endpoint = NamesEndpoint(
        authenticator=Authenticator(TOKENS),
        settings=QuerySettings(),
        snapshots=SnapshotSource(
            store, refresh_interval_s=0.0, max_travel_versions=100, monotonic=clock.monotonic
        ),
        filesystem=filesystem,
        now_ns=clock.now_ns,
        window=live if window else None,
        file_cache=FileCache(64 << 20),
    )
    app = web.Application()
    endpoint.add_routes(app)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}/api/v1"
    finally:
        await server.close()


async def ask(
    url: str, *, token: str | None = READ_TOKEN, post: bool = False, **params: Any
) -> tuple[int, dict[str, Any]]:
    query = [
        (("match[]" if k == "match" else k), v)
        for k, vs in params.items()
        for v in (vs if isinstance(vs, list) else [vs])
    ]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session:
        if post:
            answer = await session.post(url, data=query, headers=headers)
        else:
            answer = await session.get(url, params=query, headers=headers)
        async with answer:
            return answer.status, await answer.json()


@pytest.fixture
async def url(tmp_path: Path) -> AsyncIterator[str]:
    async with names_server(tmp_path) as base:
        yield base


async def test_names_of_the_committed_and_the_live_part(url: str) -> None:
    status, body = await ask(f"{url}/label/__name__/values", start=START, end=END)
    assert status == 200 and body["status"] == "success"
    # "mem" is only in the live part (B3); http.server.duration and http_server_duration
    # present one name; temp's a.b is dropped for a_b.
    assert body["data"] == ["cpu", "http_server_duration", "mem", "temp"]
    assert body["warnings"] == [PARTIAL_OWN]
    status, body = await ask(f"{url}/labels", start=START, end=END, post=True)
    assert status == 200 and body["data"] == ["__name__", "a_b", "host", "le"]
    status, body = await ask(
        f"{url}/label/host/values", start=START, end=END, match='{__name__="mem"}'
    )
    assert body["data"] == ["a"]
    status, body = await ask(
        f"{url}/series", start=START, end=END, match=["cpu", '{__name__=~"t.*"}']
    )
    assert status == 200
    assert body["data"] == [
        {"__name__": "cpu", "host": "a"},
        {"__name__": "cpu", "host": "b"},
        {"__name__": "temp", "a_b": "y"},
    ]
    status, body = await ask(f"{url}/series", start=START, end=END, match='{host=~".+"}', limit=2)
    assert len(body["data"]) == 2 and "results truncated due to limit" in body["warnings"]


async def test_a_range_outside_the_data_lists_nothing(url: str) -> None:
    earlier = START - 7 * 86_400
    status, body = await ask(f"{url}/label/__name__/values", start=earlier, end=earlier + 3600)
    assert status == 200 and body["data"] == []


@pytest.mark.parametrize(
    ("path", "params", "words"),
    [
        ("series", {}, "no match[]"),
        ("series", {"match": '{job=~".*"}'}, "non-empty matcher"),
        ("labels", {"match": "up{"}, "match[]"),
        ("labels", {"start": 0, "end": 40_000_000}, "names_max_range_s"),
        ("label/1bad/values", {}, "invalid label name"),
        ("labels", {"match": '{a=~"(b"}'}, "invalid regex"),
    ],
)
async def test_bad_requests_are_400_bad_data(
    url: str, path: str, params: dict[str, Any], words: str
) -> None:
    status, body = await ask(f"{url}/{path}", **params)
    assert status == 400, body
    assert body["status"] == "error" and body["errorType"] == "bad_data"
    assert words in body["error"]


async def test_tokens_first_and_the_fixed_answers(url: str) -> None:
    status, body = await ask(f"{url}/labels", token=None)
    assert status == 401 and body["status"] == "error"
    status, body = await ask(f"{url}/labels", token=WRITE_TOKEN)
    assert status == 403
    assert await ask(f"{url}/metadata") == (200, {"status": "success", "data": {}})
    assert await ask(f"{url}/query_exemplars", query="up") == (
        200,
        {"status": "success", "data": []},
    )
    status, body = await ask(f"{url}/status/buildinfo")
    assert status == 503 and body["errorType"] == "unavailable"  # no engine here


async def test_committed_names_alone_say_partial(tmp_path: Path) -> None:
    async with names_server(tmp_path, window=False) as base:
        status, body = await ask(f"{base}/label/__name__/values", start=START, end=END)
    assert status == 200 and body["data"] == ["cpu", "http_server_duration", "temp"]
    assert body["warnings"][0].startswith("partial:")


async def test_a_repeated_listing_reads_no_file_and_keeps_the_live_part(tmp_path: Path) -> None:
    opened = CountingHandler()
    live = LiveWindow(window_s=7200, max_points=1000, max_bytes=1 << 30)
    clock_ns = H1.start_ns + 10 * NS
    async with names_server(tmp_path, opened=opened, live=live) as base:
        status, body = await ask(f"{base}/label/__name__/values", start=START, end=END)
        assert status == 200 and body["data"] == ["cpu", "http_server_duration", "temp"]
        assert sum(opened.opened.values()) == 1  # the hour's series file
        opened.opened.clear()
        for b in LIVE:  # batches arrive: the cached index rows are merged with them
            assert live.add(b.manifest_id, b.manifest.accepted_at_unix_ns, b.frame, now_ns=clock_ns)
        status, body = await ask(f"{base}/label/__name__/values", start=START, end=END)
        assert body["data"] == ["cpu", "http_server_duration", "mem", "temp"]
        status, body = await ask(f"{base}/labels", start=START, end=END)
        assert body["data"] == ["__name__", "a_b", "host", "le"]
        assert sum(opened.opened.values()) == 0  # nothing read again
