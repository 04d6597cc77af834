"""``GET|POST /api/v1/query`` and ``/api/v1/query_range``, forwarded to the PromQL engine
(PROTOCOL §5).

Order of work: authenticate (401) and check ``read`` (403) before anything else; then
``query.max_concurrent_promql`` (429 past it, Prometheus-shaped: ``{"status": "error",
"errorType": "unavailable", "error": ...}`` with ``Retry-After`` — Prometheus has no
error type of its own for it, and its clients and Grafana read the status and
``error``); then the parameters (a form body of at most `MAX_FORM_BYTES`); then the
engine: none configured or not ready is 503 ``unavailable``.

Time: the engine's ``remote_timeout`` < its ``--query.timeout`` < the forward's
``query.promql.forward_timeout_s`` (checked at load); a caller's ``timeout`` parameter
is capped at the engine's ``--query.timeout``, so the engine always answers first.

The answer (`collector.promql.engine_answer`): an engine answer carrying a warning that
reports a failed remote read — Prometheus' own remote-read error text, or any other
warning while a read this collector served the engine during the request was refused or
failed (`EngineReads`) — is never returned as a success: 422 ``execution`` when one of
those reads was refused for a limit, else 503 ``unavailable``, the engine's warning as
``error``. PromQL's annotations pass through. Known gaps in reads served to the engine
during the request add ``partial: ...`` warnings. Otherwise the engine's bytes are
returned unchanged (its error answers too, with their status).

An answer is held whole to judge its warnings (Prometheus writes them after ``data``),
so it is bounded: past `MAX_ANSWER_BYTES` the request is 422 (narrow it or raise the
step) — an addition to the contract, which sets no bound.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp
import structlog
from aiohttp import web

from config.query_settings import QuerySettings

from ..auth import Authenticator
from . import prom_json
from .engine import Engine
from .engine_answer import (
    PROMQL_ANNOTATIONS,
    AnswerNotJson,
    answer_warnings,
    is_remote_read_failure,
    with_warnings,
)
from .engine_check import EngineEndpoint

log = structlog.get_logger("collector.promql.forward")

MAX_FORM_BYTES = 1024 * 1024
MAX_ANSWER_BYTES = 128 * 1024 * 1024
RETRY_AFTER_S = 1
_DURATION_RE = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_DURATION_UNITS = (365 * 86400.0, 7 * 86400.0, 86400.0, 3600.0, 60.0, 1.0, 0.001)


@dataclass(frozen=True, slots=True)
class EngineReadReport:
    """What the collector's remote read saw of its engine's reads while one forwarded
    request ran (over-reporting under concurrency is allowed, under-reporting is not)."""

    refused_for_limit: tuple[str, ...] = ()
    """Reads refused because they were over a limit (``max_read_samples``, a frame)."""
    failed: tuple[str, ...] = ()
    """Reads refused for load or store trouble, or failed while answering."""
    gaps: tuple[str, ...] = field(default=())
    """Known gaps in reads that were answered (each a ``partial: ...`` warning)."""


class EngineReads(Protocol):
    """The remote read's record of its engine's reads (`collector.promql.read_outcomes`)."""

    def begin(self) -> int:
        """A mark: reads that end after it are reported by `report`."""
        ...

    def report(self, mark: int) -> EngineReadReport:
        """What happened since `begin` returned ``mark``; ends that watch."""
        ...


def parse_timeout(value: str) -> float | None:
    """A Prometheus ``timeout`` parameter in seconds (``30``, ``1.5``, ``1m30s``), or None."""
    try:
        seconds = float(value)
    except ValueError:
        match = _DURATION_RE.match(value)
        if match is None or not value:
            return None
        seconds = sum(
            int(n) * unit for n, unit in zip(match.groups(), _DURATION_UNITS, strict=True) if n
        )
    return seconds if seconds == seconds and seconds > 0 else None


class PromqlForward:
    def __init__(
        self,
        *,
        authenticator: Authenticator,
        settings: QuerySettings,
        engine: Engine | None,
        reads: EngineReads | None = None,
    ) -> None:
        self.authenticator = authenticator
        self.engine = engine
        self.reads = reads
        self._max_in_flight = settings.max_concurrent_promql
        self._query_timeout_s = settings.promql.query_timeout_s
        self._forward_timeout_s = settings.promql.forward_timeout_s
        self.in_flight = 0
        self._session: aiohttp.ClientSession | None = None

    def add_routes(self, app: web.Application) -> None:
        for path in ("/api/v1/query", "/api/v1/query_range"):
            app.router.add_get(path, self.forward)
            app.router.add_post(path, self.forward)
        app.on_cleanup.append(self._close)

    async def _close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    async def forward(self, request: web.Request) -> web.Response:
        principal = prom_json.authorize_read(self.authenticator, request)
        if isinstance(principal, web.Response):
            return principal
        if self.in_flight >= self._max_in_flight:
            return prom_json.error(
                429,
                f"too many PromQL requests in flight (query.max_concurrent_promql = "
                f"{self._max_in_flight}); retry later",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self.in_flight += 1
        started = time.monotonic()
        try:
            response = await self._forward(request)
        finally:
            self.in_flight -= 1
        log.info(
            "promql_forward",
            path=request.path,
            principal=principal.name,
            status=response.status,
            latency_ms=round((time.monotonic() - started) * 1000, 3),
        )
        return response

    async def _forward(self, request: web.Request) -> web.Response:
        params = await _request_params(request)
        if isinstance(params, web.Response):
            return params
        params = self._cap_timeout(params)
        endpoint = self.engine.current() if self.engine is not None else None
        if endpoint is None:
            reason = (
                self.engine.down_reason
                if self.engine is not None
                else "no PromQL engine is configured ([query.promql] prometheus or url)"
            )
            return prom_json.error(503, reason, headers={"Retry-After": str(RETRY_AFTER_S)})
        mark = self.reads.begin() if self.reads is not None else 0
        try:
            outcome = await self._ask_engine(endpoint, request.path, params)
        finally:  # always ends the watch `begin` opened
            report = self.reads.report(mark) if self.reads is not None else EngineReadReport()
        if isinstance(outcome, web.Response):
            return outcome
        status, content_type, body = outcome
        if status != 200:
            return web.Response(status=status, body=body, headers={"Content-Type": content_type})
        return self._judge(body, report)

    async def _ask_engine(
        self, endpoint: EngineEndpoint, path: str, params: list[tuple[str, str]]
    ) -> tuple[int, str, bytearray] | web.Response:
        if self._session is None:  # one connection per forwarded request at most
            connector = aiohttp.TCPConnector(limit=self._max_in_flight)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        try:
            async with self._session.post(
                endpoint.base_url + path,
                data=params,
                headers={"Authorization": endpoint.authorization, "Accept-Encoding": "identity"},
                timeout=aiohttp.ClientTimeout(total=self._forward_timeout_s),
                allow_redirects=False,
            ) as answer:
                status = answer.status
                content_type = answer.headers.get("Content-Type", "application/json")
                body = await _read_bounded(answer)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return prom_json.error(503, f"the PromQL engine did not answer: {exc!r}")
        if body is None:
            return prom_json.error(
                422,
                f"the engine's answer is over {MAX_ANSWER_BYTES} bytes: narrow the query or "
                "raise its step",
            )
        return status, content_type, body

    def _judge(self, body: bytearray, report: EngineReadReport) -> web.Response:
        try:
            span = answer_warnings(body)
        except AnswerNotJson as exc:
            return prom_json.error(503, f"the PromQL engine's answer is unusable: {exc}")
        collector_failed = bool(report.refused_for_limit or report.failed)
        failures = [
            w
            for w in span.warnings
            if is_remote_read_failure(w)
            or (collector_failed and not w.startswith(PROMQL_ANNOTATIONS))
        ]
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            status = 422 if report.refused_for_limit or _names_limit(failures) else 503
            return prom_json.error(
                status, failures[0] + more, headers=None if status == 422 else _retry_after()
            )
        gaps = [g if g.startswith("partial:") else f"partial: {g}" for g in report.gaps]
        return web.Response(
            body=with_warnings(body, span, list(dict.fromkeys(gaps))),
            headers={"Content-Type": "application/json"},
        )

    def _cap_timeout(self, params: list[tuple[str, str]]) -> list[tuple[str, str]]:
        capped: list[tuple[str, str]] = []
        for name, value in params:
            if name == "timeout":
                seconds = parse_timeout(value)
                if seconds is not None and seconds > self._query_timeout_s:
                    value = f"{self._query_timeout_s:g}"
            capped.append((name, value))
        return capped


def _retry_after() -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_S)}


def _names_limit(failures: Sequence[str]) -> bool:
    """Without the reads' record: a read this collector refused with 400 names the limit
    it was over (PROTOCOL §5: ``max_read_samples``, a frame over ``max_read_frame_bytes``)."""
    return any(" returned HTTP status 400 " in w and "max_read_" in w for w in failures)


async def _request_params(request: web.Request) -> list[tuple[str, str]] | web.Response:
    """The query string's and a form body's parameters (Prometheus reads both), bounded."""
    pairs = list(request.query.items())
    if request.method != "POST":
        return pairs
    if request.content_length is not None and request.content_length > MAX_FORM_BYTES:
        return prom_json.error(400, f"a PromQL request body is at most {MAX_FORM_BYTES} bytes")
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return prom_json.error(400, f"a PromQL request body is at most {MAX_FORM_BYTES} bytes")
    if not body:
        return pairs
    if request.content_type != "application/x-www-form-urlencoded":
        return prom_json.error(400, "a PromQL POST body must be application/x-www-form-urlencoded")
    try:
        form = urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True)
    except (UnicodeDecodeError, ValueError) as exc:
        return prom_json.error(400, f"the form body is not valid: {exc}")
    return form + pairs  # Go's FormValue: the body's value before the URL's


async def _read_bounded(answer: aiohttp.ClientResponse) -> bytearray | None:
    """The whole answer, or None past `MAX_ANSWER_BYTES`. Kept a ``bytearray``: adding
    warnings then moves only its last bytes (`engine_answer.with_warnings`), and no copy
    of a large answer is made on the event loop."""
    body = bytearray()
    async for chunk in answer.content.iter_chunked(1024 * 1024):
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            return None
    return body
