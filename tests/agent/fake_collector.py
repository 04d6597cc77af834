"""A small real HTTP collector for agent tests: scripted answers, then PROTOCOL §2
semantics (identity → first frame_sha256 wins; same hash → 200 duplicate; other → 409).

Scripted actions are consumed one per request, in order, across every URL served by the
same `CollectorState`; when the script is empty the protocol answer is given.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from protocol.frame import FrameError, decode_header
from protocol.keys import BatchIdentity


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


DROP = "drop"  # close the connection without answering
HANG = "hang"  # never answer (until `release` is set)
Action = Reply | str


@dataclass
class SeenRequest:
    server: int
    headers: dict[str, str]
    body: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()


class CollectorState:
    def __init__(self, script: list[Action] | None = None) -> None:
        self.script: deque[Action] = deque(script or [])
        self.accepted: dict[BatchIdentity, bytes] = {}
        self.requests: list[SeenRequest] = []
        self.release = asyncio.Event()

    def app(self, server: int) -> web.Application:
        app = web.Application()

        async def batches(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            self.requests.append(SeenRequest(server, dict(request.headers), body))
            action = self.script.popleft() if self.script else None
            if action == DROP:
                assert request.transport is not None
                request.transport.close()
                return web.Response(status=200)
            if action == HANG:
                await self.release.wait()
                return web.json_response({"error": "store_unavailable"}, status=503)
            if isinstance(action, Reply):
                return web.json_response(
                    action.body or {}, status=action.status, headers=action.headers
                )
            return self._protocol_answer(body)

        app.router.add_post("/v1/batches", batches)
        return app

    def _protocol_answer(self, body: bytes) -> web.Response:
        try:
            header = decode_header(body)
        except FrameError as exc:
            return web.json_response({"error": "invalid_frame", "detail": str(exc)}, status=400)
        identity = BatchIdentity(header.agent_id, header.boot_id, header.seq_start, header.seq_end)
        sha = hashlib.sha256(body).hexdigest()
        held = self.accepted.setdefault(identity, body)
        held_sha = hashlib.sha256(held).hexdigest()
        if held_sha != sha:
            return web.json_response(
                {
                    "error": "identity_conflict",
                    "accepted_frame_sha256": held_sha,
                    "submitted_frame_sha256": sha,
                },
                status=409,
            )
        return web.json_response(
            {
                "accepted": True,
                "duplicate": held is not body,
                "agent_id": header.agent_id,
                "boot_id": str(header.boot_id),
                "seq_start": header.seq_start,
                "seq_end": header.seq_end,
                "frame_sha256": sha,
            },
            status=200,
        )


class FakeCollectors:
    """``count`` HTTP servers on 127.0.0.1 sharing one `CollectorState`."""

    def __init__(self, state: CollectorState, count: int = 1) -> None:
        self.state = state
        self.servers = [TestServer(state.app(i), host="127.0.0.1") for i in range(count)]

    async def __aenter__(self) -> FakeCollectors:
        for server in self.servers:
            await server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.state.release.set()
        for server in self.servers:
            await server.close()

    @property
    def urls(self) -> list[str]:
        return [str(server.make_url("")).rstrip("/") for server in self.servers]


def json_of(data: bytes) -> Any:
    return json.loads(data)
