"""An operator-run engine (``query.promql.url``, PROTOCOL §5) as deploy/ runs it: a real
Prometheus 2.42 started with exactly what ``lm-collector promql-config`` wrote (its
``prometheus.env`` flags), checked by `SidecarEngine` (buildinfo >= 2.42, read_recent,
no data of its own) before anything is forwarded. The collector writes its read token
after the engine started: Prometheus reads the ``credentials_file`` on every request."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from collector.__main__ import main
from collector.auth import Authenticator
from collector.promql.engine_check import (
    EngineCheckFailed,
    basic_authorization,
    check_operator_engine,
    check_version,
)
from collector.promql.engine_sidecar import SidecarEngine
from collector.promql.forward import PromqlForward
from config.query_settings import PromqlSettings, QuerySettings
from config.tokens import Principal, TokenTable, hash_token
from tests.collector.conftest import free_port
from tests.prometheus_binary import require_prometheus

from .standin_read import StandinRead

READER = "reader-token"
SERIES = [((("__name__", "up"), ("job", "a")), ((1_700_000_000_000, 1.0),))]


def test_versions_the_contract_accepts() -> None:
    check_version({"version": "2.42.0+ds"})
    check_version({"version": "2.53.1"})
    for refused in ("2.41.0", "3.1.0", "", "main"):
        with pytest.raises(EngineCheckFailed, match=r"needs Prometheus 2\.x >= 2\.42"):
            check_version({"version": refused})


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def test_a_sidecar_from_promql_config_is_checked_then_answers(tmp_path: Path) -> None:
    binary = require_prometheus()
    authenticator = Authenticator(
        TokenTable([Principal(name="grafana", token_sha256=hash_token(READER), read=True)])
    )
    standin = StandinRead(token=authenticator.engine_read.token, series=list(SERIES))
    read_runner, read_url = await _serve(standin.app())
    port = free_port()
    directory = tmp_path / "promql"
    assert (
        main(
            [
                "promql-config",
                "--dir",
                str(directory),
                "--read-url",
                f"{read_url}/api/v1/read",
                "--listen",
                f"127.0.0.1:{port}",
                "--tsdb-path",
                str(tmp_path / "tsdb"),
            ]
        )
        == 0
    )
    env = (directory / "prometheus.env").read_text().splitlines()[0].partition("=")[2]
    settings = QuerySettings(
        promql=PromqlSettings(url=f"http://127.0.0.1:{port}", credentials_dir=directory)
    )
    sidecar = SidecarEngine(settings=settings.promql, read_token=authenticator.engine_read)
    forward = PromqlForward(authenticator=authenticator, settings=settings, engine=sidecar)
    app = web.Application()
    forward.add_routes(app)
    runner, url = await _serve(app)
    # The operator's engine, as the systemd unit or the pod's container starts it.
    engine = subprocess.Popen([binary, *env.split()], stderr=subprocess.DEVNULL)  # noqa: ASYNC220
    try:
        await sidecar.start(f"{read_url}/api/v1/read")
        deadline = time.monotonic() + 30
        while sidecar.current() is None:  # checked with backoff until the engine is up
            assert time.monotonic() < deadline, sidecar.down_reason
            await asyncio.sleep(0.05)
        endpoint = sidecar.current()
        assert endpoint is not None and endpoint.version.startswith("2.42")
        async with aiohttp.ClientSession() as session:
            async with session.get(
                url + "/api/v1/query",
                params={"query": "sum(up)", "time": "1700000000"},
                headers={"Authorization": f"Bearer {READER}"},
            ) as response:
                body = await response.json()
            assert response.status == 200, body
            assert body["data"]["result"][0]["value"][1] == "1"
            assert standin.reads == ["ok"]  # read with the token written after its start
            wrong = basic_authorization("lightmetrics", "not-the-password")
            with pytest.raises(EngineCheckFailed, match="refuses the collector's basic auth"):
                await check_operator_engine(session, endpoint.base_url, wrong)
    finally:
        await runner.cleanup()
        await sidecar.stop()
        os.kill(engine.pid, signal.SIGTERM)
        await asyncio.to_thread(engine.wait, 20)
        await read_runner.cleanup()
    assert not (directory / "read-token").exists()
