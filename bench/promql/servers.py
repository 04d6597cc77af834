"""The processes the benchmark measures, each on 127.0.0.1 and stopped by its PID: a query
collector (``lm-collector serve``) over a copy of a cached store, supervising its PromQL
engine (Prometheus 2.42 reading the collector's remote read), and the reference
Prometheus over a copy of the backfilled TSDB. HTTP helpers (blocking, for threads) and
CPU/RSS readings of a process tree from ``/proc``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import free_ports, stop_pid_process
from bench.proc_tree import tree_cpu, tree_pids, tree_rss
from collector.launch import CollectorProcess, start_collector
from config import hash_token

PROMETHEUS = "/usr/bin/prometheus"
READ_TOKEN = "bench-promql-read-token"
START_TIMEOUT_S = 120.0


def hardlink_copy(source: Path, target: Path) -> Path:
    """A copy of ``source`` whose files are hard links (instant; writers replace files)."""
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(["cp", "-al", str(source), str(target)], check=True)
    return target


def get_json(url: str, params: dict[str, str], token: str | None, timeout_s: float = 900.0) -> Any:
    """GET ``url?params``; the decoded JSON (any status: Prometheus answers errors in JSON)."""
    request = urllib.request.Request(url + "?" + urllib.parse.urlencode(params))
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        body = error.read()
        try:
            return json.loads(body)
        except ValueError:
            return {"status": "error", "error": f"HTTP {error.code}: {body[:200]!r}"}


def get_text(url: str, token: str | None = None) -> str:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=60) as response:
        return str(response.read().decode())


@dataclass
class Target:
    """Something that answers the Prometheus HTTP API, and the process tree it runs in."""

    name: str
    url: str
    pid: int
    token: str | None

    def query(self, path: str, params: dict[str, str]) -> Any:
        return get_json(self.url + path, params, self.token)

    def cpu(self) -> float:
        return tree_cpu(self.pid)

    def rss(self) -> int:
        return sum(tree_rss(p) for p in tree_pids(self.pid))

    def rss_parts(self) -> dict[str, int]:
        """RSS of the process itself (``main``) and of its descendants (``children``)."""
        pids = tree_pids(self.pid)
        return {"main": tree_rss(self.pid), "children": sum(tree_rss(p) for p in pids[1:])}

    def pids(self) -> list[int]:
        return tree_pids(self.pid)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                answer = self.query("/api/v1/query", {"query": "1+1", "time": "0"})
            except OSError as error:  # not listening yet
                answer = {"error": str(error)}
            if answer.get("status") == "success":
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready: {answer}")
            time.sleep(0.2)  # polling for readiness, bounded by the deadline


@dataclass
class Collector:
    process: CollectorProcess
    target: Target

    def stop(self) -> None:
        self.process.stop(20.0)


def tokens_file(path: Path) -> Path:
    path.write_text(
        "[[principal]]\n"
        f'name = "grafana"\ntoken_sha256 = "{hash_token(READ_TOKEN)}"\nagents = []\nread = true\n'
    )
    return path


def collector_settings(store_url: str, work: Path, engine: bool) -> dict[str, str]:
    env = {
        "LM_STORE__URL": store_url,
        "LM_HTTP__HOST": "127.0.0.1",
        "LM_INGEST__COLLECTOR_ID": "bench-query",
        "LM_AUTH__TOKENS_FILE": str(tokens_file(work / "tokens.toml")),
        "LM_METRICS__ENABLED": "true",
        "LM_LOGGING__LEVEL": "WARNING",
    }
    if engine:
        env["LM_QUERY__PROMQL__PROMETHEUS"] = PROMETHEUS
        env["LM_QUERY__PROMQL__CREDENTIALS_DIR"] = str(work / "engine")
    return env


def start_query_collector(
    store_url: str, work: Path, *, engine: bool = True, extra: dict[str, str] | None = None
) -> Collector:
    work.mkdir(parents=True, exist_ok=True)
    env = {**collector_settings(store_url, work, engine), **(extra or {})}
    process = start_collector(work_dir=work, name="query", env=env, timeout_s=START_TIMEOUT_S)
    target = Target("ours", process.url, process.pid, READ_TOKEN)
    collector = Collector(process, target)
    try:
        if engine:
            target.wait_ready()
    except BaseException:
        collector.stop()
        raise
    return collector


@dataclass
class Reference:
    process: subprocess.Popen[bytes]
    target: Target

    def stop(self) -> None:
        stop_pid_process(self.process)


def start_reference(blocks: Path, work: Path, *, lookback_s: float = 300.0) -> Reference:
    """Prometheus 2.42 over a hard-linked copy of the backfilled blocks (it compacts and
    writes its WAL there), no scrapes, the engine's lookback delta."""
    work.mkdir(parents=True, exist_ok=True)
    tsdb = hardlink_copy(blocks, work / "tsdb")
    config = work / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1h\n")
    (port,) = free_ports(1)
    log = (work / "reference.log").open("ab")
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb}",
            "--storage.tsdb.retention.time=3650d",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--query.lookback-delta={lookback_s:g}s",
            "--query.max-concurrency=20",
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    reference = Reference(
        process, Target("reference", f"http://127.0.0.1:{port}", process.pid, None)
    )
    try:
        reference.target.wait_ready()
    except BaseException:
        reference.stop()
        raise
    return reference


def store_requests(collector: Collector) -> dict[str, float]:
    """``lm_store_request_seconds_count`` by ``op`` from the collector's ``/metrics``."""
    out: dict[str, float] = {}
    for line in get_text(collector.target.url + "/metrics").splitlines():
        if line.startswith("lm_store_request_seconds_count{"):
            labels, value = line.rsplit(" ", 1)
            op = labels.split('op="', 1)[1].split('"', 1)[0]
            out[op] = out.get(op, 0.0) + float(value)
    return out


def load() -> tuple[float, float, float]:
    return os.getloadavg()
