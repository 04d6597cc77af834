"""The collector's HTTP API (PROTOCOL §2) on aiohttp.

``POST /v1/batches``: `collector.intake` admits the request up to a checked frame (the
order of checks of §2: authenticate, size, read within the read timeout, header and CRC,
authorize for the header's agent_id, payload, hash); then the acceptance protocol
(`collector.accept`) answers 200 / 409 / 503. Bad input changes nothing: nothing is
written before the frame is valid and authorized. A request carrying
``X-Lightmetrics-Resend: 1`` is checked against the accepted manifest first (§3.2).

In ``local_spool`` mode (`collector.local_spool`) the last step is "fsync into the local spool"
instead, and 200 bodies carry ``"spooled": true``.

The receivers (`collector.receivers`: ``POST /api/v1/write``, ``POST /v1/metrics``) are
registered on the same application and share the in-flight caps (`CollectorApp.admit`).

Memory: an admitted batch POST reads its body only when one of ``max_bodies_held`` slots
is free (the server sets the store's connection pool + ``decode_threads``: more bodies
could only wait in memory for the store); the others wait unread, their wait not charged
to their read timeout.

Every response, errors included, carries ``X-Request-Id`` and a JSON body. Connections
are capped per worker and a request's head must arrive within the read timeout
(`collector.connections`; the middleware tells the guard when a request starts).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from config.settings import ReceiverSettings
from protocol import keys
from protocol.batch_api import BATCHES_PATH, RESEND_HEADER, STORE_UNAVAILABLE
from protocol.frame import FrameHeader
from store.base import ObjectStore
from store.errors import StoreConfigError

from .accept import AcceptanceUnavailable, Accepted, BatchAcceptor, BundlesFull
from .auth import Authenticator
from .batch_answers import accepted_response, conflict_response
from .bundles.acceptance import InFlightBytes
from .conflicts_api import ConflictsEndpoint
from .connections import ConnectionGuard
from .frame_checks import FrameChecker
from .in_flight import InFlight
from .intake import BatchIntake, CheckedFrame, HttpLimits, Refusal, error_response
from .local_spool.spool import LocalSpool, SpoolFull
from .metrics import CollectorMetrics
from .promql.engine_setup import PromqlEngineParts, build_promql_engine
from .promql.names import NamesEndpoint
from .promql.read_endpoint import ReadEndpoint
from .query.endpoint import QueryEndpoint
from .readiness import Readiness
from .receivers import add_receiver_routes
from .store_calls import ClockSkewed

log = structlog.get_logger("collector.http")
Handled = tuple[web.Response, str, dict[str, Any]]  # the answer, its outcome, its log context

REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Monotonic time of the request's first byte (its head may have trickled in).
STARTED_AT = web.RequestKey("lm_started_at", float)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class CollectorApp:
    """Holds the collector's parts and builds the aiohttp application over them."""

    def __init__(
        self,
        *,
        acceptor: BatchAcceptor,
        authenticator: Authenticator,
        store: ObjectStore,
        metrics: CollectorMetrics,
        readiness: Readiness,
        limits: HttpLimits,
        collector_id: str,
        worker_name: str = "0",
        spool: LocalSpool | None = None,
        receivers: ReceiverSettings | None = None,
        query: QueryEndpoint | None = None,
        remote_read: ReadEndpoint | None = None,
        promql: PromqlEngineParts | None = None,
    ) -> None:
        self.query = query
        # Prometheus remote read (PROTOCOL §5) over /v1/query's parts, unless given.
        if remote_read is None and query is not None:
            remote_read = ReadEndpoint.beside(query)
        self.remote_read = remote_read
        # PromQL forwarded to the engine of [query.promql] (503 without one), unless given.
        if promql is None and query is not None:
            promql = build_promql_engine(query.settings, authenticator=authenticator)
        self.promql = promql
        # Names (labels, label values, series) from the series index and the window, §5.
        self.names = None if query is None else NamesEndpoint.beside(query, self._buildinfo)
        self.acceptor = acceptor
        self.authenticator = authenticator
        self.store = store
        self.metrics = metrics
        self.readiness = readiness
        self.limits = limits
        self.collector_id = collector_id
        self.worker_name = worker_name
        self.spool = spool
        self.receivers = receivers if receivers is not None else ReceiverSettings()
        self.frame_checker = FrameChecker(threads=limits.decode_threads)
        self._bodies = asyncio.Semaphore(limits.max_bodies_held or limits.max_in_flight_requests)
        self._request_id_prefix = uuid.uuid4().hex[:16] + "-"
        self._request_counter = itertools.count(1)
        self.in_flight_account = InFlight(
            requests_gauge=metrics.in_flight_requests, bytes_gauge=metrics.in_flight_bytes
        )
        self.intake = BatchIntake(
            authenticator=authenticator,
            checker=self.frame_checker,
            in_flight=self.in_flight_account,
            limits=limits.intake(),
        )
        if acceptor.bundled is not None:  # bundles' bytes count as in flight (PROTOCOL §3.10)
            account = InFlightBytes(self.in_flight_account, limits.intake())
            acceptor.bundled.bundler.account = account
        self.connection_guard = ConnectionGuard(
            max_connections=limits.max_connections,
            read_timeout_s=limits.read_timeout_s,
            retry_after_s=limits.retry_after_s,
            on_event=lambda reason: metrics.connections_refused.labels(reason=reason).inc(),
        )
        self.conflicts = ConflictsEndpoint(
            authenticator=authenticator, store=store, retry_after_s=limits.retry_after_s
        )

    def build(self) -> web.Application:
        app = web.Application(
            middlewares=[self._request_context], client_max_size=self.limits.max_frame_bytes
        )
        app.router.add_post(BATCHES_PATH, self.post_batch)
        app.router.add_get("/v1/conflicts", self.conflicts.get_conflicts)
        if self.query is not None:
            app.router.add_get("/v1/query", self.query.get_query)
            app.on_cleanup.append(self.query.close)
        if self.remote_read is not None:
            app.router.add_post("/api/v1/read", self.remote_read.post_read)
        if self.names is not None:
            self.names.add_routes(app)
        if self.promql is not None:  # /api/v1/query, query_range; the engine ends with the app
            self.promql.add_routes(app)
            if self.remote_read is not None:
                read = self.remote_read
                self.promql.attach_remote_read(self.authenticator, read.internal, read.outcomes)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_text)
        add_receiver_routes(app, self, self.receivers)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        self.frame_checker.close()

    async def listening(self, host: str, port: int) -> None:
        """The server is bound: start the PromQL engine, which reads from this port."""
        if self.promql is not None:
            await self.promql.listening(host, port)

    # --- middleware -----------------------------------------------------------------------

    def _new_request_id(self) -> str:
        """This process's random prefix and a counter: unique per worker, and ~1/10 of
        the CPU of a uuid4 (an os.urandom call and a UUID object per request)."""
        return f"{self._request_id_prefix}{next(self._request_counter):x}"

    @web.middleware
    async def _request_context(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        request[STARTED_AT] = self.connection_guard.request_started(request.protocol)
        offered = request.headers.get("X-Request-Id", "")
        request_id = offered if REQUEST_ID_RE.fullmatch(offered) else self._new_request_id()
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id, worker=self.worker_name)
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # routing errors (404, 405) as JSON too
            response = error_response(exc.status, exc.reason.lower().replace(" ", "_"))
        except Exception:
            log.exception("unhandled_error", path=request.path)
            response = error_response(500, "internal")
        finally:
            self.connection_guard.request_finished(request.protocol)
        response.headers["X-Request-Id"] = request_id
        response.headers["X-Lightmetrics-Worker"] = self.worker_name
        return response

    # --- POST /v1/batches ------------------------------------------------------------------

    async def post_batch(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        response, outcome, context = await self._post_batch(request)
        self.metrics.requests.labels(outcome=outcome).inc()
        latency = time.monotonic() - started
        if outcome in ("accepted", "duplicate"):
            self.metrics.ack_latency.labels(duplicate=str(outcome == "duplicate").lower()).observe(
                latency
            )
        log.info(
            "batch",
            outcome=outcome,
            status=response.status,
            latency_ms=round(latency * 1000, 3),
            **context,
        )
        return response

    async def _post_batch(self, request: web.Request) -> Handled:
        slot = self.intake.request_slot(request)
        if isinstance(slot, Refusal):
            return slot.response, slot.outcome, slot.context
        principal, reserved = slot
        try:
            # Admitted requests beyond what the store can serve wait here, before reading
            # their body (aiohttp then buffers at most 2 x read_bufsize of it; the kernel
            # the rest); the wait does not count against their read timeout.
            waited_from = time.monotonic()
            async with self._bodies:
                started_at = request[STARTED_AT] + (time.monotonic() - waited_from)
                checked = await self.intake.check(request, principal, started_at)
                if isinstance(checked, Refusal):
                    return checked.response, checked.outcome, checked.context
                if self.spool is not None:
                    return await self._spool_batch(
                        checked.header, checked.body, checked.sha256, checked.context
                    )
                resend = request.headers.get(RESEND_HEADER, "").strip() == "1"
                return await self._accept(checked, resend=resend)
        finally:
            self.in_flight_account.release(1, reserved)

    @property
    def in_flight(self) -> int:
        """Batch POSTs being handled now (the graceful stop waits for them)."""
        return self.in_flight_account.requests

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no batch POST is in flight; False if ``timeout_s`` passed first."""
        return await self.in_flight_account.wait_idle(timeout_s)

    def admit(self, body_bytes: int) -> bool:
        """Count one more request holding ``body_bytes`` under the in-flight caps, or refuse
        it (False). The receivers (`collector.receivers`) share the caps with batches."""
        return self.in_flight_account.try_reserve(
            1, body_bytes, self.limits.intake(), always_if_alone=False
        )

    def admit_bytes(self, size: int) -> bool:
        """Reserve ``size`` more bytes (a payload being decompressed) for an admitted
        request, or refuse (False). A request alone in flight is always admitted."""
        return self.in_flight_account.try_reserve(
            0, size, self.limits.intake(), always_if_alone=True
        )

    def release(self, requests: int, size: int) -> None:
        """Give back what `admit` / `admit_bytes` reserved."""
        self.in_flight_account.release(requests, size)

    async def _accept(self, checked: CheckedFrame, *, resend: bool) -> Handled:
        frame, body, sha, context = checked.header, checked.body, checked.sha256, checked.context
        try:
            result = await self.acceptor.accept(
                frame, body, sha, resend=resend, ts_range=checked.ts_range
            )
        except BundlesFull:  # the open bundle is full and waits for a write slot
            return self.intake.overloaded().response, "overloaded", context
        except ClockSkewed as exc:  # this collector's own refusal: the agent may fail over
            return self._clock_skewed(exc, context)
        except (AcceptanceUnavailable, StoreConfigError) as exc:
            if isinstance(exc, StoreConfigError):  # e.g. 403: credentials or bucket policy
                log.error("store_refuses_access", error=str(exc), **context)
            else:
                log.warning("store_unavailable", error=str(exc), **context)
            return self._unavailable(), STORE_UNAVAILABLE, context
        self.readiness.store_answered()
        if isinstance(result, Accepted):
            outcome = "duplicate" if result.duplicate else "accepted"
            self.metrics.store_ops_per_batch.labels(outcome=outcome).observe(result.store_ops)
            if not result.duplicate:
                self.metrics.bytes_accepted.inc(len(body))
                self.metrics.points_accepted.inc(frame.record_count)
            answer = accepted_response(
                result.manifest.identity,
                frame_sha256=sha,
                collector_id=self.collector_id,
                duplicate=result.duplicate,
            )
            return answer, outcome, context
        self.metrics.conflicts.inc()
        self.metrics.store_ops_per_batch.labels(outcome="conflict").observe(result.store_ops)
        conflict = conflict_response(
            result.accepted.identity,
            accepted_sha256=result.accepted.frame_sha256,
            submitted_sha256=result.submitted_frame_sha256,
            quarantine_key=result.quarantine_key,
        )
        return conflict, "conflict", context

    def _clock_skewed(self, exc: ClockSkewed, context: dict[str, Any]) -> Handled:
        log.warning(exc.code, error=str(exc), **context)
        return self._unavailable(exc.code, detail=str(exc)), exc.code, context

    def _unavailable(self, error: str = STORE_UNAVAILABLE, **fields: str) -> web.Response:
        headers = {"Retry-After": str(self.limits.retry_after_s)}
        return error_response(503, error, headers, **fields)

    async def _spool_batch(
        self, frame: FrameHeader, body: bytes, sha: str, context: dict[str, Any]
    ) -> Handled:
        """``local_spool`` mode: answer once the frame is durable locally (PROTOCOL §3.4)."""
        assert self.spool is not None
        identity = keys.BatchIdentity(frame.agent_id, frame.boot_id, frame.seq_start, frame.seq_end)
        try:
            answer = await self.spool.add(identity, sha, body)
        except ClockSkewed as exc:  # its landing would wait for this clock (§3.8)
            return self._clock_skewed(exc, context)
        except SpoolFull as exc:
            log.warning("spool_full", error=str(exc), **context)
            return self._unavailable(), STORE_UNAVAILABLE, context
        if answer.conflict_sha256 is not None:
            self.metrics.conflicts.inc()
            conflict = conflict_response(
                identity,
                accepted_sha256=answer.conflict_sha256,
                submitted_sha256=sha,
                quarantine_key=keys.quarantine_key(identity, sha),
            )
            return conflict, "conflict", context
        if not answer.duplicate:
            self.metrics.bytes_accepted.inc(len(body))
            self.metrics.points_accepted.inc(frame.record_count)
        outcome = "duplicate" if answer.duplicate else "accepted"
        accepted = accepted_response(
            identity,
            frame_sha256=sha,
            collector_id=self.collector_id,
            duplicate=answer.duplicate,
            spooled=True,
        )
        return accepted, outcome, context

    async def _buildinfo(self) -> dict[str, Any] | None:
        """The engine's ``buildinfo`` (Grafana picks features by it), None while it is down."""
        engine = self.promql.engine if self.promql is not None else None
        endpoint = engine.current() if engine is not None else None
        return endpoint.buildinfo if endpoint is not None else None

    # --- health, readiness, metrics --------------------------------------------------------

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "alive", "collector_id": self.collector_id})

    async def readyz(self, _request: web.Request) -> web.Response:
        state = self.readiness.state()
        return web.json_response(state, status=200 if state["ready"] else 503)

    async def metrics_text(self, _request: web.Request) -> web.Response:
        self.metrics.index_buffered.set(self.acceptor.index_buffered)
        self.metrics.open_connections.set(self.connection_guard.open_connections)
        window = self.query.window if self.query is not None else None
        if window is not None:
            self.metrics.live_window.labels(what="batches").set(window.batch_count)
            self.metrics.live_window.labels(what="points").set(window.point_count)
            self.metrics.live_window.labels(what="bytes").set(window.byte_count)
        if self.query is not None:
            read_through = self.query.coverage.read_through_ns
            self.metrics.history_read_through.set(read_through / 1e9)
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
