"""Every Grafana panel of deploy/grafana returns data through the query collector's own
API, from the daemons' own metrics (issue 32 item 5, the end-to-end form): the system
scrapes itself into its store.

Real processes over one filesystem store: an ``lm-collector`` that ingests, an
``lm-reconciler``, and a query collector (``query.designated``: it follows the index log)
whose ``[query.promql] prometheus`` engine is a real Prometheus 2.42 reading the
collector's ``POST /api/v1/read``. ``lm-agent scrape`` scrapes each daemon's ``/metrics``
under the job names of the self-scrape config (deploy/systemd/self-scrape.toml) and sends
the samples as frames to the ingesting collector; nothing else writes them. Then, through
the query collector's ``/api/v1/...`` with a bearer read token:

- each panel's request of both dashboards, computed as Grafana 12.2 computes it
  (`tests.deploy.grafana_panels`; the fleet dashboard's variables from our names API),
  must return at least one number;
- the requests Grafana's data source makes on its own (`tests.deploy.grafana_requests`)
  are each answered ``success``;
- prometheus-api-client (PyPI), which nobody here wrote, reads the same.

Every wait is bounded polling against a deadline; processes are stopped by PID.
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

from agent.health import SELF_JOB
from config import hash_token, load_settings
from protocol.clock import SystemClock
from reconciler.daemon import Reconciler
from rollup.table.ledger import LedgerRow
from rollup.table.owner import OwnerLease
from store.fs import FileSystemStore
from tests.collector.conftest import CollectorLauncher, collector_env, free_port
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
SCRAPE_INTERVAL_S = 1.0  # lm-agent scrape's interval = the data source's timeInterval
SCRAPE_INTERVAL = "1s"
RANGE_MS = 120_000
DEADLINE_S = 90.0
START_DEADLINE_S = 30.0
READ, WRITE = "lm-grafana-read-token", "lm-self-scrape-token"
AGENT_ID = "self-scrape-host-1"
ALLOWED_EMPTY = {
    ("Raw retention", "B"): "raw retention is off here (retention.raw_days): nothing retired",
}
"""Targets that may stay empty in this world, and why (every panel still has data)."""


@dataclass(frozen=True)
class World:
    api_url: str
    """The query collector: its /api/v1/... answers PromQL through its engine."""
    jobs: frozenset[str]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {READ}"}


def self_scrape_jobs() -> dict[str, str]:
    """job -> the kind of daemon, from the deploy file's targets."""
    settings = load_settings(SELF_SCRAPE, environ={})
    jobs = {target.labels["job"] for target in settings.scrape.targets}
    assert jobs == {"lightmetrics-collector", "lightmetrics-reconciler"}
    return {job: job.removeprefix("lightmetrics-") for job in jobs}


def write_tokens(path: Path) -> Path:
    path.write_text(
        "[[principal]]\n"
        f'name = "self-scrape"\ntoken_sha256 = "{hash_token(WRITE)}"\n'
        f'agents = ["{AGENT_ID}"]\n\n'
        "[[principal]]\n"
        f'name = "grafana"\ntoken_sha256 = "{hash_token(READ)}"\nagents = []\nread = true\n'
    )
    return path


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
        time.sleep(0.2 * random.uniform(0.5, 1.5))  # polling with a deadline


def daemon(
    argv: list[str], settings: dict[str, str], work: Path, log: Path
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            env=collector_env(settings),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=work,
        )


def start_reconciler(store_root: Path, port: int, work: Path, log: Path) -> subprocess.Popen[bytes]:
    settings = {
        "LM_STORE__URL": f"file://{store_root}",
        "LM_METRICS__HOST": "127.0.0.1",
        "LM_METRICS__PORT": str(port),
        "LM_RECONCILER__LOOP_INTERVAL_S": "0.5",
        "LM_LOGGING__FORMAT": "json",
    }
    return daemon([str(Path(sys.executable).parent / "lm-reconciler"), "run"], settings, work, log)


