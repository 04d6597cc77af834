"""Per-worker limits on client connections that aiohttp does not enforce itself.

- **Connection cap** (``http.max_connections``): a connection accepted while the worker
  already holds that many is answered ``429 {"error": "overloaded"}`` with
  ``Retry-After`` and closed at once, before it can hold a slot.
- **Request-head deadline** (``http.read_timeout_s``): from the first byte of a request,
  its headers must be complete within the read timeout, or the worker answers
  ``408 {"error": "request_timeout"}`` and closes the connection. aiohttp bounds a slow
  head only by the keep-alive timeout (75 s by default). The body is bounded by the
  handler with what is left of the same read timeout (`request_started` gives the start).

`GuardedTCPSite` listens like ``aiohttp.web.TCPSite`` but puts a `_GuardedConnection`
in front of each of aiohttp's per-connection protocols. The app's middleware calls
`ConnectionGuard.request_started` / `request_finished` (with ``request.protocol``): a
request has started when aiohttp hands it to the app, i.e. its head is complete. Idle
keep-alive connections stay aiohttp's business (``http.keepalive_timeout_s``): the
deadline starts with the first byte after the previous answer. (A head whose bytes all
arrived before the previous answer was sent is bounded only by keep-alive; pipelining
clients are rare and such a head is already in memory, bounded by aiohttp's line limits.)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web

_REFUSED_STATUS = {408: "Request Timeout", 429: "Too Many Requests"}
ConnectionEvent = Callable[[str], None]


def _raw_json_response(status: int, body: dict[str, Any], retry_after_s: int | None) -> bytes:
    """A complete HTTP/1.1 answer that closes the connection (written to the transport)."""
    payload = json.dumps(body).encode()
    head = [
        f"HTTP/1.1 {status} {_REFUSED_STATUS[status]}",
        "Content-Type: application/json; charset=utf-8",
        f"Content-Length: {len(payload)}",
        "Connection: close",
    ]
    if retry_after_s is not None:
        head.append(f"Retry-After: {retry_after_s}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


class ConnectionGuard:
    """The connections of one worker: how many are open, and each one's head deadline."""

    def __init__(
        self,
        *,
        max_connections: int,
        read_timeout_s: float,
        retry_after_s: int,
        on_event: ConnectionEvent | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.retry_after_s = retry_after_s
        self._on_event = on_event or (lambda _reason: None)
        self._by_handler: dict[object, _GuardedConnection] = {}

    @property
    def open_connections(self) -> int:
        return len(self._by_handler)

    def protocol_factory(
        self, make_handler: Callable[[], asyncio.Protocol]
    ) -> Callable[[], asyncio.Protocol]:
        """Wrap aiohttp's protocol factory (the runner's server)."""
        return lambda: _GuardedConnection(self, make_handler())

    def request_started(self, handler: object) -> float:
        """A request's head is complete: stop its deadline. Returns the monotonic time
        of the request's first byte (now, if unknown), for the body's share of the
        read timeout."""
        connection = self._by_handler.get(handler)
        return connection.request_started() if connection is not None else time.monotonic()

    def request_finished(self, handler: object) -> None:
        connection = self._by_handler.get(handler)
        if connection is not None:
            connection.request_finished()

    def _admit(self, connection: _GuardedConnection) -> bool:
        if len(self._by_handler) >= self.max_connections:
            self._on_event("over_connection_cap")
            return False
        self._by_handler[connection.handler] = connection
        return True

    def _forget(self, connection: _GuardedConnection) -> None:
        if self._by_handler.get(connection.handler) is connection:
            del self._by_handler[connection.handler]

    def _timed_out(self) -> None:
        self._on_event("request_head_timeout")


class _GuardedConnection(asyncio.Protocol):
    """Forwards every transport event to aiohttp's protocol, enforcing the guard."""

    def __init__(self, guard: ConnectionGuard, handler: asyncio.Protocol) -> None:
        self.guard = guard
        self.handler = handler
        self._transport: asyncio.Transport | None = None
        self._admitted = False
        self._busy = False  # a request is being handled (its head was complete)
        self._head_started_at: float | None = None
        self._deadline: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio subclass
        self._transport = transport
        if not self.guard._admit(self):
            answer = {"error": "overloaded"}
            transport.write(_raw_json_response(429, answer, self.guard.retry_after_s))
            transport.close()
            return
        self._admitted = True
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return  # refused: closing, nothing is read
        if not self._busy and self._head_started_at is None and data:
            self._head_started_at = time.monotonic()
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_later(self.guard.read_timeout_s, self._head_timed_out)
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received() if self._admitted else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        if self._admitted:
            self.guard._forget(self)
            self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._admitted:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self.handler.resume_writing()

    # --- requests ---------------------------------------------------------------------

    def request_started(self) -> float:
        self._cancel_deadline()
        self._busy = True
        started = self._head_started_at
        self._head_started_at = None
        return started if started is not None else time.monotonic()

    def request_finished(self) -> None:
        self._busy = False

    def _head_timed_out(self) -> None:
        self._deadline = None
        if self._busy or self._transport is None or self._transport.is_closing():
            return
        self.guard._timed_out()
        answer = {"error": "request_timeout"}
        self._transport.write(_raw_json_response(408, answer, None))
        self._transport.close()

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


class GuardedTCPSite(web.BaseSite):
    """``aiohttp.web.TCPSite`` with `ConnectionGuard` in front of every connection."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        guard: ConnectionGuard,
        backlog: int = 128,
        reuse_port: bool = False,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._guard = guard
        self._reuse_port = reuse_port

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        if server is None:
            raise RuntimeError("GuardedTCPSite started before its runner was set up")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._guard.protocol_factory(server),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_port=self._reuse_port,
        )
