"""``POST /v1/metrics``: OTLP/HTTP metrics into frames.

The client is the OpenTelemetry Python SDK with its OTLP/HTTP exporter (protobuf,
gzip); JSON and malformed bodies are posted by hand. The SDK is synchronous, so it runs
in a worker thread while the in-process collector serves on the test's event loop.
"""

from __future__ import annotations

import asyncio
import gzip
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from collector.intake import HttpLimits
from collector.receivers.proto.wire_pb2 import Status
from tests.collector.conftest import CollectorLauncher
from tests.collector.inprocess import InProcessCollector
from tests.collector.receiver_fixtures import (
    LIMITS,
    STORE_KINDS,
    TOKENS_TOML,
    WRITER_TOKEN,
    AcceptedBatch,
    accepted_batches,
    in_process_collector,
    open_test_store,
    receiver_store_fixture,  # noqa: F401  # the receiver_store fixture
)
from tests.collector.test_processes import opened

NS0 = 1_760_000_000_000_000_000
PROTOBUF = {"Content-Type": "application/x-protobuf"}


@pytest.fixture
async def collector() -> AsyncIterator[InProcessCollector]:
    async with in_process_collector() as running:
        yield running


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened_session:
        yield opened_session


def record_with_the_sdk(base_url: str, agent: str = "otel-1") -> None:
    """Record a counter, an up-down counter, a histogram and a gauge; export them once
    through the SDK's OTLP/HTTP exporter (gzip). The store tells whether it landed."""
    exporter = OTLPMetricExporter(
        endpoint=f"{base_url}/v1/metrics",
        headers={"Authorization": f"Bearer {WRITER_TOKEN}", "X-Lightmetrics-Agent-Id": agent},
        compression=Compression.Gzip,
        timeout=10,
    )
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(
        resource=Resource.create({"service.name": "checkout"}), metric_readers=[reader]
    )
    meter = provider.get_meter("shop", "1.2")
    orders = meter.create_counter("orders")
    orders.add(3, {"region": "eu"})
    orders.add(2, {"region": "eu"})
    meter.create_up_down_counter("queue_depth").add(-4)
    latency = meter.create_histogram("latency_ms", explicit_bucket_boundaries_advisory=[10, 100])
    for value in (5, 50, 500):
        latency.record(value)
    meter.create_gauge("temperature").set(21.5, {"room": "a"})
    provider.shutdown()  # one last collection, exported once


def points_by_series(batch: AcceptedBatch) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    dropped = {"service.name", "service.instance.id", "otel.scope.name", "otel.scope.version"}
    found = {}
    for point in batch.points:
        labels = tuple(
            sorted(
                (k, v)
                for k, v in point["labels"].items()
                if k not in dropped and not k.startswith("telemetry.")
            )
        )
        found[(point["metric"], labels)] = point["value"]
    return found


CUMULATIVE = ("otel.temporality", "cumulative")


def check_sdk_points(batch: AcceptedBatch) -> None:
    series = points_by_series(batch)
    assert series == {
        ("orders", (("otel.monotonic", "true"), CUMULATIVE, ("region", "eu"))): 5.0,
        ("queue_depth", (("otel.monotonic", "false"), CUMULATIVE)): -4.0,
        ("latency_ms_count", (CUMULATIVE,)): 3.0,
        ("latency_ms_sum", (CUMULATIVE,)): 555.0,
        ("latency_ms_min", (CUMULATIVE,)): 5.0,
        ("latency_ms_max", (CUMULATIVE,)): 500.0,
        ("latency_ms_bucket", (("le", "10"), CUMULATIVE)): 1.0,
        ("latency_ms_bucket", (("le", "100"), CUMULATIVE)): 2.0,
        ("latency_ms_bucket", (("le", "+Inf"), CUMULATIVE)): 3.0,
        ("temperature", (("room", "a"),)): 21.5,
    }
    labels = batch.points[0]["labels"]
    assert labels["service.name"] == "checkout"
    assert (labels["otel.scope.name"], labels["otel.scope.version"]) == ("shop", "1.2")


