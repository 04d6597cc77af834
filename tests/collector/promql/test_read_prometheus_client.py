"""A real Prometheus 2.42 (Debian's package) reads ``POST /api/v1/read`` as its remote
storage (``read_recent: true``, a bearer read token, no data of its own): its PromQL
answers over the read world (`read_world`: committed and live parts, a microsecond tie,
a presented-name collision, a dropped label, a staleness marker) equal what the
per-sample oracle says they must be. One Prometheus process for the module's one test,
on 127.0.0.1, stopped by its PID."""

from __future__ import annotations

import asyncio
import math
import random
import signal
import struct
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from tests.collector.conftest import free_port
from tests.prometheus_binary import require_prometheus

from .read_client import END_MS, START_MS, serving
from .read_world import ALL, READ_TOKEN, at, make_world, oracle

STALE_BITS = 0x7FF0000000000002


def _wait_ready(base: str, process: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(base + "/-/ready", timeout=5) as answer:
                if answer.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(random.uniform(0.05, 0.15))  # bounded by the deadline, jittered
    return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)


def _start(binary: str, root: Path, read_url: str) -> tuple[subprocess.Popen[bytes], str]:
    (root / "prometheus.yml").write_text(
        "global: {}\n"
        "remote_read:\n"
        f"  - url: {read_url}\n"
        "    read_recent: true\n"
        "    authorization:\n"
        f"      credentials: {READ_TOKEN}\n"
    )
    for _attempt in range(3):
        port = free_port()
        with (root / "prometheus.log").open("ab") as out:
            process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={root / 'prometheus.yml'}",
                    f"--storage.tsdb.path={root / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=root,
            )
        base = f"http://127.0.0.1:{port}"
        if _wait_ready(base, process):
            return process, base
        _stop(process)
    raise AssertionError((root / "prometheus.log").read_text()[-2000:])


def _value(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


async def test_prometheus_reads_the_fleet_through_remote_read(tmp_path: Path) -> None:
    binary = require_prometheus()
    world = await make_world(tmp_path)
    at_s = at(12) / 1e9  # every sample of the world is within the hour before
    async with serving(world) as (read_url, _probe):
        process, base = await asyncio.to_thread(_start, binary, tmp_path, read_url)
        try:

            async def instant(expr: str) -> dict[tuple[tuple[str, str], ...], float]:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(
                        base + "/api/v1/query", params={"query": expr, "time": f"{at_s:.3f}"}
                    ) as answer,
                ):
                    data: Any = await answer.json()
                assert data["status"] == "success" and not data.get("warnings"), data
                return {
                    tuple(sorted(r["metric"].items())): float(r["value"][1])
                    for r in data["data"]["result"]
                }

            counts = await instant(
                "count_over_time({__name__=~'cpu|http_server_duration|temp'}[1h])"
            )
            sums = await instant("sum_over_time({__name__=~'cpu|http_server_duration|temp'}[1h])")
            last = await instant("last_over_time(temp[1h])")
        finally:
            await asyncio.to_thread(_stop, process)
    matchers = [("RE", "__name__", "cpu|http_server_duration|temp")]
    expected_counts, expected_sums = {}, {}
    for label_set, samples in oracle(ALL, matchers, START_MS, END_MS):
        key = tuple(sorted((n, v) for n, v in label_set if n != "__name__"))
        live = [_value(b) for _ms, b in samples if b != STALE_BITS]  # the engine drops markers
        expected_counts[key] = float(len(live))
        expected_sums[key] = math.fsum(live)
    assert counts == expected_counts
    assert sums.keys() == expected_sums.keys()
    assert all(math.isclose(sums[k], expected_sums[k], rel_tol=1e-12) for k in sums)
    # The collision (10 beats 11 at one ms), the µs tie (-2 beats 2) and the label kept
    # for a_b (the exact stored name's value "y") reached the engine as the oracle says.
    assert expected_sums[(("le", "1"),)] == 22.0
    assert expected_counts[(("host", "a"),)] == 4.0  # 1, 2|-2, 4, 11; the marker dropped
    assert last == {(("__name__", "temp"), ("a_b", "y")): 20.0}  # last_over_time keeps the name
