"""PromQL through the collector's forward with the real Prometheus 2.42 as engine
(PROTOCOL §5): one supervised engine for the module, reading from a stand-in remote-read
server (`standin_read`) that can answer, refuse (429, 400), stall past the engine's
``remote_timeout`` or send garbage.

The failure cases of issue 32: a failed read is never an empty answer — ``absent(x)``
through our API is 503/422, never 1 — and an engine killed mid-run is 503, then answers
again after the supervised restart (polled with a bounded deadline, no sleeps).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from collector.auth import Authenticator
from collector.promql.engine import SupervisedEngine
from collector.promql.forward import EngineReadReport, PromqlForward
from config.query_settings import PromqlSettings, QuerySettings
from config.tokens import Principal, TokenTable, hash_token
from tests.prometheus_binary import require_prometheus

from .standin_read import StandinRead

pytestmark = pytest.mark.asyncio(loop_scope="module")

READER, WRITER = "reader-token", "writer-token"
TOKENS = TokenTable(
    [
        Principal(name="reader", token_sha256=hash_token(READER), read=True),
        Principal(name="writer", token_sha256=hash_token(WRITER), agents=("*",)),
    ]
)
MAX_PROMQL = 2
T0_MS = 1_700_000_000_000
SERIES = [
    ((("__name__", "x"), ("job", "a")), tuple((T0_MS + i * 15_000, float(i)) for i in range(20))),
    ((("__name__", "x"), ("job", "b")), tuple((T0_MS + i * 15_000, 2.0 * i) for i in range(20))),
]
AT = str((T0_MS + 10 * 15_000) / 1000)


@dataclass
class Rig:
    url: str
    standin: StandinRead
    engine: SupervisedEngine
    forward: PromqlForward
    session: aiohttp.ClientSession
    engine_token: str

    async def get(
        self, path: str, token: str | None = READER, **params: str
    ) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.session.get(self.url + path, params=params, headers=headers) as r:
            return r.status, await r.json()

    async def post(
        self, path: str, token: str = READER, **params: str
    ) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {token}"}
        async with self.session.post(self.url + path, data=params, headers=headers) as r:
            return r.status, await r.json()


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    binary = Path(require_prometheus())
    authenticator = Authenticator(TOKENS)
    standin = StandinRead(token=authenticator.engine_read.token, series=list(SERIES), slow_s=2.0)
    read_runner, read_url = await _serve(standin.app())
    settings = QuerySettings(
        max_concurrent_promql=MAX_PROMQL,
        promql=PromqlSettings(
            prometheus=binary,
            credentials_dir=tmp_path_factory.mktemp("engine"),
            remote_timeout_s=0.5,
            query_timeout_s=3.0,
            forward_timeout_s=5.0,
        ),
    )
    engine = SupervisedEngine(
        binary=binary,
        settings=settings.promql,
        max_concurrency=MAX_PROMQL,
        read_token=authenticator.engine_read,
    )
    forward = PromqlForward(authenticator=authenticator, settings=settings, engine=engine)
    app = web.Application()
    forward.add_routes(app)
    runner, url = await _serve(app)
    await engine.start(read_url + "/api/v1/read")
    await engine.wait_ready(30)
    async with aiohttp.ClientSession() as session:
        yield Rig(url, standin, engine, forward, session, authenticator.engine_read.token)
    await runner.cleanup()
    await engine.stop()
    await read_runner.cleanup()


@pytest.fixture(autouse=True)
def _standin_answers(rig: Rig) -> None:
    rig.standin.mode = "ok"
    rig.forward.reads = None


async def test_query_is_answered_by_the_engine_through_remote_read(rig: Rig) -> None:
    reads_before = len(rig.standin.reads)
    status, body = await rig.get("/api/v1/query", query="sum(x)", time=AT)
    assert (status, body["status"]) == (200, "success"), body
    assert body["data"]["result"][0]["value"] == [float(AT), "30"]  # 10 + 20
    assert "warnings" not in body
    assert rig.standin.reads[reads_before:] == ["ok"]
    status, body = await rig.post(
        "/api/v1/query_range", query="x", start=AT, end=str(float(AT) + 60), step="15"
    )
    assert status == 200, body
    assert {s["metric"]["job"] for s in body["data"]["result"]} == {"a", "b"}
    assert [v[1] for v in body["data"]["result"][0]["values"]] == ["10", "11", "12", "13", "14"]
    status, body = await rig.get("/api/v1/query", query="absent(x)", time=AT)
    assert (status, body["data"]["result"]) == (200, [])


@pytest.mark.parametrize(
    ("mode", "status", "error_type", "quoted"),
    [
        ("429", 503, "unavailable", "returned HTTP status 429 Too Many Requests"),
        ("400", 422, "execution", "returned HTTP status 400 Bad Request: read past query.max_read"),
        ("slow", 503, "unavailable", "context deadline exceeded"),  # the engine's remote_timeout
        ("garbage", 503, "unavailable", "error reading response"),
    ],
)
async def test_a_failed_read_is_an_error_never_an_empty_answer(
    rig: Rig, mode: str, status: int, error_type: str, quoted: str
) -> None:
    rig.standin.mode = mode
    queries = ("absent(x)",) if mode == "slow" else ("absent(x)", "x", "count(x) or vector(0)")
    for query in queries:
        got, body = await rig.get("/api/v1/query", query=query, time=AT)
        assert (got, body["status"], body["errorType"]) == (status, "error", error_type), body
        assert body["error"].startswith("remote_read: ") and quoted in body["error"], body
    got, body = await rig.post(
        "/api/v1/query_range", query="absent(x)", start=AT, end=str(float(AT) + 30), step="15"
    )
    assert (got, body["errorType"]) == (status, error_type), body


async def test_a_warning_matched_to_a_failed_read_is_an_error_and_gaps_are_partial(
    rig: Rig,
) -> None:
    class Reads:
        report_value = EngineReadReport()

        def begin(self) -> int:
            return 7

        def report(self, mark: int) -> EngineReadReport:
            assert mark == 7
            return self.report_value

    reads = Reads()
    rig.forward.reads = reads
    reads.report_value = EngineReadReport(gaps=("a designated follower behind the log",))
    status, body = await rig.get("/api/v1/query", query="sum(x)", time=AT)
    assert status == 200 and body["data"]["result"][0]["value"][1] == "30"
    assert body["warnings"] == ["partial: a designated follower behind the log"]
    # A read this collector refused for a limit while the request ran: the engine's
    # warning (whatever its text) is 422, not a success.
    reads.report_value = EngineReadReport(refused_for_limit=("max_read_samples",))
    rig.standin.mode = "429"
    status, body = await rig.get("/api/v1/query", query="absent(x)", time=AT)
    assert (status, body["errorType"]) == (422, "execution"), body


async def test_tokens_are_checked_before_anything(rig: Rig) -> None:
    reads_before = len(rig.standin.reads)
    status, body = await rig.get("/api/v1/query", token=None, query="x")
    assert (status, body["status"], body["errorType"]) == (401, "error", "unauthorized")
    status, body = await rig.get("/api/v1/query", token="not-a-token", query="x")
    assert status == 401
    status, body = await rig.post("/api/v1/query_range", token=WRITER, query="x")
    assert (status, body["errorType"]) == (403, "forbidden")
    # The engine's internal token is valid only for POST /api/v1/read.
    status, body = await rig.get("/api/v1/query", token=rig.engine_token, query="x")
    assert status == 403
    assert rig.standin.reads[reads_before:] == []  # nothing reached the engine


async def test_past_max_concurrent_promql_is_429_while_engine_reads_go_on(rig: Rig) -> None:
    rig.standin.mode = "hold"
    rig.standin.hold = asyncio.Event()
    rig.standin.held.clear()
    reads_before = len(rig.standin.reads)
    held = [
        asyncio.create_task(rig.get("/api/v1/query", query=f"sum(x) + {i}", time=AT))
        for i in range(MAX_PROMQL)
    ]
    deadline = time.monotonic() + 10
    while len(rig.standin.held) < MAX_PROMQL:  # both forwarded queries are reading
        assert time.monotonic() < deadline, "the engine's reads did not arrive"
        await asyncio.sleep(0.01)
    async with rig.session.get(
        rig.url + "/api/v1/query",
        params={"query": "x"},
        headers={"Authorization": f"Bearer {READER}"},
    ) as r:
        assert r.status == 429
        assert r.headers["Retry-After"] == "1"
        body = await r.json()
    assert body["status"] == "error" and body["errorType"] == "unavailable"
    assert "query.max_concurrent_promql = 2" in body["error"]
    rig.standin.hold.set()
    answers = await asyncio.gather(*held)
    assert [(s, b["data"]["result"][0]["value"][1]) for s, b in answers] == [
        (200, "30"),
        (200, "31"),
    ]
    assert rig.standin.reads[reads_before:] == ["ok", "ok"]  # none refused


async def test_caller_timeout_is_capped_by_the_engine_timeout(rig: Rig) -> None:
    status, body = await rig.get("/api/v1/query", query="sum(x)", time=AT, timeout="1h")
    assert status == 200, body
    status, body = await rig.get("/api/v1/query", query="sum(x)", time=AT, timeout="nonsense")
    assert (status, body["errorType"]) == (400, "bad_data")  # the engine's own answer


async def test_engine_killed_is_503_then_answers_after_restart(rig: Rig) -> None:
    pid = rig.engine.pid
    assert pid is not None
    starts = rig.engine.starts
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    status, body = await rig.get("/api/v1/query", query="sum(x)", time=AT)
    while status != 503:  # the supervisor notices the exit within the pidfd wake-up
        assert time.monotonic() < deadline, body
        status, body = await rig.get("/api/v1/query", query="sum(x)", time=AT)
    assert body["errorType"] == "unavailable"
    deadline = time.monotonic() + 20  # backoff 1-1.25 s, then a start of ~0.2 s
    while status != 200:
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.05)
        status, body = await rig.get("/api/v1/query", query="sum(x)", time=AT)
    assert body["data"]["result"][0]["value"][1] == "30"
    assert rig.engine.starts == starts + 1 and rig.engine.pid not in (None, pid)
