"""The reference of the differential test: a real Prometheus 2.42 holding the fleet's
samples in its own TSDB (issue 32).

**How it is fed: remote write, in global time order**, through
``--web.enable-remote-write-receiver``. The other way the issue allows, backfilling with
``promtool tsdb create-blocks-from openmetrics``, cannot carry a stale marker: OpenMetrics
text writes a value as a decimal, and Prometheus parses ``NaN`` to its ordinary NaN
(``0x7ff8000000000001``), never the staleness NaN ``0x7ff0000000000002``; a series
backfilled so would keep answering for the lookback delta after it stopped, where ours
(which keeps the stored bits, PROTOCOL §5) ends at once. A remote-write sample is a
protobuf ``double``: its bits reach the TSDB unchanged, stale markers included.

A fresh Prometheus head accepts any first timestamp, then anything within an hour of the
newest sample (half the 2 h block range) that is newer than its own series' last; the
fleet goes out in slices of `SLICE_MS` of global time, every series' samples of one slice
in one request, so old fixed timestamps are accepted whatever today's date is. Two hours
never reach the head's compaction threshold (1.5 times 2 h), so nothing is compacted or
dropped while the test runs. `assert_clean` then checks that the TSDB refused nothing:
its out-of-bounds, out-of-order and duplicate-timestamp counters are 0 and its head holds
exactly the fleet's sample count.

The process listens on 127.0.0.1 only and is stopped by its PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import cramjam
import numpy as np

from chaos.s3_server import die_with_parent_hook
from collector.receivers.proto.wire_pb2 import WriteRequest
from config.query_settings import PromqlSettings
from tests.collector.conftest import free_port
from tests.collector.promql.diff.fleet import Fleet

SLICE_MS = 10 * 60 * 1000
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
REFUSED_COUNTERS = (
    # Prometheus 2.42's names; a remote-write append refused for these is counted here
    # (the handler answers 400 as well, which `feed` checks too).
    "prometheus_tsdb_out_of_bound_samples_total",
    "prometheus_tsdb_out_of_order_samples_total",
    "prometheus_tsdb_too_old_samples_total",
    "prometheus_target_scrapes_sample_duplicate_timestamp_total",
    "prometheus_target_scrapes_sample_out_of_bounds_total",
    "prometheus_target_scrapes_sample_out_of_order_total",
)


def lookback_delta() -> str:
    """The engine's ``--query.lookback-delta`` (PROTOCOL §5: the default unless configured
    in both), as a Prometheus duration."""
    seconds = PromqlSettings().lookback_delta_s
    return f"{int(seconds * 1000)}ms"


@dataclass
class ReferencePrometheus:
    binary: str
    work_dir: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ReferencePrometheus:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1h\n")  # no scrape jobs at all
        self.port = free_port()
        log = (self.work_dir / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.work_dir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-remote-write-receiver",
                f"--query.lookback-delta={lookback_delta()}",
                "--log.level=warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent_hook(),
        )
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        delay = 0.05
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"reference prometheus exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(delay * (0.5 + np.random.default_rng().random()))  # bounded, jittered
            delay = min(delay * 2, 0.5)
        raise RuntimeError(f"reference prometheus not ready in {START_TIMEOUT_S}s")

    def log_tail(self, chars: int = 3000) -> str:
        path = self.work_dir / "prometheus.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_S)

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        request = urllib.request.Request(
            f"{self.base_url}{path}", data=body, headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def get_text(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.base_url}{path}", timeout=30) as answer:
            return str(answer.read().decode())

    def feed(self, fleet: Fleet) -> int:
        """Send every sample of ``fleet`` by remote write, in slices of global time;
        returns the number of requests. Any refusal fails."""
        requests = 0
        first, last = int(fleet.all_ts_ms().min()), int(fleet.all_ts_ms().max())
        headers = {
            "Content-Type": "application/x-protobuf",
            "Content-Encoding": "snappy",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
        }
        for start in range(first - first % SLICE_MS, last + 1, SLICE_MS):
            body = write_request(fleet, start, start + SLICE_MS)
            status, text = self.post("/api/v1/write", body, headers)
            assert status == 204, f"reference refused a remote write: {status} {text[:500]!r}"
            requests += 1
        return requests

    def metric(self, name: str) -> float:
        """The sum of every sample of ``name`` in the reference's own /metrics (0 when
        absent: a counter that was never touched)."""
        total = 0.0
        for line in self.get_text("/metrics").splitlines():
            if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
                total += float(line.rpartition(" ")[2])
        return total

    def assert_clean(self, fleet: Fleet) -> dict[str, float]:
        """Nothing refused, and the head holds exactly the fleet's samples."""
        counters = {name: self.metric(name) for name in REFUSED_COUNTERS}
        assert all(value == 0 for value in counters.values()), counters
        appended = self.metric("prometheus_tsdb_head_samples_appended_total")
        assert appended == fleet.samples, (appended, fleet.samples)
        return counters


def write_request(fleet: Fleet, start_ms: int, end_ms: int) -> bytes:
    """A snappy remote-write body of every fleet sample in ``[start_ms, end_ms)``, each
    series under its presented label set (sorted by name)."""
    request = WriteRequest()
    for series in fleet.series:
        lo, hi = np.searchsorted(series.ts_ms, [start_ms, end_ms])
        if lo == hi:
            continue
        entry = request.timeseries.add()
        for name, value in series.presented:
            entry.labels.add(name=name, value=value)
        timestamps = series.ts_ms[lo:hi].tolist()
        values = series.values[lo:hi].tolist()  # Python floats keep the NaN's bits
        for value, timestamp in zip(values, timestamps, strict=True):
            entry.samples.add(value=value, timestamp=timestamp)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))
