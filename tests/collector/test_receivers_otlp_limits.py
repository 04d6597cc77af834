"""Issue 24 item 7: an OTLP request's work is bounded before it is done. Data points are
counted (refused ones included) before any is read, a resource whose attributes no point
could carry refuses the request unread, labels are built once per (resource, scope),
histogram rows are counted before they are built, OTLP JSON is sized before it is
parsed, and decoding runs on the collector's bounded frame-check threads.

Every test asserts on counted work (calls of the mapping's functions), never on time."""

from __future__ import annotations

import gzip
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from typing import Any

import aiohttp
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from collector.receivers import otlp, otlp_points
from collector.receivers.proto.wire_pb2 import Status
from config import ReceiverSettings
from tests.collector.receiver_fixtures import accepted_batches, in_process_collector
from tests.collector.test_receivers_otlp import NS0, post

JSON = {"Content-Type": "application/json"}


class Work:
    """Counts the mapping's work: attributes turned into labels, bucket bounds written,
    ``json_format.Parse`` calls, and the threads decoding ran on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counted: Counter[str] = Counter()
        self.threads: set[str] = set()
        real_labels = otlp_points.attribute_labels
        real_bound = otlp_points.bound_text
        real_parse = json_format.Parse
        real_decode = otlp.OtlpWire.decode

        def attribute_labels(attributes: Iterable[KeyValue]) -> dict[str, str]:
            labels = real_labels(attributes)
            self.counted["label_builds"] += 1
            self.counted["attributes_read"] += len(labels)
            return labels

        def bound_text(value: float) -> str:
            self.counted["bucket_rows"] += 1
            return real_bound(value)

        def parse(*args: Any, **kwargs: Any) -> Any:
            self.counted["json_parses"] += 1
            return real_parse(*args, **kwargs)

        def decode(wire: otlp.OtlpWire, *args: Any) -> Any:
            self.threads.add(threading.current_thread().name)
            return real_decode(wire, *args)

        monkeypatch.setattr(otlp_points, "attribute_labels", attribute_labels)
        monkeypatch.setattr(otlp_points, "bound_text", bound_text)
        monkeypatch.setattr(json_format, "Parse", parse)
        monkeypatch.setattr(otlp.OtlpWire, "decode", decode)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened:
        yield opened


def gauges(points: int, *, resource_attributes: int = 1) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add()
    for index in range(resource_attributes):
        resource.resource.attributes.add(key=f"attr.{index}").value.string_value = "v"
    gauge = resource.scope_metrics.add(scope={"name": "s"}).metrics.add(name="cpu").gauge
    for index in range(points):
        point = gauge.data_points.add(time_unix_nano=NS0 + index, as_double=1.0)
        point.attributes.add(key="core").value.int_value = index % 4
    return request


def status_of(body: bytes, as_json: bool) -> Status:
    return json_format.Parse(body, Status()) if as_json else Status.FromString(body)


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
async def test_many_resource_attributes_times_many_points_is_refused_unread(
    session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    request = gauges(2_000, resource_attributes=1_000)
    body = json_format.MessageToJson(request).encode() if as_json else request.SerializeToString()
    work = Work(monkeypatch)

    async with in_process_collector() as collector:
        status, answer, headers = await post(
            session,
            collector.base_url,
            gzip.compress(body),
            {**(JSON if as_json else {}), "Content-Encoding": "gzip"},
        )
        stored = await accepted_batches(collector.memory)

    assert status == 400, answer
    assert headers["X-Lightmetrics-Outcome"] == "invalid_request"
    message = status_of(answer, as_json).message
    assert "resource_metrics[0].resource has 1000 attributes" in message
    assert "more than the 64 labels a point may carry" in message
    assert stored == []
    # Refused before any label was built: not once per point, not even once.
    assert work.counted["label_builds"] == 0 and work.counted["attributes_read"] == 0


async def test_labels_are_built_once_per_resource_and_scope(
    session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = gauges(500, resource_attributes=60)
    work = Work(monkeypatch)

    async with in_process_collector() as collector:
        status, answer, _ = await post(session, collector.base_url, request.SerializeToString())
        (batch,) = await accepted_batches(collector.memory)

    assert status == 200, answer
    assert len(batch.points) == 500 and len(batch.points[0]["labels"]) == 62
    # One build for the resource (60 attributes), one per point for its own attribute.
    assert work.counted["label_builds"] == 1 + 500
    assert work.counted["attributes_read"] == 60 + 500


async def test_refused_data_points_count_against_the_limit_before_any_is_read(
    session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = ExportMetricsServiceRequest()
    metrics = request.resource_metrics.add().scope_metrics.add().metrics
    histogram = metrics.add(name="sizes").exponential_histogram  # every point refused
    histogram.aggregation_temporality = 2
    for index in range(101):
        histogram.data_points.add(time_unix_nano=NS0 + index, count=1)
    work = Work(monkeypatch)

    async with in_process_collector(receivers=ReceiverSettings(max_points_per_request=100)) as c:
        status, answer, headers = await post(session, c.base_url, request.SerializeToString())

    assert status == 413, answer
    assert headers["X-Lightmetrics-Outcome"] == "too_many_points"
    message = Status.FromString(answer).message
    assert "at least 101 data points (refused ones included)" in message
    assert "max_points_per_request 100" in message
    assert work.counted["label_builds"] == 0


async def test_histogram_rows_are_counted_before_they_are_built(
    session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = ExportMetricsServiceRequest()
    metrics = request.resource_metrics.add().scope_metrics.add().metrics
    histogram = metrics.add(name="latency").histogram
    histogram.aggregation_temporality = 2
    point = histogram.data_points.add(time_unix_nano=NS0, count=1)
    point.explicit_bounds.extend(float(b) for b in range(10_000))
    point.bucket_counts.extend([0] * 10_001)
    work = Work(monkeypatch)

    async with in_process_collector(receivers=ReceiverSettings(max_points_per_request=100)) as c:
        status, answer, headers = await post(session, c.base_url, request.SerializeToString())

    assert status == 413 and headers["X-Lightmetrics-Outcome"] == "too_many_points", answer
    assert work.counted["bucket_rows"] == 0  # not 10,000 rows built, then refused


async def test_decoding_runs_on_the_frame_check_threads(
    session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = Work(monkeypatch)
    async with in_process_collector() as collector:
        status, answer, _ = await post(session, collector.base_url, gauges(3).SerializeToString())
    assert status == 200, answer
    (thread,) = work.threads
    assert thread.startswith("lm-frame-check"), thread  # not the loop's default executor


async def test_otlp_json_is_sized_before_it_is_parsed(
    session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 600 KB of text (within max_raw_bytes 1 MiB), 200,000 empty objects: ~12 MB parsed.
    text = b'{"resourceMetrics":[' + b",".join([b"{}"] * 200_000) + b"]}"
    work = Work(monkeypatch)

    async with in_process_collector() as collector:
        limit = 8 * collector.app.limits.max_raw_bytes
        status, answer, headers = await post(
            session,
            collector.base_url,
            gzip.compress(text),
            {**JSON, "Content-Encoding": "gzip"},
        )

    assert work.counted["json_parses"] == 0
    assert status == 413, answer
    assert headers["X-Lightmetrics-Outcome"] == "json_too_complex"
    message = json_format.Parse(answer, Status()).message
    assert "has up to 400002 elements" in message and f"> {limit}" in message


async def test_otlp_json_nesting_is_bounded(session: aiohttp.ClientSession) -> None:
    value = '{"stringValue":"x"}'
    for _ in range(40):
        value = '{"arrayValue":{"values":[' + value + "]}}"
    text = (
        '{"resourceMetrics":[{"resource":{"attributes":[{"key":"a","value":'
        + value
        + '}]},"scopeMetrics":[{"metrics":[{"name":"m","gauge":{"dataPoints":'
        + f'[{{"timeUnixNano":"{NS0}","asDouble":1}}]}}}}]}}]}}]}}'
    )
    # Valid OTLP JSON (protobuf's own default depth, 100, takes it).
    json_format.Parse(text, ExportMetricsServiceRequest(), max_recursion_depth=200)

    async with in_process_collector() as collector:
        status, answer, headers = await post(session, collector.base_url, text.encode(), JSON)
        stored = await accepted_batches(collector.memory)

    assert status == 400 and headers["X-Lightmetrics-Outcome"] == "invalid_request", answer
    assert "depth" in json_format.Parse(answer, Status()).message.lower()
    assert stored == []


async def test_a_normal_json_request_is_still_stored(session: aiohttp.ClientSession) -> None:
    text = json_format.MessageToJson(gauges(50, resource_attributes=10)).encode()
    async with in_process_collector() as collector:
        status, answer, _ = await post(session, collector.base_url, text, JSON)
        (batch,) = await accepted_batches(collector.memory)
    assert status == 200, answer
    assert json_format.Parse(answer, ExportMetricsServiceResponse()).partial_success == (
        ExportMetricsServiceResponse().partial_success
    )
    assert len(batch.points) == 50
