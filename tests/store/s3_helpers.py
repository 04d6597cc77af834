"""Helpers of the S3 store tests: a store with test settings, and a scripted S3 server
for the failures local servers never produce (5xx, 409, throttling, hangs, drops)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from protocol.clock import ManualClock
from store.base import ObjectStore
from store.retry import Backoff
from store.s3 import S3Store

ATTEMPTS = 3


def make_store(endpoint_url: str, bucket: str, prefix: str = "", **options: Any) -> S3Store:
    """A store with short timeouts and a manual clock, so retries never really sleep."""
    settings: dict[str, Any] = {
        "connect_timeout_s": 1.0,
        "read_timeout_s": 10.0,
        "backoff": Backoff(attempts=ATTEMPTS),
        "clock": ManualClock(),
        **options,
    }
    return S3Store(bucket=bucket, prefix=prefix, endpoint_url=endpoint_url, **settings)


async def keys_of(
    store: ObjectStore, prefix: str = "", start_after: str | None = None
) -> list[str]:
    return [info.key async for info in store.list(prefix, start_after)]


async def signed_delete(store: S3Store) -> None:
    await store.send_signed_delete(await store.sign_delete("k", expires_in_s=60))


OPERATIONS: dict[str, Callable[[S3Store], Awaitable[Any]]] = {
    "create": lambda s: s.put("k", b"body", if_none_match=True),
    "swap": lambda s: s.put("k", b"body", if_match='"0123456789abcdef0123456789abcdef"'),
    "put": lambda s: s.put("k", b"body"),
    "get": lambda s: s.get("k"),
    "head": lambda s: s.head("k"),
    "delete": lambda s: s.delete("k"),
    "list": lambda s: keys_of(s),
    "signed_delete": signed_delete,
}
"""Each store operation on the key ``k``, as the failure tests call it."""


# (status, S3 error code[, message]) or "hang" / "close" / "reset"
Behaviour = tuple[int, str] | tuple[int, str, str] | str


class ScriptedS3Server:
    """Answers the n-th request with ``behaviours[n]`` (the last one repeats).

    ``(200, "")`` is success (with an ETag; to a GET also ``object_body`` and
    ``object_headers``), ``(206, "")`` too (its Content-Range names the body sent);
    ``(304, "")`` Not Modified; ``(status, code)`` an S3 error document; ``"hang"`` reads
    the request and never answers; ``"close"`` closes the connection instead of
    answering; ``"reset"`` aborts it with a TCP RST. ``requests`` records ``(method,
    path, headers)`` of every complete request received, ``bodies`` their bodies.
    ``date``: a ``Date`` header for every answer (none by default).
    """

    def __init__(
        self,
        *behaviours: Behaviour,
        date: str | None = None,
        object_body: bytes = b"",
        object_headers: dict[str, str] | None = None,
    ) -> None:
        self.behaviours = behaviours
        self.date = date
        self.object_body = object_body
        self.object_headers = object_headers or {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.bodies: list[bytes] = []
        self._release = asyncio.Event()
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> ScriptedS3Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.endpoint_url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._server.close()
        self._release.set()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while await self._answer_one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _answer_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, path, _ = head[0].split(" ", 2)
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        received = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append((method, path, headers))
        self.bodies.append(received)
        behaviour = self.behaviours[min(len(self.requests), len(self.behaviours)) - 1]
        if behaviour == "hang":
            await self._release.wait()
            return False
        if behaviour == "close":
            return False
        if behaviour == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        assert isinstance(behaviour, tuple)
        status, code, message = (*behaviour, "scripted")[:3]
        extra, body = "" if self.date is None else f"Date: {self.date}\r\n", b""
        if status < 300:
            extra += 'ETag: "0123456789abcdef0123456789abcdef"\r\n'
            if method == "GET":
                body = self.object_body
                extra += "".join(f"{k}: {v}\r\n" for k, v in self.object_headers.items())
                if status == 206:  # the part sent is the whole body here
                    extra += f"Content-Range: bytes 0-{len(body) - 1}/{len(body)}\r\n"
        elif method != "HEAD" and status != 304:  # HEAD and 304 have no body
            body = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
        writer.write(
            f"HTTP/1.1 {status} Scripted\r\nContent-Type: application/xml\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        return True
