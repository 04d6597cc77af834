"""`FaultProxy`: a seeded, fault-injecting HTTP reverse proxy in front of an S3 server.

Local S3 servers never answer 409 ConditionalRequestConflict or 503 SlowDown, never reset
a connection, never sit on a request, and never apply a write whose answer is then lost.
Real S3 does all of these. The proxy sits between our processes (collectors, reconciler,
rollup; their ``store.endpoint_url`` points here) and the server, and injects them.

Faults (`FaultKind`), decided per request:
- ``latency``: an extra delay (a `Latency` distribution) before the request goes on;
- ``error_500``: 500 InternalError, request not forwarded (a mutating client cannot
  know that, so it sees an unknown outcome);
- ``slowdown_503``: 503 SlowDown, request not forwarded;
- ``conflict_409``: 409 ConditionalRequestConflict, request not forwarded; only for
  conditional PUTs (If-None-Match / If-Match), as on S3;
- ``reset``: the connection is reset (RST) before forwarding;
- ``timeout``: the request is held, never forwarded, until the client gives up (or
  ``max_hold_s``), then reset;
- ``lost_answer``: the request IS forwarded and applied, then the answer is lost: the
  connection is reset, or a 500 is sent instead, or it is held until the client gives up;
- ``late_apply``: the request is held until the client gives up, then forwarded (applied
  after its sender stopped waiting, up to ``late_extra_s`` later): a request still in
  flight when its client timed out and retried;
- ``outage``: while a phase says the store is unreachable, every request is reset.

Which fault a request gets depends on a `Phase`: an ordered list of `FaultRule` (the first
rule whose operation and key prefix match decides), changeable during a run with
`FaultProxy.set_phase`. The operation comes from the method, the conditional headers and
the query (`classify`); keys are relative to the store root (the configured bucket and
prefix are stripped), so rules read like ``accepted/v1/``.

Determinism: a decision is a pure function (`decide`) of the seed, the phase name, the
operation, the key and how many requests for that (operation, key) the proxy has seen.
It does not depend on how requests from different keys interleave, so the same seed
replays the same fault schedule for the same requests even when concurrency reorders
them. `FaultProxy.schedule_digest` is an order-independent checksum of every decision
(a sum of hashes, like the rollup ledger's setsum), equal across two runs exactly when
they injected the same faults into the same requests.

Triggers (`FaultProxy.trigger`) run an action when a matching request arrives, before
or after it is forwarded: a scenario uses one to SIGKILL a rollup run exactly inside its
commit (after its snapshot write, before or after its pointer swap).

Loopback only: `start` refuses any other address.
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from chaos.faults import (
    CALM,
    CONDITIONAL_PUTS,
    MUTATING,
    OPERATIONS,
    RATED_KINDS,
    Decision,
    FaultKind,
    FaultRule,
    Latency,
    LostMode,
    Phase,
    classify,
    decide,
    decision_term,
)
from chaos.proxy_http import (
    REQUEST_HEADERS_DROPPED,
    RESPONSE_HEADERS_DROPPED,
    reset_connection,
    s3_error,
)

log = structlog.get_logger("chaos.proxy")


@dataclass
class Trigger:
    """Run ``action`` on the next request of one of ``ops`` on a key under ``prefix``:
    ``before`` forwarding it (then the request is dropped: its sender is presumed dead)
    or ``after`` (the request was applied; then the connection is reset)."""

    ops: frozenset[str]
    prefix: str
    action: Callable[[], Awaitable[None]]
    when: Literal["before", "after"] = "before"
    fired: bool = False


@dataclass(frozen=True, slots=True)
class InjectedFault:
    """One fault the proxy injected (kept for the report and the replay tests)."""

    at_monotonic: float
    phase: str
    op: str
    key: str
    occurrence: int
    kind: FaultKind
    lost_mode: LostMode | None = None


class FaultProxy:
    """Forwards every request to ``upstream`` unless the current `Phase` says otherwise.

    ``bucket``/``prefix`` name the store root, stripped from keys before rules match.
    ``max_hold_s`` bounds how long a ``timeout`` or held ``lost_answer`` keeps a request."""

    def __init__(
        self,
        *,
        upstream: str,
        seed: int,
        bucket: str,
        prefix: str = "",
        phase: Phase = CALM,
        max_hold_s: float = 30.0,
        late_extra_s: float = 1.0,
        record_limit: int = 100_000,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.seed = seed
        self.root = f"{bucket}/{prefix.strip('/')}/" if prefix.strip("/") else f"{bucket}/"
        self.phase = phase
        self.max_hold_s = max_hold_s
        self.late_extra_s = late_extra_s
        self._late: set[asyncio.Task[object]] = set()
        self.requests: Counter[str] = Counter()
        self.injected: Counter[FaultKind] = Counter()
        self.injected_by_op: Counter[tuple[str, FaultKind]] = Counter()
        self.forwarded = 0
        self.upstream_failures = 0
        self.client_gone = 0
        self.triggers: list[Trigger] = []
        self.faults: list[InjectedFault] = []
        self._record_limit = record_limit
        self._digest = 0
        self._occurrences: Counter[tuple[str, str]] = Counter()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._port = 0

    # --- lifecycle ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (loopback only; port 0 picks one). Returns the URL."""
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"the chaos proxy listens on loopback only, not {host!r}")
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=128, force_close=False),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            # Generous: the fault decides timeouts; a slow upstream is not ours to cut.
            timeout=aiohttp.ClientTimeout(total=120.0),
        )
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle, expect_handler=self._expect)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self._port = int(self._runner.addresses[0][1])
        log.info("chaos_proxy_listening", url=self.url, upstream=self.upstream)
        return self.url

    async def stop(self) -> None:
        for task in list(self._late):
            task.cancel()
        await asyncio.gather(*self._late, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # --- control -----------------------------------------------------------------------

    def set_phase(self, phase: Phase) -> None:
        """Switch rules now; requests already decided keep their fault."""
        log.info("chaos_proxy_phase", phase=phase.name, outage=phase.outage)
        self.phase = phase

    def trigger(self, trigger: Trigger) -> Trigger:
        """Arm ``trigger`` (fires once)."""
        self.triggers.append(trigger)
        return trigger

    @property
    def schedule_digest(self) -> str:
        """Order-independent checksum of every injected (op, key, occurrence, kind)."""
        return f"{self._digest % 2**256:064x}"

    def counters(self) -> dict[str, object]:
        return {
            "requests": dict(sorted(self.requests.items())),
            "forwarded": self.forwarded,
            "upstream_failures": self.upstream_failures,
            "client_gone": self.client_gone,
            "injected": {k.value: n for k, n in sorted(self.injected.items())},
            "injected_by_op": {
                f"{op}/{kind.value}": n for (op, kind), n in sorted(self.injected_by_op.items())
            },
            "schedule_digest": self.schedule_digest,
        }

    # --- the request path --------------------------------------------------------------

    async def _expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue`` as aiohttp does it, quietly when the client is gone."""
        if request.headers.get("Expect", "").lower() != "100-continue":
            return None
        try:
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        except ConnectionError:
            self.client_gone += 1  # a killed collector: nothing to answer
            return web.Response(status=400)
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.read()
        except (ConnectionError, aiohttp.ClientPayloadError) as exc:
            # The client went away mid-request (a killed collector): nothing to answer.
            self.client_gone += 1
            log.debug("chaos_proxy_client_gone", error=repr(exc))
            return web.Response(status=400)
        op, key = classify(request.method, request.rel_url, request.headers, self.root)
        self.requests[op] += 1
        occurrence = self._occurrences[(op, key)]
        self._occurrences[(op, key)] += 1
        trigger = next((t for t in self.triggers if op in t.ops and key.startswith(t.prefix)), None)
        if trigger is not None:
            self.triggers.remove(trigger)
            trigger.fired = True
            if trigger.when == "after":
                await self._forward(request, body)
            await trigger.action()
            return reset_connection(request)
        phase = self.phase
        decision = decide(self.seed, phase, op, key, occurrence)
        if decision.delay_s > 0:
            self.injected[FaultKind.LATENCY] += 1
            await asyncio.sleep(decision.delay_s)
        if decision.kind is not None:
            self._record(phase, op, key, occurrence, decision)
        match decision.kind:
            case None:
                return await self._forward(request, body)
            case FaultKind.ERROR_500:
                return s3_error(request, 500, "InternalError", "We encountered an internal error.")
            case FaultKind.SLOWDOWN_503:
                return s3_error(request, 503, "SlowDown", "Please reduce your request rate.")
            case FaultKind.CONFLICT_409:
                return s3_error(
                    request,
                    409,
                    "ConditionalRequestConflict",
                    "A conflicting conditional operation is currently in progress against "
                    "this resource. Please try again.",
                )
            case FaultKind.RESET | FaultKind.OUTAGE:
                return reset_connection(request)
            case FaultKind.TIMEOUT:
                await self._hold(request)
                return reset_connection(request)
            case FaultKind.LOST_ANSWER:
                await self._forward(request, body)  # applied upstream; the answer is dropped
                if decision.lost_mode == "error_500":
                    return s3_error(request, 500, "InternalError", "We encountered an error.")
                if decision.lost_mode == "hold":
                    await self._hold(request)
                return reset_connection(request)
            case FaultKind.LATE_APPLY:
                await self._hold(request)
                late = asyncio.ensure_future(
                    self._apply_late(request, body, decision.late_fraction * self.late_extra_s)
                )
                self._late.add(late)
                late.add_done_callback(self._late.discard)
                return reset_connection(request)
        raise AssertionError(f"unhandled decision {decision}")

    def _record(self, phase: Phase, op: str, key: str, occurrence: int, decision: Decision) -> None:
        kind = decision.kind
        assert kind is not None
        self.injected[kind] += 1
        self.injected_by_op[(op, kind)] += 1
        self._digest += decision_term(op, key, occurrence, kind)
        if len(self.faults) < self._record_limit:
            self.faults.append(
                InjectedFault(
                    time.monotonic(),
                    phase.name,
                    op,
                    key,
                    occurrence,
                    kind,
                    decision.lost_mode if kind is FaultKind.LOST_ANSWER else None,
                )
            )

    async def _apply_late(self, request: web.Request, body: bytes, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await self._forward(request, body)

    async def _hold(self, request: web.Request) -> None:
        """Keep the request unanswered until the client closes it, or ``max_hold_s``."""
        deadline = time.monotonic() + self.max_hold_s
        while time.monotonic() < deadline:
            transport = request.transport
            if transport is None or transport.is_closing():
                return
            await asyncio.sleep(0.05)  # polling the client's side, bounded by the deadline

    async def _forward(self, request: web.Request, body: bytes) -> web.StreamResponse:
        assert self._session is not None
        headers = CIMultiDict(
            (name, value)
            for name, value in request.headers.items()
            if name.lower() not in REQUEST_HEADERS_DROPPED
        )
        target = URL(self.upstream + request.rel_url.raw_path_qs, encoded=True)
        try:
            async with self._session.request(
                request.method,
                target,
                headers=headers,
                # A stream, not the bytes: aiohttp warns on a body over 1 MiB given as bytes
                # (the probe's and bundles' PUTs are up to the largest raw object, §3.10).
                data=io.BytesIO(body) if body or request.method in ("PUT", "POST") else None,
                allow_redirects=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            ) as answer:
                payload = await answer.read()
                out = CIMultiDict(
                    (name, value)
                    for name, value in answer.headers.items()
                    if name.lower() not in RESPONSE_HEADERS_DROPPED
                )
                status = answer.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            # The upstream itself is down (restarting): to the client that is a reset
            # connection, as it would be with no proxy in between.
            self.upstream_failures += 1
            log.debug("chaos_proxy_upstream_failed", error=repr(exc))
            return reset_connection(request)
        self.forwarded += 1
        if request.method == "HEAD":
            response = web.Response(status=status, headers=out)
            return response
        out.popall("Content-Length", None)
        return web.Response(status=status, headers=out, body=payload)


__all__ = [
    "CALM",
    "RATED_KINDS",
    "Latency",
    "LostMode",
    "CONDITIONAL_PUTS",
    "MUTATING",
    "OPERATIONS",
    "Decision",
    "FaultKind",
    "FaultProxy",
    "FaultRule",
    "InjectedFault",
    "Phase",
    "Trigger",
    "classify",
    "decide",
]
