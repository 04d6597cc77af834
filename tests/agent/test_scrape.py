"""``lm-agent scrape``: scraping Prometheus text endpoints into spooled, delivered frames.

The targets are real ``prometheus_client`` HTTP servers started by the tests on
127.0.0.1. The outage test runs the agent and the collector as processes (both stopped
by PID) and checks, from the store's manifests and blobs, that every scrape the target
served was accepted exactly once, across a collector outage and an agent restart.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.scrape import ScrapeAgent
from agent.scrape_target import Target, scrape_target
from config import ScrapeSettings, ScrapeTarget
from protocol import keys, records
from protocol.frame import decode_frame
from store.fs import FileSystemStore
from tests.collector.conftest import CollectorLauncher, free_port, write_tokens_file

T0_NS = 1_760_000_000_000_000_000


class ScrapeCounter:
    """A custom collector: every scrape it serves exposes the next number, and is
    remembered, so a test knows exactly what each scrape saw."""

    def __init__(self) -> None:
        self.served: list[int] = []
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            number = len(self.served) + 1
            self.served.append(number)
        counter = CounterMetricFamily("lm_test_scrapes", "scrapes served", labels=["instance"])
        counter.add_metric(["exporter-own"], number)
        yield counter
        yield GaugeMetricFamily("lm_test_constant", "always 42", value=42)


def start_exporter(registry: CollectorRegistry) -> tuple[int, Callable[[], None]]:
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

    return port, stop


@pytest.fixture
def counting_exporter() -> Iterator[tuple[int, ScrapeCounter]]:
    registry = CollectorRegistry()
    counter = ScrapeCounter()
    registry.register(counter)
    port, stop = start_exporter(registry)
    try:
        yield port, counter
    finally:
        stop()


# --- one scrape ------------------------------------------------------------------------


async def test_a_scrape_maps_samples_to_points_with_target_labels(
    counting_exporter: tuple[int, ScrapeCounter],
) -> None:
    port, counter = counting_exporter
    target = Target.of(f"http://127.0.0.1:{port}/metrics", {"job": "app"})
    async with aiohttp.ClientSession() as session:
        result = await scrape_target(
            session,
            target,
            started_ns=T0_NS + 123_456_789,
            timeout_s=5.0,
            max_bytes=1 << 20,
            monotonic=iter([10.0, 10.25]).__next__,
        )
    assert result.ok, result.error
    rows = {
        (metric, tuple(sorted(dict(labels).items())), value, ts)
        for metric, labels, value, ts in zip(
            result.points.column("metric").to_pylist(),
            result.points.column("labels").to_pylist(),
            result.points.column("value").to_pylist(),
            result.points.column("ts").cast("int64").to_pylist(),
            strict=True,
        )
    }
    instance = ("instance", f"127.0.0.1:{port}")
    ts = T0_NS + 123_000_000  # the scrape start, in milliseconds
    assert (
        "lm_test_scrapes_total",
        (("exported_instance", "exporter-own"), instance, ("job", "app")),
        1.0,
        ts,
    ) in rows
    assert ("lm_test_constant", (instance, ("job", "app")), 42.0, ts) in rows
    assert ("up", (instance, ("job", "app")), 1.0, ts) in rows
    # What Prometheus records for every scrape: the target exposed 2 samples, and the
    # scrape took 0.25 s on the clock it was given (one tick before, one after).
    assert ("scrape_samples_scraped", (instance, ("job", "app")), 2.0, ts) in rows
    assert ("scrape_duration_seconds", (instance, ("job", "app")), 0.25, ts) in rows
    assert len(rows) == 5
    assert counter.served == [1]


async def test_a_failed_scrape_is_up_0_with_the_reason() -> None:
    registry = CollectorRegistry()
    Gauge("big", "a large label", ["v"], registry=registry).labels(v="x" * 2000).set(1)
    port, stop = start_exporter(registry)
    closed_port = free_port()
    try:
        async with aiohttp.ClientSession() as session:
            results = [
                await scrape_target(
                    session, Target.of(url), started_ns=T0_NS, timeout_s=5.0, max_bytes=max_bytes
                )
                for url, max_bytes in [
                    (f"http://127.0.0.1:{closed_port}/metrics", 1 << 20),
                    (f"http://127.0.0.1:{port}/metrics", 100),
                    (f"http://127.0.0.1:{port}/metrics", 1 << 20),  # a 2000-byte label value
                ]
            ]
    finally:
        stop()
    errors = [result.error or "" for result in results]
    assert "Connect" in errors[0] or "refused" in errors[0], errors
    assert "larger than 100 bytes" in errors[1]
    assert "cannot store the exposition" in errors[2]
    for result in results:
        metrics = result.points.column("metric").to_pylist()
        assert metrics == ["up", "scrape_duration_seconds", "scrape_samples_scraped"]
        up, duration, samples = result.points.column("value").to_pylist()
        assert (up, samples) == (0.0, 0.0) and duration >= 0.0


# --- the agent in this process ---------------------------------------------------------


async def test_the_agent_spools_frames_and_a_stop_keeps_what_it_could_not_deliver(
    counting_exporter: tuple[int, ScrapeCounter], tmp_path: Path
) -> None:
    port, counter = counting_exporter
    settings = ScrapeSettings(
        agent_id="agent-inproc",
        collector_urls=[f"http://127.0.0.1:{free_port()}"],  # nobody listens
        spool_dir=tmp_path / "spool",
        targets=[ScrapeTarget(url=f"http://127.0.0.1:{port}/metrics")],
        interval_s=0.2,
        timeout_s=0.2,
        flush_interval_s=0.05,
        shutdown_grace_s=0.2,
    )
    agent = ScrapeAgent(settings=settings, token=None)
    running = asyncio.create_task(agent.run())

    async def three_frames() -> bool:
        return agent.stats.frames_spooled >= 3

    await wait_until(three_frames, "three spooled frames", timeout_s=30)
    agent.stop()
    stats = await asyncio.wait_for(running, 30)

    frames = sorted((tmp_path / "spool" / "pending").glob("*.lmbatch"))
    points = [decode_frame(path.read_bytes()) for path in frames]
    assert stats.frames_spooled == len(frames) >= 3
    seqs = [(f.seq_start, f.seq_end) for f in points]
    assert seqs[0][0] == 0 and all(b[0] == a[1] + 1 for a, b in itertools.pairwise(seqs))
    scraped = [
        v
        for f in points
        for m, v in zip(
            f.points.column("metric").to_pylist(), f.points.column("value").to_pylist(), strict=True
        )
        if m == "lm_test_scrapes_total"
    ]
    served = [float(n) for n in counter.served]
    # A scrape the exporter served but the agent gave up on (its timeout, on a loaded
    # machine) is a failed scrape: recorded as one, and never half spooled.
    assert scraped == sorted(set(scraped)) and set(scraped) <= set(served)
    assert len(served) - len(scraped) <= stats.failed_scrapes
    if stats.failed_scrapes == 0:
        assert scraped == served  # the last scrape was spooled too
    # The agent's own health rides along (`agent.health`): nobody listens at the
    # collector URL, so once the first frame is spooled every later round shows a backlog.
    health = [
        (m, dict(labels), v)
        for f in points
        for m, labels, v in zip(
            f.points.column("metric").to_pylist(),
            f.points.column("labels").to_pylist(),
            f.points.column("value").to_pylist(),
            strict=True,
        )
        if m.startswith("lm_agent_")
    ]
    backlog = [v for m, _labels, v in health if m == "lm_agent_spool_pending_frames"]
    assert backlog[0] == 0 and max(backlog) >= 1, backlog
    assert all(labels["instance"] == "agent-inproc" for _m, labels, _v in health)
    accepted = [
        v
        for m, labels, v in health
        if m == "lm_agent_deliveries_total" and labels["outcome"] == "accepted"
    ]
    assert accepted and set(accepted) == {0.0}  # nothing could be delivered


# --- processes: a collector outage and an agent restart -----------------------------------


@pytest.fixture
def collectors(tmp_path: Path) -> Iterator[CollectorLauncher]:
    launcher = CollectorLauncher(tmp_path / "collectors")
    try:
        yield launcher
    finally:
        launcher.stop_all()


class AgentProcess:
    def __init__(self, config: Path, log: Path) -> None:
        script = Path(sys.executable).parent / "lm-agent"
        argv = [str(script)] if script.exists() else [sys.executable, "-m", "agent"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LM_")}
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*argv, "scrape", "--config", str(config)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM by PID; SIGKILL if it does not stop in time. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout_s)
        return self.proc.returncode


async def wait_until(check: Callable[[], Any], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)  # polling with a deadline, not a sleep to pass


async def accepted(store: FileSystemStore) -> list[tuple[records.AcceptedManifest, Any]]:
    found = []
    async for info in store.list(keys.ACCEPTED_PREFIX):
        manifest = records.AcceptedManifest.from_json((await store.get(info.key))[0])
        frame = decode_frame((await store.get(manifest.raw_blob_key))[0])
        found.append((manifest, frame))
    return found


def pending(spool: Path) -> int:
    return len(list((spool / "pending").glob("*.lmbatch")))


async def test_an_outage_and_a_restart_lose_and_duplicate_nothing(
    counting_exporter: tuple[int, ScrapeCounter], collectors: CollectorLauncher, tmp_path: Path
) -> None:
    exporter_port, counter = counting_exporter
    tokens = write_tokens_file(tmp_path / "tokens.toml")
    (tmp_path / "token").write_text(tokens.writer)
    port = free_port()
    store_dir = tmp_path / "store"
    spool = tmp_path / "agent-spool"
    env = {"LM_AUTH__TOKENS_FILE": str(tokens.path)}
    collector = collectors.start(store_url=f"file://{store_dir}", env=env, port=port)
    config = tmp_path / "agent.toml"
    config.write_text(
        f"""
