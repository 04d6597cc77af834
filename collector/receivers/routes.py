"""The receivers' aiohttp handlers: run the shared intake, render the answer, count it."""

from __future__ import annotations

import time

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from config.settings import ReceiverSettings
from protocol.frame import CHECK_MEMORY_PER_RAW_BYTE

from . import otlp, remote_write
from .host import ReceiverHost
from .intake import Intake, Received, Refused, Wire

log = structlog.get_logger("collector.receivers")


class ReceiverMetrics:
    """Counters of the receivers, on the collector's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "lm_collector_receiver_requests",
            "Receiver requests by receiver and outcome",
            ["receiver", "outcome"],
            registry=registry,
        )
        self.refused_points = Counter(
            "lm_collector_receiver_refused_points",
            "Data points refused by a receiver (OTLP partial_success), by receiver",
            ["receiver"],
            registry=registry,
        )
        self.dropped_points = Counter(
            "lm_collector_receiver_dropped_points",
            "Samples left out on purpose (native histograms, exemplars, "
            "no recorded value), by receiver and reason",
            ["receiver", "reason"],
            registry=registry,
        )

    def observe(self, receiver: str, result: Refused | Received) -> None:
        outcome = result.error if isinstance(result, Refused) else result.outcome
        self.requests.labels(receiver=receiver, outcome=outcome).inc()
        if isinstance(result, Received):
            refused = sum(result.decoded.rejected.values())
            if refused:
                self.refused_points.labels(receiver=receiver).inc(refused)
            for reason, count in result.decoded.dropped.items():
                self.dropped_points.labels(receiver=receiver, reason=reason).inc(count)


def add_receiver_routes(
    app: web.Application, collector: ReceiverHost, settings: ReceiverSettings
) -> None:
    """Register ``POST /api/v1/write`` and ``POST /v1/metrics`` (when enabled)."""
    if not settings.enabled:
        return
    intake = Intake(
        collector,
        agent_id_header=settings.agent_id_header,
        max_points_per_request=settings.max_points_per_request,
    )
    metrics = ReceiverMetrics(collector.metrics.registry)
    retry_after = collector.limits.retry_after_s
    prometheus = remote_write.RemoteWriteWire()
    opentelemetry = otlp.OtlpWire(
        max_json_parse_bytes=CHECK_MEMORY_PER_RAW_BYTE * collector.limits.max_raw_bytes
    )

    async def post_remote_write(request: web.Request) -> web.Response:
        started = time.monotonic()
        result = await intake.receive(request, prometheus)
        response = remote_write.render(
            result, collector_id=collector.collector_id, retry_after_s=retry_after
        )
        _finish(prometheus, result, response, metrics, started)
        return response

    async def post_otlp_metrics(request: web.Request) -> web.Response:
        started = time.monotonic()
        result = await intake.receive(request, opentelemetry)
        response = otlp.render(request, result, retry_after)
        _finish(opentelemetry, result, response, metrics, started)
        return response

    app.router.add_post(remote_write.PATH, post_remote_write)
    app.router.add_post(otlp.PATH, post_otlp_metrics)


def _finish(
    wire: Wire,
    result: Refused | Received,
    response: web.Response,
    metrics: ReceiverMetrics,
    started: float,
) -> None:
    metrics.observe(wire.name, result)
    context: dict[str, object] = {}
    if isinstance(result, Received):
        context.update(agent_id=result.agent_id, points=len(result.decoded.rows))
        if result.stored is not None:
            context.update(
                frame_sha256=result.stored.frame_sha256, manifest_key=result.stored.manifest_key
            )
        if result.decoded.rejected:
            context["refused_points"] = sum(result.decoded.rejected.values())
    elif result.detail:
        context["detail"] = result.detail
    log.info(
        "receiver_request",
        receiver=wire.name,
        outcome=result.outcome if isinstance(result, Received) else result.error,
        status=response.status,
        latency_ms=round((time.monotonic() - started) * 1000, 3),
        **context,
    )
