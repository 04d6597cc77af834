"""Every Grafana panel of deploy/grafana returns data from the daemons' real metrics
(issue 32 item 5, the interim form): a real ``lm-collector`` and ``lm-reconciler`` run
over one filesystem store, a throwaway Prometheus 2.42 scrapes their ``/metrics`` under
the job names of the self-scrape config (deploy/systemd/self-scrape.toml), and each
panel's request, computed as Grafana 12.2 computes it (`tests.deploy.grafana_panels`),
must return at least one number. The same requests go through the query collector's own
API once the self-scrape lands there (the end-to-end test); here Prometheus proves the
expressions parse and the metrics exist and move.

Also replayed here: the requests Grafana's data source makes on its own
(`tests.deploy.grafana_requests`), each answered ``success`` by a real Prometheus.
"""

from __future__ import annotations

import asyncio
import math
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from config import load_settings
from protocol.clock import SystemClock
from reconciler.daemon import Reconciler
from rollup.table.ledger import LedgerRow
from rollup.table.owner import OwnerLease
from store.fs import FileSystemStore
from tests.collector.conftest import (
    CollectorLauncher,
    collector_env,
    free_port,
    make_frame,
    post_frame,
)
from tests.deploy.deploy_files import DEPLOY
from tests.deploy.grafana_panels import (
    ALL,
    GrafanaTime,
    PanelRequest,
    load_dashboard,
    panel_requests,
    template_variables,
    variable_request,
)
from tests.deploy.grafana_requests import datasource_requests
from tests.prometheus_binary import require_prometheus
from tests.reconciler.conftest import make_batch, make_settings, write_batch
from tests.rollup.dataset_builder import commit_rows

SELF_SCRAPE = DEPLOY / "systemd" / "self-scrape.toml"
HEALTH = DEPLOY / "grafana" / "dashboards" / "lightmetrics-health.json"
FLEET = DEPLOY / "grafana" / "dashboards" / "lightmetrics-fleet.json"
SCRAPE_INTERVAL = "1s"  # the throwaway Prometheus' scrape interval = the data source's
RANGE_MS = 120_000
DEADLINE_S = 90.0
START_DEADLINE_S = 30.0
ALLOWED_EMPTY = {
    ("Raw retention", "B"): "raw retention is off here (retention.raw_days): nothing retired",
}
"""Targets that may stay empty in this world, and why (every panel still has data)."""


@dataclass(frozen=True)
class World:
    prometheus_url: str
    collector_url: str
    jobs: frozenset[str]


def self_scrape_jobs() -> dict[str, str]:
    """job -> the kind of daemon, from the deploy file's targets."""
    settings = load_settings(SELF_SCRAPE, environ={})
    jobs = {target.labels["job"] for target in settings.scrape.targets}
    assert jobs == {"lightmetrics-collector", "lightmetrics-reconciler"}
    return {job: job.removeprefix("lightmetrics-") for job in jobs}


async def prepare_store(root: Path) -> None:
    """One accepted batch, included by a rollup commit, and a completed audit: the
    reconciler's rollup, audit and sealed-hours gauges then have something to show from
    its first pass (the rollup job is the Spark tests' business; an audit in line here
    takes a second, the daemon's first one in its child process several)."""
    store = FileSystemStore(root)
    clock = SystemClock()
    try:
        batch = make_batch(1, 0, clock.now_ns() - 3_600 * 10**9)
        await write_batch(store, batch)
        owner = await OwnerLease.acquire(store, "grafana-test", 600, clock)
        await commit_rows(store, owner, clock, ledger=[LedgerRow.of_manifest(batch.manifest)])
        await owner.release()
        reconciler = Reconciler(
            store=store, settings=make_settings(), clock=clock, rng=random.Random(1)
        )
        assert (await reconciler.run_once()).audit is not None
    finally:
        await store.close()


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)