def start_self_scrape(
    work: Path, collector_url: str, targets: list[tuple[str, str]], log: Path
) -> subprocess.Popen[bytes]:
    """``lm-agent scrape`` of each (job, /metrics URL), delivering to ``collector_url``:
    the deploy file's job labels, a scrape a second, a frame a second."""
    (work / "self-scrape-token").write_text(WRITE + "\n")
    entries = "".join(
        f'\n[[scrape.targets]]\nurl = "{url}"\n'
        f'labels = {{ job = "{job}", instance = "host-1:{url.split(":")[2].split("/")[0]}" }}\n'
        for job, url in targets
    )
    (work / "self-scrape.toml").write_text(
        "[scrape]\n"
        f'agent_id = "{AGENT_ID}"\n'
        f'collector_urls = ["{collector_url}"]\n'
        f'token_file = "{work / "self-scrape-token"}"\n'
        f'spool_dir = "{work / "self-scrape-spool"}"\n'
        f"interval_s = {SCRAPE_INTERVAL_S}\ntimeout_s = {SCRAPE_INTERVAL_S}\n"
        f"flush_interval_s = {SCRAPE_INTERVAL_S}\nshutdown_grace_s = 2.0\n"
        f'{entries}\n[logging]\nformat = "json"\n'
    )
    agent = str(Path(sys.executable).parent / "lm-agent")
    return daemon([agent, "--config", str(work / "self-scrape.toml"), "scrape"], {}, work, log)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    binary = require_prometheus()
    work = tmp_path_factory.mktemp("grafana")
    jobs = self_scrape_jobs()
    store_root = work / "store"
    store_url = f"file://{store_root}"
    asyncio.run(prepare_store(store_root))
    tokens = write_tokens(work / "tokens.toml")
    started: list[subprocess.Popen[bytes]] = []
    launcher = CollectorLauncher(work / "collectors")
    common = {
        "LM_AUTH__TOKENS_FILE": str(tokens),
        "LM_INGEST__INDEX_FLUSH_MAX_AGE_MS": "200",
    }
    try:
        reconciler_port = free_port()
        reconciler_log = work / "reconciler.log"
        started.append(start_reconciler(store_root, reconciler_port, work, reconciler_log))
        ingest = launcher.start(store_url=store_url, name="ingest", env=common)
        query = launcher.start(
            store_url=store_url,
            name="query",
            env={
                **common,
                "LM_QUERY__DESIGNATED": "true",
                "LM_QUERY__POLL_INTERVAL_S": "0.3",
                "LM_QUERY__REFRESH_INTERVAL_S": "0.2",
                "LM_QUERY__PROMQL__PROMETHEUS": binary,
                "LM_QUERY__PROMQL__CREDENTIALS_DIR": str(work / "engine"),
            },
        )
        reconciler_url = f"http://127.0.0.1:{reconciler_port}/metrics"
        wait_ready(reconciler_url, started[0], reconciler_log)
        kinds = {kind: job for job, kind in jobs.items()}
        targets = [
            (kinds["collector"], f"{ingest.base_url}/metrics"),
            (kinds["collector"], f"{query.base_url}/metrics"),
            (kinds["reconciler"], reconciler_url),
        ]
        started.append(start_self_scrape(work, ingest.base_url, targets, work / "agent.log"))
        yield World(query.base_url, frozenset(jobs))
    finally:
        for process in reversed(started):
            stop(process)
        launcher.stop_all()


async def api_get(
    session: aiohttp.ClientSession, world: World, path: str, params: Any, method: str = "GET"
) -> dict[str, Any]:
    """One request to our API with the read token; must answer 200 ``success`` with no
    warning."""
    if method == "POST":
        call = session.post(world.api_url + path, data=params, headers=world.headers)
    else:
        call = session.get(world.api_url + path, params=params, headers=world.headers)
    async with call as answer:
        body: dict[str, Any] = await answer.json()
        assert answer.status == 200 and body["status"] == "success", (path, params, body)
        # The designated collector follows every collector's index log: complete answers.
        assert not body.get("warnings"), (path, params, body["warnings"])
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
        body = await api_get(session, world, request.path, request.params())
        found[(request.panel_title, request.ref_id)] = numbers(body)
    return found


def grafana_time(scrape: str = SCRAPE_INTERVAL) -> GrafanaTime:
    end_ms = int(time.time() * 1000)
    return GrafanaTime(end_ms - RANGE_MS, end_ms, max_data_points=1_000, scrape_interval=scrape)


