"""The demo's receiver step (``lm-demo --receivers``): metrics in as Prometheus sends them.

Sends ``requests`` Prometheus remote_write v1 requests (snappy ``WriteRequest`` bodies, as
Prometheus builds them) to the first collector, then every one of them again to the
second collector, as a sender retrying after a lost answer would. Each request becomes
one frame under an identity derived from its points, so the first round is accepted and
every re-send is answered as a duplicate by the other collector. The accepted batches
are added to the run's ground truth, so the demo's store checks and rollup totals cover
them like the agents' batches.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import cramjam

from agent.truth import BatchKind, GroundTruth, TruthRecord
from collector.receivers.proto.wire_pb2 import WriteRequest
from protocol.keys import BatchIdentity

AGENT_ID = "prometheus-demo"
HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
    "X-Lightmetrics-Agent-Id": AGENT_ID,
}
HOSTS = ("web-1", "web-2", "db-1")


def write_request(index: int, start_ms: int, samples_per_series: int) -> tuple[bytes, int, float]:
    """Request ``index``: a counter and a gauge per host, 15 s apart. Returns the body,
    the number of samples and their value sum."""
    request = WriteRequest()
    values: list[float] = []
    for host in HOSTS:
        for name, base in (("node_cpu_seconds_total", 1000.0), ("node_load1", 0.5)):
            series = request.timeseries.add()
            series.labels.add(name="__name__", value=name)
            series.labels.add(name="instance", value=f"{host}:9100")
            series.labels.add(name="job", value="node")
            for step in range(samples_per_series):
                sample = index * samples_per_series + step
                value = base + sample * (1.5 if name.endswith("_total") else 0.01)
                series.samples.add(value=value, timestamp=start_ms + sample * 15_000)
                values.append(value)
    body = bytes(cramjam.snappy.compress_raw(request.SerializeToString()))
    return body, len(values), math.fsum(values)


async def send(
    urls: list[str],
    truth: GroundTruth,
    step: Callable[[str], None],
    *,
    start_ns: int,
    requests: int = 8,
    samples_per_series: int = 20,
) -> list[str]:
    """Send the requests (first round to ``urls[0]``, re-sends to ``urls[-1]``); record
    what was acknowledged in ``truth``. Returns problems (unexpected answers)."""
    start_ms = start_ns // 1_000_000
    bodies = [write_request(i, start_ms, samples_per_series) for i in range(requests)]
    step(
        f"remote_write: {requests} Prometheus requests ({bodies[0][1]} samples each) to "
        f"{urls[0]}/api/v1/write, then each again to {urls[-1]}"
    )
    problems: list[str] = []
    outcomes: dict[str, int] = {}
    async with aiohttp.ClientSession() as session:
        for kind, url in ((BatchKind.ORIGINAL, urls[0]), (BatchKind.DUPLICATE, urls[-1])):
            for body, count, value_sum in bodies:
                status, answer = await _post(session, url, body)
                if status != 200:
                    problems.append(f"remote_write to {url} answered {status}: {answer}")
                    continue
                outcome = "duplicate" if answer["duplicate"] else "accepted"
                outcomes[f"{kind.value}:{outcome}"] = outcomes.get(f"{kind.value}:{outcome}", 0) + 1
                identity = BatchIdentity(
                    answer["agent_id"],
                    uuid.UUID(answer["boot_id"]),
                    answer["seq_start"],
                    answer["seq_end"],
                )
                record = TruthRecord(kind, identity, answer["frame_sha256"], count, value_sum)
                truth.record_sent(record)
                truth.record_outcome(record, outcome)
    step(f"remote_write answers: {dict(sorted(outcomes.items()))}")
    if outcomes != {"original:accepted": requests, "duplicate:duplicate": requests}:
        problems.append(f"remote_write: expected {requests} accepted then {requests} duplicates")
    return problems


async def _post(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, Any]:
    async with session.post(f"{url}/api/v1/write", data=body, headers=HEADERS) as response:
        return response.status, await response.json()