def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Poll ``url`` until it answers 200 (bounded; fails with the process' log)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        assert time.monotonic() < deadline, f"{url} not ready: {log.read_text()[-3000:]}"
        time.sleep(0.2)  # polling with a deadline, not a sleep to pass


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    binary = require_prometheus()
    work = tmp_path_factory.mktemp("grafana")
    jobs = self_scrape_jobs()
    store_root = work / "store"
    asyncio.run(prepare_store(store_root))
    started: list[subprocess.Popen[bytes]] = []
    launcher = CollectorLauncher(work / "collectors")
    ports = {"collector": free_port(), "reconciler": free_port()}
    prometheus_port = free_port()
    try:
        # Everything starts at once; each is then awaited (their start-ups overlap).
        reconciler_log = work / "reconciler.log"
        started.append(start_reconciler(store_root, ports["reconciler"], work, reconciler_log))
        prometheus_log = work / "prometheus.log"
        started.append(start_prometheus(binary, work, jobs, ports, prometheus_port, prometheus_log))
        collector = launcher.start(store_url=f"file://{store_root}", port=ports["collector"])
        wait_ready(f"http://127.0.0.1:{ports['reconciler']}/metrics", started[0], reconciler_log)
        url = f"http://127.0.0.1:{prometheus_port}"
        wait_ready(f"{url}/-/ready", started[1], prometheus_log)
        yield World(url, collector.base_url, frozenset(jobs))
    finally:
        for process in reversed(started):
            stop(process)
        launcher.stop_all()


def start_reconciler(store_root: Path, port: int, work: Path, log: Path) -> subprocess.Popen[bytes]:
    script = Path(sys.executable).parent / "lm-reconciler"
    settings = {
        "LM_STORE__URL": f"file://{store_root}",
        "LM_METRICS__HOST": "127.0.0.1",
        "LM_METRICS__PORT": str(port),
        "LM_RECONCILER__LOOP_INTERVAL_S": "0.5",
        "LM_LOGGING__FORMAT": "json",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(script), "run"],
            env=collector_env(settings),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=work,
        )


def start_prometheus(
    binary: str, work: Path, jobs: dict[str, str], ports: dict[str, int], port: int, log: Path
) -> subprocess.Popen[bytes]:
    """A throwaway Prometheus scraping each daemon under its self-scrape job name."""
    scrape_configs = "".join(
        f"""
  - job_name: {job}
    static_configs:
      - targets: ["127.0.0.1:{ports[kind]}"]"""
        for job, kind in sorted(jobs.items())
    )
    (work / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  scrape_timeout: {SCRAPE_INTERVAL}\n"
        f"scrape_configs:{scrape_configs}\n"
    )
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                binary,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=work,
        )


async def prometheus_get(
    session: aiohttp.ClientSession, url: str, path: str, params: Any, method: str = "GET"
) -> dict[str, Any]:
    if method == "POST":
        call = session.post(url + path, data=params)
    else:
        call = session.get(url + path, params=params)
    async with call as answer:
        body: dict[str, Any] = await answer.json()
        assert answer.status == 200 and body["status"] == "success", (path, params, body)
        return body


def numbers(body: dict[str, Any]) -> int:
    """How many non-NaN samples an answer holds."""
    data = body["data"]
    if data["resultType"] == "scalar":
        return 0 if math.isnan(float(data["result"][1])) else 1
    count = 0
    for series in data["result"]:
        values = series.get("values") or [series["value"]]
        count += sum(1 for _t, v in values if not math.isnan(float(v)))
    return count


async def run_panels(
    session: aiohttp.ClientSession, world: World, requests: list[PanelRequest]
) -> dict[tuple[str, str], int]:
    found = {}
    for request in requests:
        body = await prometheus_get(session, world.prometheus_url, request.path, request.params())
        found[(request.panel_title, request.ref_id)] = numbers(body)
    return found


def grafana_time(scrape: str = SCRAPE_INTERVAL) -> GrafanaTime:
    end_ms = int(time.time() * 1000)
    return GrafanaTime(end_ms - RANGE_MS, end_ms, max_data_points=1_000, scrape_interval=scrape)


async def test_every_health_panel_returns_numbers_from_the_daemons_metrics(world: World) -> None:
    dashboard = load_dashboard(HEALTH)
    variables = {v.name: v for v in template_variables(dashboard)}
    deadline = time.monotonic() + DEADLINE_S
    sent = 0
    async with aiohttp.ClientSession() as session:
        while True:
            # A batch each round: acceptance, acknowledgement latency and store latency move.
            frame = make_frame("grafana-test", seq_start=3 * sent)
            answer = await post_frame(session, world.collector_url, frame)
            assert answer.status == 200, answer.text
            sent += 1
            span = grafana_time()
            job = variable_request(variables["job"], span, variables, {})
            listed = await prometheus_get(session, world.prometheus_url, job.path, job.params)
            requests = panel_requests(dashboard, span, {"job": ALL})
            found = await run_panels(session, world, requests)
            empty = sorted(k for k, n in found.items() if n == 0 and k not in ALLOWED_EMPTY)
            if not empty and set(job.options(listed["data"])) == world.jobs:
                break
            assert time.monotonic() < deadline, f"still empty after {DEADLINE_S}s: {empty}"
            await asyncio.sleep(1.0)  # polling with a deadline, not a sleep to pass
    panels = {title for title, _ref in found}
    assert len(panels) >= 14 and all(n > 0 for k, n in found.items() if k not in ALLOWED_EMPTY)
    print(f"health: {len(found)} targets of {len(panels)} panels with numbers after {sent} rounds")


