"""A stand-in remote-read server for the engine tests: an aiohttp app answering
``POST /api/v1/read`` the way a read server can, chosen per test through `mode`:
valid snappy ``SAMPLES`` answers from a fixed set of series, 429, 400, a slow answer
(past the engine's ``remote_timeout``), garbage, or answer only once a test says so.

It checks the bearer token the engine sends (401 otherwise) and records every read
(`reads`), so a test can assert that the engine's reads were served, not refused.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import cramjam
from aiohttp import web

from collector.promql.proto import read_pb2

Series = tuple[tuple[tuple[str, str], ...], tuple[tuple[int, float], ...]]


@dataclass
class StandinRead:
    token: str
    series: list[Series] = field(default_factory=list)
    mode: str = "ok"  # ok | 429 | 400 | slow | garbage | hold
    slow_s: float = 5.0
    reads: list[str] = field(default_factory=list)  # the outcome of each read
    hold: asyncio.Event = field(default_factory=asyncio.Event)  # mode "hold": answer when set
    held: list[int] = field(default_factory=list)  # reads that waited for `hold`

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/v1/read", self.read)
        return app

    async def read(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            self.reads.append("401")
            return web.Response(status=401, text="no token")
        body = await request.read()
        read_request = read_pb2.ReadRequest()
        read_request.ParseFromString(bytes(cramjam.snappy.decompress_raw(body)))
        if self.mode == "429":
            self.reads.append("429")
            return web.Response(status=429, text="too many reads in flight")
        if self.mode == "400":
            self.reads.append("400")
            return web.Response(status=400, text="read past query.max_read_samples (10)")
        if self.mode == "slow":
            self.reads.append("slow")
            await asyncio.sleep(self.slow_s)  # past the engine's remote_timeout: it gives up
        if self.mode == "hold":
            self.held.append(len(self.reads))
            await self.hold.wait()
        if self.mode == "garbage":
            self.reads.append("garbage")
            return web.Response(body=b"\x00not snappy", content_type="application/x-protobuf")
        response = read_pb2.ReadResponse()
        for query in read_request.queries:
            result = response.results.add()
            for labels, samples in self.series:
                if not _matches(dict(labels), query.matchers):
                    continue
                timeseries = result.timeseries.add()
                for name, label_value in labels:
                    timeseries.labels.add(name=name, value=label_value)
                for ts, sample in samples:
                    if query.start_timestamp_ms <= ts <= query.end_timestamp_ms:
                        timeseries.samples.add(timestamp=ts, value=sample)
        self.reads.append("ok")
        return web.Response(
            body=bytes(cramjam.snappy.compress_raw(response.SerializeToString())),
            headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"},
        )


def _matches(labels: dict[str, str], matchers: object) -> bool:
    for matcher in matchers:  # type: ignore[attr-defined]
        value = labels.get(matcher.name, "")
        if matcher.type == read_pb2.LabelMatcher.EQ and value != matcher.value:
            return False
        if matcher.type == read_pb2.LabelMatcher.NEQ and value == matcher.value:
            return False
    return True  # the tests use EQ/NEQ only
