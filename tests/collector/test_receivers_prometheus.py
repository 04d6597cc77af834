"""A real Prometheus (Debian's ``prometheus`` package; ``scripts/setup test`` installs it)
scrapes a local exporter and remote-writes to an ``lm-collector serve`` process.

Prometheus runs in agent mode on 127.0.0.1 with its own config and data directory under
the test's temp dir, and is stopped by its PID. The collector is stopped for a while in
the middle: Prometheus keeps the samples in its WAL and retries (the 503s and refused
connections are retryable), and the store must end up with every scrape exactly once.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client import Counter as PromCounter

from tests.collector.conftest import CollectorLauncher, free_port
from tests.collector.receiver_fixtures import (
    TOKENS_TOML,
    WRITER_TOKEN,
    AcceptedBatch,
    accepted_batches,
    open_test_store,
)
from tests.collector.test_processes import opened
from tests.prometheus_binary import require_prometheus


@pytest.fixture(autouse=True)
def _prometheus() -> None:
    require_prometheus()  # skips without the binary; fails with CI=true


DEADLINE_S = 90.0
OUTAGE_S = 4.0


@pytest.fixture
def exporter() -> Iterator[int]:
    """A prometheus_client exporter on 127.0.0.1 with known values; yields its port."""
    registry = CollectorRegistry()
    Gauge("lm_test_temperature", "room temperature", ["room"], registry=registry).labels(
        room="a"
    ).set(21.5)
    PromCounter("lm_test_requests", "requests", registry=registry).inc(7)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def prometheus_config(exporter_port: int, collector_port: int) -> str:
    return f"""
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  external_labels:
    cluster: test
scrape_configs:
  - job_name: app
    static_configs:
      - targets: ["127.0.0.1:{exporter_port}"]
remote_write:
  - url: http://127.0.0.1:{collector_port}/api/v1/write
    remote_timeout: 5s
    authorization:
      credentials: {WRITER_TOKEN}
    queue_config:
      batch_send_deadline: 1s
      min_backoff: 100ms
      max_backoff: 1s
"""


@pytest.fixture
def prometheus_runner(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=20)


def start_prometheus(
    tmp_path: Path, config: str, started: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    (tmp_path / "prometheus.yml").write_text(config)
    with (tmp_path / "prometheus.log").open("ab") as log:
        process = subprocess.Popen(
            [
                require_prometheus(),
                "--enable-feature=agent",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.agent.path={tmp_path / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{free_port()}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    started.append(process)
    return process


async def wait_for(store_url: str, env: dict[str, str], done: object) -> list[AcceptedBatch]:
    """Poll the store until ``done(batches)`` holds; fail after `DEADLINE_S`."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        async with opened(open_test_store(store_url, env)) as store:
            batches = await accepted_batches(store)
        if done(batches):  # type: ignore[operator]
            return batches
        assert time.monotonic() < deadline, f"not there after {DEADLINE_S}s: {len(batches)} batches"
        await asyncio.sleep(0.5)  # polling with a deadline, not a sleep to pass


def samples(batches: list[AcceptedBatch], metric: str) -> list[dict[str, object]]:
    return [p for b in batches for p in b.points if p["metric"] == metric]


async def test_prometheus_remote_writes_every_scrape_once_across_a_collector_outage(
    collectors: CollectorLauncher,
    exporter: int,
    prometheus_runner: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    store_url, env = f"file://{tmp_path / 'store'}", {}
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    port = free_port()
    collector = collectors.start(
        store_url=store_url, env={"LM_AUTH__TOKENS_FILE": str(tokens)}, port=port
    )
    start_prometheus(tmp_path, prometheus_config(exporter, port), prometheus_runner)

    def has_temperatures(count: int) -> object:
        return lambda batches: len(samples(batches, "lm_test_temperature")) >= count

    before = await wait_for(store_url, env, has_temperatures(3))
    collector.stop()
    await asyncio.sleep(OUTAGE_S)  # the scenario: Prometheus scrapes on and retries meanwhile
    collector.start()
    last_before = max(int(str(p["ts"])) for p in samples(before, "lm_test_temperature"))

    def past_the_outage(batches: list[AcceptedBatch]) -> bool:
        times = [int(str(p["ts"])) for p in samples(batches, "lm_test_temperature")]
        return sum(1 for ts in times if ts > last_before + 6 * 10**9) >= 2

    batches = await wait_for(store_url, env, past_the_outage)

    # Debian's Prometheus 2.42 sends no custom remote_write headers: the agent_id is the
    # name of the principal its token belongs to.
    assert {b.manifest.agent_id for b in batches} == {"prom-a"}
    temperatures = samples(batches, "lm_test_temperature")
    assert {p["value"] for p in temperatures} == {21.5}
    assert temperatures[0]["labels"] == {
        "room": "a",
        "job": "app",
        "instance": f"127.0.0.1:{exporter}",
        "cluster": "test",
    }
    assert {p["value"] for p in samples(batches, "lm_test_requests_total")} == {7.0}
    # Every scrape exactly once: no timestamp twice, none missing across the outage
    # (Prometheus scrapes every 1 s; a gap of 2 s or more would be a lost scrape).
    times = sorted(int(str(p["ts"])) for p in temperatures)
    assert [ts for ts, n in Counter(times).items() if n > 1] == []
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < 2 * 10**9, gaps
    assert times[-1] - times[0] > 6 * 10**9  # the run spans the outage