async def test_every_fleet_panel_returns_numbers_with_variables_from_the_names_api(
    world: World,
) -> None:
    dashboard = load_dashboard(FLEET)
    variables = template_variables(dashboard)
    by_name = {v.name: v for v in variables}
    wanted = {  # series both daemons export from their start, whatever ran before
        "counter": "lm_collector_accepted_points_total",
        "histogram": "lm_store_request_seconds",
        "gauge": "lm_collector_in_flight_requests",
    }
    deadline = time.monotonic() + DEADLINE_S
    async with aiohttp.ClientSession() as session:
        while True:
            span = grafana_time()
            values: dict[str, str | list[str]] = {}
            options = {}
            for variable in variables:  # in order: $instance's query uses $job
                request = variable_request(variable, span, by_name, values)
                body = await prometheus_get(
                    session, world.prometheus_url, request.path, request.params
                )
                options[variable.name] = request.options(body["data"])
                values[variable.name] = ALL if variable.include_all else wanted[variable.name]
            ready = (
                all(wanted[n] in options[n] for n in wanted) and set(options["job"]) == world.jobs
            )
            found = (
                await run_panels(session, world, panel_requests(dashboard, span, values))
                if ready
                else {}
            )
            empty = sorted(k for k, n in found.items() if n == 0)
            if ready and not empty:
                break
            assert time.monotonic() < deadline, f"not there after {DEADLINE_S}s: {options}, {empty}"
            await asyncio.sleep(1.0)  # polling with a deadline, not a sleep to pass
    assert len({title for title, _ref in found}) >= 8


async def test_grafanas_own_requests_are_answered(world: World) -> None:
    span = grafana_time()
    async with aiohttp.ClientSession() as session:
        for request in datasource_requests(span, metric="up", method="POST"):
            data = aiohttp.FormData(list(request.params)) if request.method == "POST" else None
            params = None if request.method == "POST" else list(request.params)
            call = session.request(
                request.method, world.prometheus_url + request.path, data=data, params=params
            )
            async with call as answer:
                body = await answer.json()
                assert answer.status == 200 and body["status"] == "success", (request, body)
            if request.what in ("metric names", "label values of a metric", "series of a metric"):
                assert body["data"], request


def test_a_prometheus_api_client_nobody_here_wrote_reads_the_same(world: World) -> None:
    """prometheus-api-client (PyPI) over the calls Grafana makes: names, label values,
    series, metadata, an instant and a range query with a Grafana-style window. The
    end-to-end test points the same calls at the query collector, with its read token."""
    from prometheus_api_client import PrometheusConnect

    client = PrometheusConnect(url=world.prometheus_url, headers={"Authorization": "Bearer x"})
    deadline = time.monotonic() + DEADLINE_S
    while True:  # both daemons scraped twice since their first store requests
        end = datetime.now(UTC)
        start = end - timedelta(milliseconds=RANGE_MS)
        match = {"match[]": "lm_store_request_seconds_count"}
        series = client.get_series(start, end, params=match)
        ranged = client.custom_query_range(
            "sum by (job) (rate(lm_store_request_seconds_count[4s]))",  # $__rate_interval at 1s
            start_time=start,
            end_time=end,
            step="1",
        )
        found = (frozenset(s["job"] for s in series), frozenset(r["metric"]["job"] for r in ranged))
        if found == (world.jobs, world.jobs):
            break
        assert time.monotonic() < deadline, found
        time.sleep(0.5)  # polling with a deadline, not a sleep to pass
    names = set(client.all_metrics())
    assert {"up", "lm_store_request_seconds_bucket", "lm_collector_accepted_points_total"} <= names
    assert {"job", "instance", "op", "result"} <= set(client.get_label_names())
    assert set(client.get_label_values("job")) == world.jobs
    assert isinstance(client.get_metric_metadata("up"), (dict, list))
    assert client.custom_query("1+1")[1] == "2"  # a scalar: [time, "2"]