async def test_the_opentelemetry_sdk_exporter_is_stored_with_the_documented_mapping(
    collector: InProcessCollector,
) -> None:
    await asyncio.to_thread(record_with_the_sdk, collector.base_url)

    (batch,) = await accepted_batches(collector.memory)
    assert batch.manifest.agent_id == "otel-1"
    check_sdk_points(batch)
    assert {p["seq"] for p in batch.points} == set(range(len(batch.points)))


def sample_request(*, exponential: bool = False) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add()
    resource.resource.attributes.add(key="host.name").value.string_value = "web-1"
    scope = resource.scope_metrics.add()
    gauge = scope.metrics.add(name="cpu")
    point = gauge.gauge.data_points.add(time_unix_nano=NS0, as_double=0.25)
    point.attributes.add(key="core").value.int_value = 3
    flag = point.attributes.add(key="busy")
    flag.value.bool_value = True
    if exponential:
        histogram = scope.metrics.add(name="sizes")
        histogram.exponential_histogram.aggregation_temporality = 2
        histogram.exponential_histogram.data_points.add(time_unix_nano=NS0, count=2)
        histogram.exponential_histogram.data_points.add(time_unix_nano=NS0 + 1, count=1)
        bad = scope.metrics.add(name="no_temporality")
        bad.sum.data_points.add(time_unix_nano=NS0, as_int=1)
    return request


async def post(
    session: aiohttp.ClientSession,
    base_url: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    *,
    token: str | None = WRITER_TOKEN,
) -> tuple[int, bytes, dict[str, str]]:
    sent = {**PROTOBUF, "X-Lightmetrics-Agent-Id": "otel-1"}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    sent.update(headers or {})
    async with session.post(f"{base_url}/v1/metrics", data=body, headers=sent) as answer:
        return answer.status, await answer.read(), dict(answer.headers)


