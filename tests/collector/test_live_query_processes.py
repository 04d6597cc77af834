"""``GET /v1/query`` across real processes on MiniStack: collector A keeps its own batches
(``own_batches``), collector D is the designated query collector (follows the index log).

A batch accepted by A appears in D's answer within the flush + poll interval, not
complete (its hour is not sealed); A's answer holds only A's batches; D restarted
rebuilds its window from the log and the blobs. Then ``lm-reconciler audit`` and one
``lm-rollup run`` (Spark, ``local[1]``): the old range answers ``complete: true`` from
snapshot 1 with nothing counted twice, and counts in ``sources.late_batches`` the
batches accepted after the seal (the audit seals only hours that ended before it; these
were accepted in the current hour with points three hours back); a batch accepted after
the rollup with the same old times merges into ``step=1m`` minutes, still ``complete``
(by acceptance time) and counted late; ``version=1`` reads the committed part alone; the metrics count
the queries; ``lm-collector query`` prints the answer.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import cramjam
import pytest

from collector.promql.proto import read_pb2
from config import hash_token
from protocol import keys
from protocol.frame_encode import encode_frame, points_table
from tests.collector.conftest import (
    BOOT,
    CollectorLauncher,
    CollectorProcess,
    bearer,
    collector_env,
    get,
    metric_value,
    post_frame,
    run_cli,
)
from tests.s3_servers import RunningServer, fresh_bucket

NS = 1_000_000_000
DEADLINE_S = 20.0
READ, WRITE = "lm-test-read-token", "lm-test-write-token"


def tokens_file(path: Path) -> Path:
    path.write_text(
        "[[principal]]\n"
        f'name = "writer"\ntoken_sha256 = "{hash_token(WRITE)}"\nagents = ["agent-*"]\n\n'
        "[[principal]]\n"
        f'name = "dashboards"\ntoken_sha256 = "{hash_token(READ)}"\nagents = []\nread = true\n'
    )
    return path


def frame(agent: str, seq_start: int, first_ts_ns: int, values: list[float]) -> bytes:
    """Points 20 s apart from ``first_ts_ns``."""
    n = len(values)
    table = points_table(
        [first_ts_ns + i * 20 * NS for i in range(n)],
        ["cpu.load"] * n,
        values,
        [{"host": "h1"}] * n,
    )
    return encode_frame(agent_id=agent, boot_id=BOOT, seq_start=seq_start, points=table)


async def query(
    session: aiohttp.ClientSession, process: CollectorProcess, token: str | None, **params: str
) -> tuple[int, Any]:
    headers = bearer(token) if token else {}
    async with session.get(
        f"{process.base_url}/v1/query", params=params, headers=headers
    ) as response:
        return response.status, await response.json()


async def remote_read(
    session: aiohttp.ClientSession, process: CollectorProcess, name: str, from_s: int, to_s: int
) -> list[tuple[tuple[tuple[str, str], ...], list[tuple[int, float]]]]:
    """``POST /api/v1/read`` (SAMPLES) for ``{__name__=name}`` over ``[from_s, to_s)``."""
    request = read_pb2.ReadRequest()
    request.queries.add(
        start_timestamp_ms=from_s * 1000, end_timestamp_ms=to_s * 1000 - 1
    ).matchers.add(type=0, name="__name__", value=name)
    headers = {
        **bearer(READ),
        "Content-Type": "application/x-protobuf",
        "Content-Encoding": "snappy",
    }
    body = bytes(cramjam.snappy.compress_raw(request.SerializeToString()))
    async with session.post(
        f"{process.base_url}/api/v1/read", data=body, headers=headers
    ) as response:
        payload = await response.read()
        assert response.status == 200, payload
    answer = read_pb2.ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(payload)))
    return [
        (
            tuple((label.name, label.value) for label in series.labels),
            [(sample.timestamp, sample.value) for sample in series.samples],
        )
        for series in answer.results[0].timeseries
    ]


async def wait_for(
    session: aiohttp.ClientSession,
    process: CollectorProcess,
    predicate: Any,
    what: str,
    **params: str,
) -> Any:
    """Ask until ``predicate(answer)`` holds, within `DEADLINE_S` (no sleep-to-pass)."""
    deadline = time.monotonic() + DEADLINE_S
    last: Any = None
    while time.monotonic() < deadline:
        status, last = await query(session, process, READ, **params)
        if status == 200 and predicate(last):
            return last
        await asyncio.sleep(0.1)  # the polling interval, bounded by the deadline
    raise AssertionError(f"{what}: not within {DEADLINE_S}s; last answer {last}")


def run_module(
    module: str, args: list[str], env: Mapping[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=collector_env(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.s3
async def test_live_queries_own_batches_designated_and_sealed(
    tmp_path: Path, ministack_server: RunningServer, collectors: CollectorLauncher
) -> None:
    bucket = fresh_bucket(ministack_server)
    store_env = {
        "LM_STORE__URL": f"s3://{bucket}/live",
        "LM_STORE__ENDPOINT_URL": ministack_server.endpoint_url,
        # A small settle margin (2 + 1 + 2 + 1 s): the audit below seals the past hours.
        "LM_INGEST__REQUEST_BUDGET_S": "2",
        "LM_STORE__CONNECT_TIMEOUT_S": "1",
        "LM_STORE__READ_TIMEOUT_S": "2",
        "LM_STORE__MAX_CLOCK_SKEW_S": "1",
        "LM_INGEST__INDEX_FLUSH_MAX_AGE_MS": "200",
        "LM_QUERY__REFRESH_INTERVAL_S": "0.2",
        # Answers wait for the history read (a bound a correct run never reaches), so
        # ``complete`` below does not depend on how fast this machine reads the catalog.
        "LM_QUERY__HISTORY_WAIT_S": "60",
    }
    tokens = tokens_file(tmp_path / "tokens.toml")
    common = {**store_env, "LM_AUTH__TOKENS_FILE": str(tokens)}
    a = collectors.start(
        store_url=store_env["LM_STORE__URL"], name="coll-a",
        env={**common, "LM_QUERY__OWN_BATCHES": "true"},
    )  # fmt: skip
    designated = {
        **common,
        "LM_QUERY__DESIGNATED": "true",
        "LM_QUERY__POLL_INTERVAL_S": "0.3",
        "LM_QUERY__HISTORY_CACHE_DIR": str(tmp_path / "history"),
    }
    d = collectors.start(store_url=store_env["LM_STORE__URL"], name="coll-d", env=designated)

    # Points three hours back: an hour that ends long before anything is sealed.
    old_hour = keys.UtcHour.from_unix_ns(time.time_ns()).shifted(-3)
    old = {
        "metric": "cpu.load",
        "from": str(old_hour.start_ns // NS),  # unix seconds (PROTOCOL §2)
        "to": str(old_hour.next().start_ns // NS),
    }
    t0 = old_hour.start_ns + 60 * NS
    async with aiohttp.ClientSession() as session:
        # Auth before anything: 401 without or with an unknown token, 403 without read.
        assert (await query(session, a, None, metric="cpu.load"))[0] == 401
        assert (await query(session, a, "nope", metric="cpu.load"))[0] == 401
        assert (await query(session, a, WRITE, metric="cpu.load"))[0] == 403
        status, body = await query(session, a, READ, metric="cpu.load", step="5m")
        assert status == 400 and body["error"] == "invalid_query" and body["param"] == "step"

        from_a = frame("agent-1", 0, t0, [1.0, 2.0, 3.0])
        from_d = frame("agent-2", 0, t0, [10.0, 20.0, 30.0])
        assert (await post_frame(session, a.base_url, from_a, headers=bearer(WRITE))).status == 200
        assert (await post_frame(session, d.base_url, from_d, headers=bearer(WRITE))).status == 200

        # A answers from its own batch only; D from both, through the log.
        own = await wait_for(session, a, lambda r: r["sources"]["live_rows"] == 3, "A's own", **old)
        assert {row[5] for row in own["rows"]} == {"agent-1"}  # agent_id column
        assert own["complete"] is False and own["snapshot_version"] is None
        seen = await wait_for(
            session, d, lambda r: r["sources"]["live_rows"] == 6, "D follows", **old
        )
        assert seen["complete"] is False and seen["sources"]["following"] == "designated"
        assert seen["live_through_ns"] > 0

        # Restarted, D rebuilds its window from the log segments and the raw blobs.
        assert d.stop() == 0
        d.start()
        rebuilt = await wait_for(
            session, d, lambda r: r["sources"]["live_rows"] == 6, "rebuilt", **old
        )
        assert rebuilt["rows"] == seen["rows"]

        # Audit (seals every hour that ended before it started, less the margin), roll up.
        audit = run_module("reconciler", ["audit"], store_env, tmp_path)
        assert audit.returncode == 0, audit.stderr[-3000:]
        rollup = run_module("rollup", ["run", "--master", "local[1]"], store_env, tmp_path)
        assert rollup.returncode == 0, rollup.stderr[-3000:]

        committed = await wait_for(
            session, d, lambda r: r["snapshot_version"] == 1, "snapshot 1 seen", **old
        )
        assert committed["complete"] is True and committed["sealed_through_ns"] >= int(old["to"])
        # Nothing counted twice: the live batches are in the ledger, so left out.
        assert committed["sources"]["snapshot_rows"] == 6
        assert committed["sources"]["live_rows"] == 0
        assert committed["rows"] == seen["rows"]
        # Both were accepted in the current hour, after the seal: the old range got them late.
        assert committed["sources"]["late_batches"] == 2
        own = await wait_for(session, a, lambda r: r["snapshot_version"] == 1, "A sees v1", **old)
        assert own["complete"] is True and len(own["rows"]) == 6

        # Accepted after the rollup, at the same old times: merged into the committed minute.
        # Its first and last samples tie the committed ones on ts: the tie goes by (agent,
        # boot, seq), so agent-0 is first and agent-2 (committed) stays last.
        late = frame("agent-0", 0, t0, [100.0, 200.0, 300.0])
        assert (await post_frame(session, a.base_url, late, headers=bearer(WRITE))).status == 200
        minutes = await wait_for(
            session, d, lambda r: r["sources"]["live_rows"] == 3, "late batch", step="1m", **old
        )
        columns = minutes["columns"]
        assert len(minutes["rows"]) == 1 and minutes["complete"] is True
        assert minutes["sources"]["late_batches"] == 3  # an old range can still grow
        minute = dict(zip(columns, minutes["rows"][0], strict=True))
        assert (minute["count"], minute["sum"], minute["min"], minute["max"]) == (
            9,
            666.0,
            1.0,
            300.0,
        )
        assert (minute["first"], minute["last"]) == (100.0, 30.0)

        # Prometheus remote read of the same range from the real process: the committed
        # part (Parquet written by the Spark job) and the live batch, one sample per
        # millisecond, the tie going to the last by (us, agent, boot, seq) (PROTOCOL §5).
        points = (await query(session, d, READ, **old))[1]
        assert len(points["rows"]) == 9
        winners: dict[int, tuple[Any, ...]] = {}
        for row in points["rows"]:
            cells = dict(zip(points["columns"], row, strict=True))
            moment = datetime.fromisoformat(cells["ts"].replace("Z", "+00:00"))
            micros = round(moment.timestamp() * 1_000_000)
            rank = (micros, cells["agent_id"], cells["boot_id"], cells["seq"], cells["value"])
            winners[micros // 1000] = max(winners.get(micros // 1000, rank), rank)
        expected = [(ms, winners[ms][-1]) for ms in sorted(winners)]
        samples = await remote_read(session, d, "cpu_load", int(old["from"]), int(old["to"]))
        assert samples == [((("__name__", "cpu_load"), ("host", "h1")), expected)]

        # Time travel: the committed part of version 1 alone.
        travel = (await query(session, d, READ, version="1", **old))[1]
        assert travel["snapshot_version"] == 1 and travel["sources"]["live_rows"] == 0
        assert len(travel["rows"]) == 6
        status, body = await query(session, d, READ, version="7", **old)
        assert status == 404 and body["error"] == "version_not_found"

        metrics = (await get(session, f"{d.base_url}/metrics")).text
        assert (metric_value(metrics, "lm_collector_queries_total", 'status="ok"') or 0) >= 3
        assert (metric_value(metrics, "lm_collector_live_window", 'what="batches"') or 0) == 3
        # The sealed hours it read: at least through what its answers called sealed.
        read_through = metric_value(metrics, "lm_collector_history_read_through_timestamp_seconds")
        assert read_through is not None
        assert read_through * 1e9 >= committed["sealed_through_ns"] > 0
        # Its history cache is set up (query.history_cache_dir; no hour here has a
        # sealed catalog file to keep: the batches were accepted this hour).
        assert (tmp_path / "history").is_dir()

    printed = run_cli(
        ["query", "--url", d.base_url, "--metric", "cpu.load", "--from", old["from"], "--to", old["to"], "--format", "json"],
        {"LM_TOKEN": READ},
        tmp_path,
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    answer = json.loads(printed.stdout)
    assert answer["complete"] is True and len(answer["rows"]) == 9
