"""The supervised engine's end (PROTOCOL §5): it dies with the collector
(``PR_SET_PDEATHSIG``, the collector killed by SIGKILL), and a clean stop ends it by PID
and removes its private directory. The "collector" is `engine_child`, a real process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.auth import EngineReadToken
from collector.promql.engine import BACKOFF_MAX_S, SupervisedEngine, backoff_delay
from collector.promql.engine_setup import engine_memory_limit
from config.query_settings import PromqlSettings, QuerySettings
from tests.prometheus_binary import require_prometheus

REPO = Path(__file__).resolve().parents[3]


def _alive(pid: int) -> bool:
    """A zombie (dead, not yet reaped by whoever inherited it) counts as dead."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z"


def _start_child(
    binary: str, ready_file: Path
) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    log = ready_file.with_suffix(".log")
    with log.open("wb") as output:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.collector.promql.engine_child", binary, str(ready_file)],
            cwd=REPO,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 30
    while not ready_file.exists():
        if child.poll() is not None or time.monotonic() > deadline:
            _end_child(child)
            pytest.fail(f"the engine child reported no ready engine:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)  # polling for its ready file, bounded by the deadline
    return child, json.loads(ready_file.read_text())


def _end_child(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is not None:
        return
    os.kill(child.pid, signal.SIGTERM)  # a clean stop ends its engine too
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()


def _wait_dead(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        assert time.monotonic() < deadline, f"engine {pid} outlived its collector"
        time.sleep(0.02)  # polling a process table entry, bounded by the deadline


def test_engine_dies_with_a_killed_collector(tmp_path: Path) -> None:
    child, info = _start_child(require_prometheus(), tmp_path / "ready.json")
    with child:
        engine_pid = int(str(info["engine_pid"]))
        assert _alive(engine_pid)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    _wait_dead(engine_pid, 10)


def test_clean_stop_ends_the_engine_by_pid_and_removes_its_files(tmp_path: Path) -> None:
    child, info = _start_child(require_prometheus(), tmp_path / "ready.json")
    with child:
        engine_pid = int(str(info["engine_pid"]))
        directory = Path(str(info["dir"]))
        assert (directory / "read-token").exists()
        assert (directory / "web.yml").exists()
        # Go's soft memory limit, by default the answers in flight + 256 MiB.
        environ = Path(f"/proc/{engine_pid}/environ").read_bytes().split(b"\0")
        assert f"GOMEMLIMIT={(512 + 256) * 1024 * 1024}".encode() in environ
        os.kill(child.pid, signal.SIGTERM)
        assert child.wait(timeout=20) == 0
    _wait_dead(engine_pid, 5)
    assert not directory.exists()


def test_the_engine_memory_limit_is_given_derived_or_none() -> None:
    mib = 1024 * 1024
    assert engine_memory_limit(QuerySettings()) == 768 * mib
    derived = QuerySettings(max_read_bytes_in_flight=64 * mib)
    assert engine_memory_limit(derived) == 320 * mib
    given = QuerySettings(promql=PromqlSettings(memory_limit_bytes=300 * mib))
    assert engine_memory_limit(given) == 300 * mib
    assert engine_memory_limit(QuerySettings(promql=PromqlSettings(memory_limit_bytes=0))) is None


def test_backoff_is_bounded_and_jittered() -> None:
    import random

    rng = random.Random(7)
    delays = [backoff_delay(n, rng) for n in range(12)]
    assert 1.0 <= delays[0] <= 1.25 and 2.0 <= delays[1] <= 2.5
    assert all(d <= BACKOFF_MAX_S for d in delays) and delays[-1] == pytest.approx(60, abs=0)
    assert len({round(d, 6) for d in delays[:6]}) == 6


async def test_an_engine_older_than_2_42_is_refused_and_not_restarted(tmp_path: Path) -> None:
    # A stand-in binary that says it is Prometheus 2.41.0 (old_engine.py, a script).
    binary = tmp_path / "prometheus"
    binary.write_text(
        f'#!/bin/sh\nexec {sys.executable} {REPO}/tests/collector/promql/old_engine.py "$@"\n'
    )
    binary.chmod(0o755)
    engine = SupervisedEngine(
        binary=binary,
        settings=PromqlSettings(prometheus=binary),
        max_concurrency=1,
        read_token=EngineReadToken.generate(),
    )
    await engine.start("http://127.0.0.1:9/api/v1/read")
    try:
        deadline = time.monotonic() + 30
        while "2.41.0" not in engine.down_reason:
            assert time.monotonic() < deadline, engine.down_reason
            await asyncio.sleep(0.02)
        assert engine.current() is None and engine.pid is None  # ended, not restarted
        assert "needs Prometheus 2.x >= 2.42" in engine.down_reason
        assert engine.starts == 1
    finally:
        await engine.stop()
