"""The collector's HTTP API (PROTOCOL §2) on aiohttp.

``POST /v1/batches`` checks, in this order: authenticate (401) → media type (415) →
overload caps (429) → body size, before reading past the limit, also for chunked bodies
(413) → read within the read timeout (408) → decode and validate (400) → authorize the
principal for the frame's agent_id (403) → hash → acceptance protocol (200 / 409 / 503).
Bad input changes nothing: nothing is written before the frame is valid and authorized.

In ``local_spool`` mode (`collector.spool`) the last step is "fsync into the local spool"
instead, and 200 bodies carry ``"spooled": true``.

The receivers (`collector.receivers`: ``POST /api/v1/write``, ``POST /v1/metrics``) are
registered on the same application and share the in-flight caps (`CollectorApp.admit`).

Every response, errors included, carries ``X-Request-Id`` and a JSON body.
Addition to PROTOCOL §2: a body that does not arrive within ``http.read_timeout_s`` is
answered ``408 {"error": "request_timeout"}`` (agents retry it like a network error).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from config.settings import ReceiverSettings
from config.tokens import Principal
from protocol import keys, records
from protocol.frame import FrameError, FrameHeader, decode_frame, decode_header
from store.base import ObjectStore, list_prefixes
from store.errors import StoreConfigError, StoreError

from .accept import AcceptanceUnavailable, Accepted, BatchAcceptor
from .auth import Authenticator
from .metrics import CollectorMetrics
from .readiness import Readiness
from .receivers import add_receiver_routes
from .spool import LocalSpool, SpoolFull

log = structlog.get_logger("collector.http")

FRAME_MEDIA_TYPES = frozenset({"application/x-lmbatch", "application/octet-stream"})
OFFLOAD_DECODE_BYTES = 256 * 1024  # larger frames are decoded off the event loop
REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
MAX_CONFLICTS_LIMIT = 10_000
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_frame_bytes: int = 8 * 1024 * 1024
    max_raw_bytes: int = 64 * 1024 * 1024
    max_in_flight_requests: int = 256
    max_in_flight_bytes: int = 64 * 1024 * 1024
    read_timeout_s: float = 30.0
    retry_after_s: int = 1


class _TooLarge(Exception):
    pass


def error_response(
    status: int, error: str, headers: dict[str, str] | None = None, **fields: Any
) -> web.Response:
    return web.json_response({"error": error, **fields}, status=status, headers=headers)


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
    ) -> None:
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
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight_bytes = 0

    def build(self) -> web.Application:
        app = web.Application(
            middlewares=[self._request_context], client_max_size=self.limits.max_frame_bytes
        )
        app.router.add_post("/v1/batches", self.post_batch)
        app.router.add_get("/v1/conflicts", self.get_conflicts)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_text)
        add_receiver_routes(app, self, self.receivers)
        return app

    # --- middleware -----------------------------------------------------------------------

    @web.middleware
    async def _request_context(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        offered = request.headers.get("X-Request-Id", "")
        request_id = offered if REQUEST_ID_RE.fullmatch(offered) else uuid.uuid4().hex
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id, worker=self.worker_name)
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # routing errors (404, 405) as JSON too
            response = error_response(exc.status, exc.reason.lower().replace(" ", "_"))
        except Exception:
            log.exception("unhandled_error", path=request.path)
            response = error_response(500, "internal")
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

    async def _post_batch(self, request: web.Request) -> tuple[web.Response, str, dict[str, Any]]:
        principal = self.authenticator.authenticate(request.headers.get("Authorization"))
        if principal is None:
            return (
                error_response(401, "unauthenticated", {"WWW-Authenticate": "Bearer"}),
                "unauthenticated",
                {},
            )
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity") or request.content_type not in FRAME_MEDIA_TYPES:
            return error_response(415, "unsupported_media"), "unsupported_media", {}
        declared = request.content_length
        if declared is not None and declared > self.limits.max_frame_bytes:
            return self._too_large(), "frame_too_large", {}
        reserve = declared if declared is not None else self.limits.max_frame_bytes
        if (
            self._in_flight >= self.limits.max_in_flight_requests
            or self._in_flight_bytes + reserve > self.limits.max_in_flight_bytes
        ):
            return self._overloaded(), "overloaded", {}
        self._reserve(1, reserve)
        try:
            return await self._receive_and_accept(request, principal)
        finally:
            self._reserve(-1, -reserve)

    @property
    def in_flight(self) -> int:
        """Batch POSTs being handled now (the graceful stop waits for them)."""
        return self._in_flight

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no batch POST is in flight; False if ``timeout_s`` passed first."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def admit(self, body_bytes: int) -> bool:
        """Count one more request holding ``body_bytes`` under the in-flight caps, or refuse
        it (False). The receivers (`collector.receivers`) share the caps with batches."""
        if (
            self._in_flight >= self.limits.max_in_flight_requests
            or self._in_flight_bytes + body_bytes > self.limits.max_in_flight_bytes
        ):
            return False
        self._reserve(1, body_bytes)
        return True

    def admit_bytes(self, size: int) -> bool:
        """Reserve ``size`` more bytes (a payload being decompressed) for an admitted
        request, or refuse (False). A request alone in flight is always admitted."""
        if self._in_flight > 1 and self._in_flight_bytes + size > self.limits.max_in_flight_bytes:
            return False
        self._reserve(0, size)
        return True

    def release(self, requests: int, size: int) -> None:
        """Give back what `admit` / `admit_bytes` reserved."""
        self._reserve(-requests, -size)

    def _reserve(self, requests: int, size: int) -> None:
        self._in_flight += requests
        self._in_flight_bytes += size
        if self._in_flight:
            self._idle.clear()
        else:
            self._idle.set()
        self.metrics.in_flight_requests.set(self._in_flight)
        self.metrics.in_flight_bytes.set(self._in_flight_bytes)

    async def _receive_and_accept(
        self, request: web.Request, principal: Principal
    ) -> tuple[web.Response, str, dict[str, Any]]:
        try:
            async with asyncio.timeout(self.limits.read_timeout_s):
                body = await self._read_body(request)
        except _TooLarge:
            return self._too_large(), "frame_too_large", {}
        except TimeoutError:
            return error_response(408, "request_timeout"), "request_timeout", {}
        try:
            header = decode_header(body)
        except FrameError as exc:
            return error_response(400, "invalid_frame", detail=str(exc)), "invalid_frame", {}
        # Decompressed payloads count against the in-flight cap too: memory stays bounded.
        if header.payload_raw_len > self.limits.max_raw_bytes:  # poison, not load: 400, never 429
            detail = f"payload_raw_len {header.payload_raw_len} > max_raw_bytes {self.limits.max_raw_bytes}"
            return error_response(400, "invalid_frame", detail=detail), "invalid_frame", {}
        inflated = header.payload_raw_len if header.compressed else 0
        # A request alone in flight is always admitted: the cap bounds concurrency, and a
        # frame within every per-frame limit must never be refused forever.
        if (
            self._in_flight > 1
            and self._in_flight_bytes + inflated > self.limits.max_in_flight_bytes
        ):
            return self._overloaded(), "overloaded", {}
        self._reserve(0, inflated)
        try:
            return await self._decode_and_accept(body, header, principal)
        finally:
            self._reserve(0, -inflated)

    async def _decode_and_accept(
        self, body: bytes, frame: FrameHeader, principal: Principal
    ) -> tuple[web.Response, str, dict[str, Any]]:
        # The whole frame is decoded to validate it; the points are not kept, so they do
        # not stay in memory across the store calls (only the header is needed there).
        try:
            if len(body) > OFFLOAD_DECODE_BYTES:
                await asyncio.to_thread(decode_frame, body, max_raw_bytes=self.limits.max_raw_bytes)
            else:
                decode_frame(body, max_raw_bytes=self.limits.max_raw_bytes)
        except FrameError as exc:
            return error_response(400, "invalid_frame", detail=str(exc)), "invalid_frame", {}
        context = {
            "agent_id": frame.agent_id,
            "boot_id": str(frame.boot_id),
            "seq": f"{frame.seq_start}-{frame.seq_end}",
        }
        if not principal.may_write(frame.agent_id):
            detail = f"principal {principal.name!r} may not write agent_id {frame.agent_id!r}"
            return error_response(403, "forbidden", detail=detail), "forbidden", context
        sha = hashlib.sha256(body).hexdigest()
        context["frame_sha256"] = sha
        if self.spool is not None:
            return await self._spool_batch(frame, body, sha, context)
        try:
            result = await self.acceptor.accept(frame, body, sha)
        except (AcceptanceUnavailable, StoreConfigError) as exc:
            if isinstance(exc, StoreConfigError):  # e.g. 403: credentials or bucket policy
                log.error("store_refuses_access", error=str(exc), **context)
            else:
                log.warning("store_unavailable", error=str(exc), **context)
            headers = {"Retry-After": str(self.limits.retry_after_s)}
            return error_response(503, "store_unavailable", headers), "store_unavailable", context
        self.readiness.store_answered()
        if isinstance(result, Accepted):
            outcome = "duplicate" if result.duplicate else "accepted"
            self.metrics.store_ops_per_batch.labels(outcome=outcome).observe(result.store_ops)
            if not result.duplicate:
                self.metrics.bytes_accepted.inc(len(body))
                self.metrics.points_accepted.inc(frame.record_count)
            return web.json_response(self._accepted_body(result, sha)), outcome, context
        self.metrics.conflicts.inc()
        self.metrics.store_ops_per_batch.labels(outcome="conflict").observe(result.store_ops)
        body_409 = {
            "accepted_frame_sha256": result.accepted.frame_sha256,
            "submitted_frame_sha256": result.submitted_frame_sha256,
            "accepted_manifest_key": result.accepted.manifest_key,
            "quarantine_key": result.quarantine_key,
        }
        return error_response(409, "identity_conflict", None, **body_409), "conflict", context

    async def _spool_batch(
        self, frame: FrameHeader, body: bytes, sha: str, context: dict[str, Any]
    ) -> tuple[web.Response, str, dict[str, Any]]:
        """``local_spool`` mode: answer once the frame is durable locally (PROTOCOL §3.4)."""
        assert self.spool is not None
        identity = keys.BatchIdentity(frame.agent_id, frame.boot_id, frame.seq_start, frame.seq_end)
        try:
            answer = await self.spool.add(identity, sha, body)
        except SpoolFull as exc:
            log.warning("spool_full", error=str(exc), **context)
            headers = {"Retry-After": str(self.limits.retry_after_s)}
            return error_response(503, "store_unavailable", headers), "store_unavailable", context
        manifest_key = keys.accepted_manifest_key(identity)
        if answer.conflict_sha256 is not None:
            self.metrics.conflicts.inc()
            body_409 = {
                "accepted_frame_sha256": answer.conflict_sha256,
                "submitted_frame_sha256": sha,
                "accepted_manifest_key": manifest_key,
                "quarantine_key": keys.quarantine_key(identity, sha),
            }
            return error_response(409, "identity_conflict", None, **body_409), "conflict", context
        if not answer.duplicate:
            self.metrics.bytes_accepted.inc(len(body))
            self.metrics.points_accepted.inc(frame.record_count)
        outcome = "duplicate" if answer.duplicate else "accepted"
        return (
            web.json_response(
                {
                    "accepted": True,
                    "duplicate": answer.duplicate,
                    "spooled": True,
                    "agent_id": frame.agent_id,
                    "boot_id": str(frame.boot_id),
                    "seq_start": frame.seq_start,
                    "seq_end": frame.seq_end,
                    "frame_sha256": sha,
                    "manifest_key": manifest_key,
                    "collector_id": self.collector_id,
                }
            ),
            outcome,
            context,
        )

    async def _read_body(self, request: web.Request) -> bytes:
        """Read at most ``max_frame_bytes``; raise `_TooLarge` as soon as the body exceeds it."""
        limit = self.limits.max_frame_bytes
        chunks: list[bytes] = []
        size = 0
        while chunk := await request.content.readany():
            size += len(chunk)
            if size > limit:
                raise _TooLarge
            chunks.append(chunk)
        return b"".join(chunks)

    def _accepted_body(self, result: Accepted, sha: str) -> dict[str, Any]:
        manifest = result.manifest
        return {
            "accepted": True,
            "duplicate": result.duplicate,
            "agent_id": manifest.agent_id,
            "boot_id": manifest.boot_id,
            "seq_start": manifest.seq_start,
            "seq_end": manifest.seq_end,
            "frame_sha256": sha,
            "manifest_key": manifest.manifest_key,
            "collector_id": self.collector_id,
        }

    def _too_large(self) -> web.Response:
        return error_response(413, "frame_too_large", limit_bytes=self.limits.max_frame_bytes)

    def _overloaded(self) -> web.Response:
        return error_response(429, "overloaded", {"Retry-After": str(self.limits.retry_after_s)})

    # --- GET /v1/conflicts ---------------------------------------------------------------

    async def get_conflicts(self, request: web.Request) -> web.Response:
        principal = self.authenticator.authenticate(request.headers.get("Authorization"))
        if principal is None:
            return error_response(401, "unauthenticated", {"WWW-Authenticate": "Bearer"})
        if not principal.admin:
            return error_response(
                403, "forbidden", detail=f"principal {principal.name!r} is not an admin"
            )
        try:
            agent_id, since_ns, limit = _conflict_filters(request.query)
        except ValueError as exc:
            return error_response(400, "invalid_query", detail=str(exc))
        prefixes = (
            keys.quarantine_agent_prefixes(agent_id)
            if agent_id is not None
            else [keys.QUARANTINE_PREFIX]
        )
        conflicts: list[dict[str, Any]] = []
        truncated = False
        try:
            async for info in list_prefixes(self.store, prefixes):
                body, _ = await self.store.get(info.key)
                try:
                    conflict = records.IdentityConflict.from_json(body)
                except records.RecordError as exc:
                    log.warning("quarantine_record_unreadable", key=info.key, error=str(exc))
                    continue
                if since_ns is not None and conflict.observed_at_unix_ns < since_ns:
                    continue
                if len(conflicts) == limit:
                    truncated = True
                    break
                conflicts.append(
                    {**conflict.model_dump(mode="json", by_alias=True), "quarantine_key": info.key}
                )
        except (StoreError, StoreConfigError) as exc:
            log.warning("conflicts_listing_failed", error=str(exc))
            return error_response(
                503, "store_unavailable", {"Retry-After": str(self.limits.retry_after_s)}
            )
        return web.json_response({"conflicts": conflicts, "truncated": truncated})

    # --- health, readiness, metrics --------------------------------------------------------

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "alive", "collector_id": self.collector_id})

    async def readyz(self, _request: web.Request) -> web.Response:
        state = self.readiness.state()
        return web.json_response(state, status=200 if state["ready"] else 503)

    async def metrics_text(self, _request: web.Request) -> web.Response:
        self.metrics.index_buffered.set(self.acceptor.index_buffered)
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _conflict_filters(query: Any) -> tuple[str | None, int | None, int]:
    agent_id = query.get("agent_id")
    if agent_id is not None and not 1 <= len(agent_id.encode("utf-8")) <= 128:
        raise ValueError("agent_id must be 1..128 UTF-8 bytes")
    since_ns: int | None = None
    since = query.get("since")
    if since is not None:
        if since.isdigit():
            since_ns = int(since)
        else:
            try:
                moment = datetime.fromisoformat(since.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(
                    f"since must be unix nanoseconds or RFC 3339, got {since!r}"
                ) from None
            if moment.tzinfo is None:
                raise ValueError(f"since needs a timezone (e.g. Z), got {since!r}")
            since_ns = int(moment.timestamp() * 1_000_000_000)
    limit_text = query.get("limit", "1000")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_CONFLICTS_LIMIT:
        raise ValueError(f"limit must be 1..{MAX_CONFLICTS_LIMIT}, got {limit_text!r}")
    return agent_id, since_ns, int(limit_text)