async def test_protobuf_and_json_of_the_same_request_are_one_batch(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    request = sample_request()
    as_json = json_format.MessageToJson(request).encode()

    answers = [
        await post(session, collector.base_url, request.SerializeToString()),
        await post(session, collector.base_url, request.SerializeToString()),
        await post(session, collector.base_url, as_json, {"Content-Type": "application/json"}),
    ]

    assert [(s, h["X-Lightmetrics-Outcome"]) for s, _, h in answers] == [
        (200, "accepted"),
        (200, "duplicate"),
        (200, "duplicate"),
    ]
    assert answers[2][2]["Content-Type"].startswith("application/json")
    assert ExportMetricsServiceResponse.FromString(answers[0][1]) == ExportMetricsServiceResponse()
    (batch,) = await accepted_batches(collector.memory)
    (point,) = batch.points
    assert point["labels"] == {"host.name": "web-1", "core": "3", "busy": "true"}
    assert (point["metric"], point["value"], point["ts"]) == ("cpu", 0.25, NS0)


async def test_unsupported_kinds_are_refused_in_partial_success_and_the_rest_is_stored(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    request = sample_request(exponential=True)
    status, body, _ = await post(session, collector.base_url, request.SerializeToString())
    json_status, json_body, _ = await post(
        session,
        collector.base_url,
        json_format.MessageToJson(request).encode(),
        {"Content-Type": "application/json"},
    )

    assert status == 200 and json_status == 200
    partial = ExportMetricsServiceResponse.FromString(body).partial_success
    assert partial.rejected_data_points == 3
    assert "exponential histograms are not supported (2 data points)" in partial.error_message
    assert "no_temporality: aggregation temporality is unspecified" in partial.error_message
    as_json = json_format.Parse(json_body, ExportMetricsServiceResponse())
    assert as_json.partial_success == partial
    (batch,) = await accepted_batches(collector.memory)
    assert [p["metric"] for p in batch.points] == ["cpu"]


def gzip_with_isize(raw: bytes, isize: int) -> bytes:
    body = gzip.compress(raw)
    return body[:-4] + struct.pack("<I", isize)


@pytest.mark.parametrize(
    ("make_body", "headers", "status", "error"),
    [
        (lambda raw: raw, {"Content-Type": "text/plain"}, 415, "unsupported_media"),
        (lambda raw: raw, {"Content-Encoding": "br"}, 415, "unsupported_media"),
        (lambda raw: b"\xff\xff\xff", {}, 400, "invalid_request"),
        (lambda raw: b"{not json", {"Content-Type": "application/json"}, 400, "invalid_request"),
        (lambda raw: gzip_with_isize(raw, 2**31), {"Content-Encoding": "gzip"}, 413, "decompressed_too_large"),
        (lambda raw: gzip_with_isize(raw, 3), {"Content-Encoding": "gzip"}, 400, "invalid_request"),
        (lambda raw: gzip.compress(raw) * 2, {"Content-Encoding": "gzip"}, 400, "invalid_request"),
    ],
    ids=["text", "brotli", "garbage", "bad-json", "gzip-bomb", "gzip-lies", "gzip-two-members"],
)  # fmt: skip
async def test_bad_requests_get_a_status_message_and_store_nothing(
    collector: InProcessCollector,
    session: aiohttp.ClientSession,
    make_body: Callable[[bytes], bytes],
    headers: dict[str, str],
    status: int,
    error: str,
) -> None:
    raw = sample_request().SerializeToString()
    got, body, answer_headers = await post(session, collector.base_url, make_body(raw), headers)
    assert got == status, body
    assert answer_headers["X-Lightmetrics-Outcome"] == error
    if headers.get("Content-Type") == "application/json":
        message = json_format.Parse(body, Status())
    else:
        message = Status.FromString(body)
    assert message.message.startswith(error) and message.code != 0
    assert await accepted_batches(collector.memory) == []


async def test_auth_failures_and_overload_follow_the_otlp_status_rules(
    session: aiohttp.ClientSession,
) -> None:
    body = sample_request().SerializeToString()
    limits = HttpLimits(
        max_frame_bytes=LIMITS.max_frame_bytes,
        max_raw_bytes=LIMITS.max_raw_bytes,
        max_in_flight_bytes=8,  # below any body: the in-flight cap refuses it
        retry_after_s=3,
    )
    async with in_process_collector() as running:
        unauthenticated = await post(session, running.base_url, body, token=None)
        forbidden = await post(session, running.base_url, body, {"X-Lightmetrics-Agent-Id": "x"})
    async with in_process_collector(limits=limits) as running:
        overloaded = await post(session, running.base_url, body)
    assert unauthenticated[0] == 401 and Status.FromString(unauthenticated[1]).code == 16
    assert (
        forbidden[0] == 403
        and "may not write agent_id 'x'" in Status.FromString(forbidden[1]).message
    )
    assert overloaded[0] == 429 and overloaded[2]["Retry-After"] == "3"  # OTLP senders retry 429


@pytest.mark.parametrize("receiver_store", STORE_KINDS, indirect=True)
async def test_the_sdk_exporter_to_a_collector_process(
    receiver_store: tuple[str, dict[str, str]], collectors: CollectorLauncher, tmp_path: Path
) -> None:
    url, env = receiver_store
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    process = collectors.start(store_url=url, env={**env, "LM_AUTH__TOKENS_FILE": str(tokens)})

    await asyncio.to_thread(record_with_the_sdk, process.base_url, "otel-proc")

    async with opened(open_test_store(url, env)) as store:
        (batch,) = await accepted_batches(store)
    assert batch.manifest.agent_id == "otel-proc"
    check_sdk_points(batch)
    assert process.stop() == 0
