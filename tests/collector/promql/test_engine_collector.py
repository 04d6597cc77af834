"""The whole chain in real processes (PROTOCOL §5): ``lm-collector serve`` with
``query.promql.prometheus`` supervises a real Prometheus 2.42 that reads the collector's
own ``POST /api/v1/read``; a PromQL query through the collector's API is answered from
the batch an agent sent, with the ``partial:`` warning of a collector that serves its
own batches only. ``query.max_concurrent_promql = 1``: the forwarded query holds
the only slot while the engine reads, and its reads (the internal principal, a pool of
their own) are served, not refused (no deadlock against its own engine). The internal
token is valid for remote read only. Stopping the collector ends its engine."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from config import hash_token
from protocol.frame_encode import encode_frame, points_table
from tests.collector.conftest import BOOT, CollectorLauncher, post_frame
from tests.prometheus_binary import require_prometheus

NS = 1_000_000_000
T0_S = 1_763_719_200  # 2025-11-21 10:00 UTC: a fixed time, never the clock's
READ, WRITE = "lm-test-read-token", "lm-test-write-token"


def _tokens(path: Path) -> Path:
    path.write_text(
        "[[principal]]\n"
        f'name = "writer"\ntoken_sha256 = "{hash_token(WRITE)}"\nagents = ["agent-*"]\n\n'
        "[[principal]]\n"
        f'name = "grafana"\ntoken_sha256 = "{hash_token(READ)}"\nagents = []\nread = true\n'
    )
    return path


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(c) for c in (task / "children").read_text().split())
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _query(
    session: aiohttp.ClientSession, url: str, token: str, **params: str
) -> tuple[int, Any]:
    async with session.get(
        url + "/api/v1/query", params=params, headers={"Authorization": f"Bearer {token}"}
    ) as response:
        return response.status, await response.json()


def test_promql_through_the_collector_and_its_supervised_engine(
    collectors: CollectorLauncher, tmp_path: Path
) -> None:
    binary = require_prometheus()
    engine_dir = tmp_path / "engine"
    collector = collectors.start(
        store_url=f"file://{tmp_path / 'store'}",
        env={
            "LM_AUTH__TOKENS_FILE": str(_tokens(tmp_path / "tokens.toml")),
            "LM_QUERY__OWN_BATCHES": "true",
            "LM_QUERY__MAX_CONCURRENT_PROMQL": "1",
            "LM_QUERY__PROMQL__PROMETHEUS": binary,
            "LM_QUERY__PROMQL__CREDENTIALS_DIR": str(engine_dir),
        },
    )
    engine_token = asyncio.run(_queries(collector.base_url, engine_dir / "read-token"))
    assert engine_token == (engine_dir / "read-token").read_text().strip()
    engines = _children(collector.pid)
    assert len(engines) == 1
    engine_pid = engines.pop()
    assert "prometheus" in Path(f"/proc/{engine_pid}/cmdline").read_text()
    collector.stop()
    deadline = time.monotonic() + 10
    while _alive(engine_pid):
        assert time.monotonic() < deadline, "the engine outlived a stopped collector"
        time.sleep(0.02)  # polling the process table, bounded by the deadline
    assert not (engine_dir / "read-token").exists()


async def _queries(url: str, token_file: Path) -> str:
    """Send a batch, query it through the engine; returns the engine's read token."""
    values = [1.0, 2.0, 4.0, 8.0]
    table = points_table(
        [(T0_S + 15 * i) * NS for i in range(len(values))],
        ["http.requests"] * len(values),
        values,
        [{"host": "h1"}] * len(values),
    )
    frame = encode_frame(agent_id="agent-1", boot_id=BOOT, seq_start=0, points=table)
    at = str(T0_S + 60)
    async with aiohttp.ClientSession() as session:
        sent = await post_frame(session, url, frame, token=WRITE)
        assert sent.status == 200, sent.text
        deadline = time.monotonic() + 30
        status, body = await _query(session, url, READ, query="1+1")
        while status != 200:  # the engine starts once the collector listens
            assert time.monotonic() < deadline and status == 503, body
            status, body = await _query(session, url, READ, query="1+1")
        query = "sum(count_over_time(http_requests[5m]))"
        status, body = await _query(session, url, READ, query=query, time=at)
        assert status == 200, body
        assert body["data"]["result"][0]["value"][1] == "4"  # the points the agent sent
        # A collector with own_batches serves its own batches only: a known gap, said
        # through the read outcomes of the engine's reads while the query ran.
        assert [w.split(":")[0] for w in body["warnings"]] == ["partial"], body
        status, body = await _query(session, url, READ, query="http_requests", time=at)
        assert body["data"]["result"] == [
            {"metric": {"__name__": "http_requests", "host": "h1"}, "value": [float(at), "8"]}
        ]
        status, body = await _query(session, url, READ, query="absent(http_requests)", time=at)
        assert (status, body["data"]["result"]) == (200, [])
        # The engine's token (in its credentials_file): remote read only.
        token = (await asyncio.to_thread(token_file.read_text)).strip()
        status, body = await _query(session, url, token, query="1+1")
        assert status == 403
        async with session.get(
            url + "/v1/query",
            params={"from": str(T0_S), "to": at},
            headers={"Authorization": f"Bearer {token}"},
        ) as response:
            assert response.status == 403
    return token
