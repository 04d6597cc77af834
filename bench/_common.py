"""Shared benchmark parts: process accounting from /proc, percentiles, frames with fresh
identities, a delay-line proxy in front of an S3 server, collectors with N workers, and
Prometheus scrapes.

Benchmarks are not tests: nothing here is imported by ``tests/``. Every process started
here is stopped by its PID (SIGTERM, then SIGKILL past a deadline); children that can be
tied to this process's life get ``PR_SET_PDEATHSIG`` as well.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import structlog
from prometheus_client.parser import text_string_to_metric_families

from bench.proc_stats import CLOCK_TICKS as CLOCK_TICKS
from bench.proc_stats import CpuMeter as CpuMeter
from bench.proc_stats import busy_cpu_seconds as busy_cpu_seconds
from bench.proc_stats import cpu_seconds as cpu_seconds
from bench.proc_stats import listen_overflows as listen_overflows
from bench.proc_stats import machine_cpu_seconds as machine_cpu_seconds
from bench.proc_stats import peak_rss_bytes as peak_rss_bytes
from bench.proc_stats import rss_bytes as rss_bytes
from bench.proc_stats import rss_split_bytes as rss_split_bytes
from bench.proc_stats import wait_for_quiet as wait_for_quiet
from collector.launch import CollectorProcess, LaunchError, start_collector
from protocol.keys import BatchIdentity

REPO_ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
STOP_TIMEOUT_S = 20.0

# --- /proc accounting ----------------------------------------------------------------------


def publish(text: str, summary: object, args: argparse.Namespace) -> None:
    """Print a benchmark's report, and write it to ``args.markdown`` and its summary as
    JSON to ``args.json`` when given."""
    print(text, flush=True)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2, default=str))


def exit_on_sigterm(signum: int, _frame: object) -> None:
    """A SIGTERM handler that ends the run like Ctrl-C (``finally`` blocks stop children)."""
    raise SystemExit(128 + signum)


def fast_temp_root(need_bytes: int = 0) -> str:
    """/dev/shm when it is writable and has room for ``need_bytes`` three times over
    (creating files on this VM's shared disk is slow), else the system's temp directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        if not need_bytes or shutil.disk_usage(shm).free > 3 * need_bytes:
            return str(shm)
    return tempfile.gettempdir()


def percentile(sorted_values: Sequence[float], percent: float) -> float:
    """Nearest-rank percentile of already sorted values (NaN when there are none)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(percent / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


# --- frames with fresh identities ----------------------------------------------------------

_BOOT_ID = slice(8, 24)  # PROTOCOL §1: boot_id is bytes [8, 24) of the header


@dataclass(frozen=True, slots=True)
class BenchFrame:
    frame: bytes
    identity: BatchIdentity
    frame_sha256: str
    points: int


class FrameSource:
    """Unique frames from a few templates: frame ``i`` is template ``i % len`` with a
    boot_id of its own (and so its own identity, bytes and SHA-256).

    Building a 64 KiB frame with the agent's generator costs ~10 ms of CPU; re-stamping
    the boot_id and CRC of a built one costs ~0.05 ms, so frames are made as they are
    sent, in the driver, identically for the baseline and the collector.
    """

    def __init__(self, templates: Sequence[bytes], identities: Sequence[BatchIdentity]) -> None:
        if not templates or len(templates) != len(identities):
            raise ValueError("need one identity per template, and at least one template")
        self._templates = list(templates)
        self._identities = list(identities)
        self._salt = uuid.uuid4().bytes[:8]  # unique per run: frames never repeat across runs
        self._next = 0

    @property
    def frame_bytes(self) -> int:
        return len(self._templates[0])

    def take(self) -> BenchFrame:
        index = self._next
        self._next += 1
        template = self._templates[index % len(self._templates)]
        template_identity = self._identities[index % len(self._identities)]
        boot_id = uuid.UUID(bytes=self._salt + index.to_bytes(8, "big"), version=4)
        body = template[: _BOOT_ID.start] + boot_id.bytes + template[_BOOT_ID.stop : -4]
        frame = body + zlib.crc32(body).to_bytes(4, "big")
        identity = BatchIdentity(
            template_identity.agent_id,
            boot_id,
            template_identity.seq_start,
            template_identity.seq_end,
        )
        points = template_identity.seq_end - template_identity.seq_start + 1
        return BenchFrame(frame, identity, hashlib.sha256(frame).hexdigest(), points)


# --- child processes -----------------------------------------------------------------------


def stop_pid_process(process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM ``process`` by its PID, wait, then SIGKILL. Idempotent."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


def free_ports(count: int) -> list[int]:
    """``count`` consecutive free loopback ports (the collector's per-worker metrics ports
    are ``base + index``)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return list(range(base, base + count))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports found")


# --- the delay-line proxy ------------------------------------------------------------------


# --- collectors ----------------------------------------------------------------------------


@dataclass
class CollectorWorkers:
    """A running ``lm-collector serve`` with one or more workers.

    ``worker_pids`` are the processes that serve requests (with one worker, the serving
    process itself; with ``--workers N``, the N spawned workers, not the supervisor)."""

    supervisor: CollectorProcess
    url: str
    worker_pids: list[int]
    metrics_urls: list[str]
    extra_pids: list[int] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return self.worker_pids

    def stop(self) -> None:
        self.supervisor.stop(STOP_TIMEOUT_S)
        # If the supervisor had to be killed, its workers may be left: stop them by PID.
        for pid in self.worker_pids:
            if pid != self.supervisor.pid and _is_collector_worker(pid):
                os.kill(pid, signal.SIGKILL)


def _is_collector_worker(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"multiprocessing" in cmdline


def start_collector_workers(
    *,
    work_dir: Path,
    name: str,
    env: dict[str, str],
    workers: int,
    extra_args: tuple[str, ...] = (),
    command_prefix: tuple[str, ...] = (),
    timeout_s: float = 60.0,
) -> CollectorWorkers:
    """Start a collector. One worker: `collector.launch.start_collector`. N workers: a
    fixed port and per-worker metrics ports, waiting for each ``<ready-file>.<index>``
    (``start_collector`` waits for the bare ready file, which only a 1-worker collector
    writes)."""
    if workers == 1 and not command_prefix:
        single = start_collector(
            work_dir=work_dir, name=name, env=env, args=extra_args, timeout_s=timeout_s
        )
        return CollectorWorkers(single, single.url, [single.pid], [single.url + "/metrics"])
    http_port, *metrics_ports = free_ports(1 + workers)
    child_env = {
        **os.environ,
        "LM_LOGGING__FORMAT": "json",
        **env,
        "LM_HTTP__PORT": str(http_port),
        "LM_METRICS__ENABLED": "true",
        "LM_METRICS__PORT": str(metrics_ports[0]),
    }
    work_dir.mkdir(parents=True, exist_ok=True)
    ready_file = work_dir / f"{name}.ready.json"
    ready_files = (
        [ready_file] if workers == 1 else [Path(f"{ready_file}.{i}") for i in range(workers)]
    )
    for path in ready_files:
        path.unlink(missing_ok=True)
    log_path = work_dir / f"{name}.log"
    command = [
        *(command_prefix or (sys.executable,)),
        "-m",
        "collector",
        "serve",
        "--ready-file",
        str(ready_file),
        "--workers",
        str(workers),
        *extra_args,
    ]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=REPO_ROOT
        )
    supervisor = CollectorProcess(
        process, f"http://127.0.0.1:{http_port}", log_path, ready_file, env
    )
    deadline = time.monotonic() + timeout_s
    while not all(path.exists() for path in ready_files):
        if process.poll() is not None or time.monotonic() > deadline:
            supervisor.stop(STOP_TIMEOUT_S)
            tail = log_path.read_text(errors="replace")[-3000:]
            raise LaunchError(f"collector {name} did not become ready:\n{tail}")
        time.sleep(0.05)  # polling for readiness, bounded by the deadline
    pids = [int(json.loads(path.read_text())["pid"]) for path in ready_files]
    if workers == 1:
        metrics_urls = [supervisor.url + "/metrics"]
    else:
        metrics_urls = [f"http://127.0.0.1:{port}/metrics" for port in metrics_ports]
    return CollectorWorkers(supervisor, supervisor.url, pids, metrics_urls)


# --- Prometheus scrapes --------------------------------------------------------------------

MetricKey = tuple[str, tuple[tuple[str, str], ...]]


class MetricsSnapshot:
    """Every sample of one or more ``/metrics`` pages, summed over the pages (workers)."""

    def __init__(self, samples: dict[MetricKey, float]) -> None:
        self.samples = samples

    @classmethod
    def parse(cls, pages: Iterable[str]) -> MetricsSnapshot:
        samples: dict[MetricKey, float] = {}
        for page in pages:
            for family in text_string_to_metric_families(page):
                for sample in family.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    samples[key] = samples.get(key, 0.0) + float(sample.value)
        return cls(samples)

    def value(self, name: str, **labels: str) -> float:
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """``{label value: sample}`` of every sample of ``name`` (other labels summed)."""
        found: dict[str, float] = {}
        for (sample_name, labels), value in self.samples.items():
            if sample_name == name:
                key = ",".join(f"{k}={v}" for k, v in labels if k == label or label == "*")
                found[key] = found.get(key, 0.0) + value
        return found

    def minus(self, earlier: MetricsSnapshot) -> MetricsSnapshot:
        keys = set(self.samples) | set(earlier.samples)
        return MetricsSnapshot(
            {k: self.samples.get(k, 0.0) - earlier.samples.get(k, 0.0) for k in keys}
        )


async def scrape(session: aiohttp.ClientSession, urls: Sequence[str]) -> MetricsSnapshot:
    pages = []
    for url in urls:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as answer:
            answer.raise_for_status()
            pages.append(await answer.text())
    return MetricsSnapshot.parse(pages)


# --- why the uploader retried ----------------------------------------------------------------


class RetryTally:
    """A structlog processor counting the agent uploader's ``batch_retry`` events by HTTP
    status or network error type (the uploader reports only each batch's last answer)."""

    def __init__(self) -> None:
        self.reasons: Counter[str] = Counter()

    def __call__(
        self, _logger: object, _method: str, event_dict: structlog.typing.EventDict
    ) -> structlog.typing.EventDict:
        if event_dict.get("event") == "batch_retry":
            status = event_dict.get("status")
            error = str(event_dict.get("error") or "?")
            self.reasons[f"HTTP {status}" if status else error.split(":", 1)[0]] += 1
        return event_dict

    def snapshot(self) -> Counter[str]:
        return Counter(self.reasons)


def install_retry_tally() -> RetryTally:
    """Put a `RetryTally` in front of the configured structlog processors and let debug
    events reach it (the stdlib handler's level still drops them afterwards)."""
    tally = RetryTally()
    processors = structlog.get_config()["processors"]
    structlog.configure(
        processors=[tally, *processors],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
    )
    return tally