[scrape]
agent_id = "agent-scrape"
collector_urls = ["http://127.0.0.1:{port}"]
token_file = "{tmp_path / "token"}"
spool_dir = "{spool}"
interval_s = 0.5
timeout_s = 0.5
flush_interval_s = 0.5
shutdown_grace_s = 3.0

[[scrape.targets]]
url = "http://127.0.0.1:{exporter_port}/metrics"
labels = {{job = "test"}}

[logging]
format = "json"
"""
    )
    store = FileSystemStore(store_dir)
    log = tmp_path / "agent.log"

    async def batches_at_least(n: int) -> bool:
        return len(await accepted(store)) >= n

    first = AgentProcess(config, log)
    await wait_until(lambda: batches_at_least(3), "three accepted frames")
    collector.stop()
    spooled_before = pending(spool)

    async def spooled_more(n: int) -> bool:
        return pending(spool) >= spooled_before + n

    await wait_until(lambda: spooled_more(3), "frames spooled during the outage")
    assert first.stop() == 0, log.read_text()[-3000:]
    second = AgentProcess(config, log)  # a restart: a new boot, the same spool
    await wait_until(lambda: spooled_more(5), "more frames spooled by the restarted agent")
    collector.start()

    async def all_delivered() -> bool:
        return pending(spool) == 0 and len(await accepted(store)) >= 8

    await wait_until(all_delivered, "the spool to drain")
    assert second.stop() == 0, log.read_text()[-3000:]
    assert pending(spool) == 0

    found = await accepted(store)
    assert {manifest.agent_id for manifest, _ in found} == {"agent-scrape"}
    by_boot: dict[str, list[tuple[int, int]]] = {}
    values: list[float] = []
    failed_scrapes = 0
    for manifest, frame in found:
        by_boot.setdefault(manifest.boot_id, []).append((manifest.seq_start, manifest.seq_end))
        for metric, value in zip(
            frame.points.column("metric").to_pylist(),
            frame.points.column("value").to_pylist(),
            strict=True,
        ):
            if metric == "lm_test_scrapes_total":
                values.append(value)
            elif metric == "up" and value == 0.0:
                failed_scrapes += 1
    assert len(by_boot) == 2  # one boot per agent start
    for ranges in by_boot.values():  # no gap, no overlap in either boot's sequence
        ranges.sort()
        assert ranges[0][0] == 0
        assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))
    served = [float(n) for n in counter.served]
    assert [v for v, n in Counter(values).items() if n > 1] == []  # nothing twice
    assert set(values) <= set(served)
    # Every scrape the target served is stored, except one the agent gave up waiting for
    # (it would be an up = 0 row); on a machine that keeps up, that is none.
    assert len(values) + failed_scrapes == len(served)
    if failed_scrapes == 0:
        assert sorted(values) == served and sum(values) == sum(served)