@pytest.fixture(scope="module")
def scraped(world: World) -> World:
    """The world once its self-scrape has landed: lm_* series through our API (bounded
    polling; the engine answers 503 while it starts)."""

    async def wait() -> None:
        deadline = time.monotonic() + DEADLINE_S
        last: Any = None
        async with aiohttp.ClientSession() as session:
            while True:
                params = {"query": 'count({__name__=~"lm_.+"})'}
                async with session.get(
                    world.api_url + "/api/v1/query", params=params, headers=world.headers
                ) as answer:
                    last = (answer.status, await answer.json())
                if last[0] == 200 and last[1]["data"]["result"]:
                    return
                assert time.monotonic() < deadline, f"no lm_* series via our API: {last}"
                await asyncio.sleep(0.3 * random.uniform(0.5, 1.5))  # bounded polling

    asyncio.run(wait())
    return world


async def test_every_health_panel_returns_numbers_through_our_api(scraped: World) -> None:
    world = scraped
    dashboard = load_dashboard(HEALTH)
    variables = {v.name: v for v in template_variables(dashboard)}
    deadline = time.monotonic() + DEADLINE_S
    rounds = 0
    async with aiohttp.ClientSession() as session:
        while True:  # the self-scrape's own frames move acceptance, latency, store requests
            rounds += 1
            span = grafana_time()
            job = variable_request(variables["job"], span, variables, {})
            listed = await api_get(session, world, job.path, job.params)
            requests = panel_requests(dashboard, span, {"job": ALL})
            found = await run_panels(session, world, requests)
            empty = sorted(k for k, n in found.items() if n == 0 and k not in ALLOWED_EMPTY)
            if not empty and set(job.options(listed["data"])) == world.jobs:
                break
            assert time.monotonic() < deadline, f"still empty after {DEADLINE_S}s: {empty}"
            await asyncio.sleep(random.uniform(0.5, 1.0))  # polling with a deadline
    panels = {title for title, _ref in found}
    assert len(panels) >= 14 and all(n > 0 for k, n in found.items() if k not in ALLOWED_EMPTY)
    print(
        f"health: {len(found)} targets of {len(panels)} panels with numbers after {rounds} rounds"
    )


async def test_every_fleet_panel_returns_numbers_with_variables_from_our_names_api(
    scraped: World,
) -> None:
    world = scraped
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
                body = await api_get(session, world, request.path, request.params)
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
            await asyncio.sleep(random.uniform(0.5, 1.0))  # polling with a deadline
    assert len({title for title, _ref in found}) >= 8


async def test_grafanas_own_requests_are_answered_by_our_api(scraped: World) -> None:
    world = scraped
    span = grafana_time()
    async with aiohttp.ClientSession(headers=world.headers) as session:
        for request in datasource_requests(span, metric="up", method="POST"):
            data = aiohttp.FormData(list(request.params)) if request.method == "POST" else None
            params = None if request.method == "POST" else list(request.params)
            call = session.request(
                request.method, world.api_url + request.path, data=data, params=params
            )
            async with call as answer:
                body = await answer.json()
                assert answer.status == 200 and body["status"] == "success", (request, body)
            if request.what in ("metric names", "label values of a metric", "series of a metric"):
                assert body["data"], request


def test_a_prometheus_api_client_nobody_here_wrote_reads_our_api(scraped: World) -> None:
    """prometheus-api-client (PyPI) over the calls Grafana makes: names, label values,
    series, metadata, an instant and a range query with a Grafana-style window, against
    the query collector with its read token."""
    from prometheus_api_client import PrometheusConnect

    world = scraped
    client = PrometheusConnect(url=world.api_url, headers=world.headers)
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
        time.sleep(random.uniform(0.3, 0.7))  # polling with a deadline
    names = set(client.all_metrics())
    assert {"up", "lm_store_request_seconds_bucket", "lm_collector_accepted_points_total"} <= names
    assert {"job", "instance", "op", "result"} <= set(client.get_label_names())
    # The daemons' jobs, and the self-scrape agent's own health rows (`agent.health`).
    assert set(client.get_label_values("job")) == world.jobs | {SELF_JOB}
    assert isinstance(client.get_metric_metadata("up"), (dict, list))
    assert client.custom_query("1+1")[1] == "2"  # a scalar: [time, "2"]
