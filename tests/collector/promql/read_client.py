"""Remote-read clients for the tests (a helper, not tests): requests built with
`collector.promql.proto.read_pb2`, posted through real HTTP to the collector's app served
in this process (`tests.collector.inprocess`) with a `read_world.World`'s endpoint,
answers decoded (SAMPLES with read_pb2; streams with the reference decoder of
`xor_decode`, reading only the first series of each frame as newer clients do), and a
probe of the event loop's longest stall while the collector serves."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import cramjam

from collector.promql.proto import read_pb2
from collector.promql.read_endpoint import PATH
from tests.collector.inprocess import in_process_collector

from .read_world import H0, H1, READ_TOKEN, Matcher, World, bits
from .xor_decode import read_frames, series_samples

MAX_STALL_S = 0.1
START_MS, END_MS = H0.start_ns // 1_000_000, H1.start_ns // 1_000_000
TYPES = {"EQ": 0, "NEQ": 1, "RE": 2, "NRE": 3}
STALLS: list[tuple[float, float]] = []  # (cpu, wall) of every `serving` block, for the report


class LoopProbe:
    """The event loop's longest stall while it runs: a task asking to wake every 5 ms
    records, per wait, the loop thread's CPU time (``worst``: work the loop did not
    yield from; a loaded machine preempting the process does not count) and the wall
    time past the 5 ms (``worst_wall``, reported)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.worst_wall = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            wall, cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0.005)
            self.worst = max(self.worst, time.thread_time() - cpu)
            self.worst_wall = max(self.worst_wall, time.perf_counter() - wall - 0.005)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> float:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return self.worst


@asynccontextmanager
async def serving(world: World) -> AsyncIterator[tuple[str, LoopProbe]]:
    async with in_process_collector(remote_read=world.endpoint) as collector:
        probe = LoopProbe()
        # The collector runs in this test worker's process, beside every object the
        # earlier tests of the worker left (millions, late in a run). A full collection
        # that a read's allocations happen to trigger would walk them all on the loop
        # thread (a 250 ms "stall" in one CI run, 4-13 ms for the same read alone):
        # frozen, they are not walked, and the probe measures the collector's own work
        # and garbage.
        gc.freeze()
        probe.start()
        try:
            yield collector.base_url + PATH, probe
        finally:
            gc.unfreeze()
            worst = await probe.stop()
            STALLS.append((worst, probe.worst_wall))
            print(f"event loop: busy {worst * 1000:.1f} ms, late {probe.worst_wall * 1000:.1f} ms")
            assert worst <= MAX_STALL_S, f"event loop busy {worst:.3f} s at once"


def query(
    matchers: Sequence[Matcher],
    start_ms: int = START_MS,
    end_ms: int = END_MS,
    hints: tuple[int, int] | None = None,
) -> read_pb2.Query:
    q = read_pb2.Query(start_timestamp_ms=start_ms, end_timestamp_ms=end_ms)
    for kind, name, value in matchers:
        q.matchers.add(type=TYPES[kind], name=name, value=value)
    if hints is not None:
        q.hints.start_ms, q.hints.end_ms = hints
    return q


def body(queries: Sequence[read_pb2.Query], types: Sequence[int] = ()) -> bytes:
    request = read_pb2.ReadRequest(queries=list(queries))
    request.accepted_response_types.extend(types)  # type: ignore[arg-type]
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


async def post(
    url: str,
    data: bytes,
    *,
    token: str | None = READ_TOKEN,
    content_type: str = "application/x-protobuf",
    encoding: str | None = "snappy",
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": content_type, "X-Prometheus-Remote-Read-Version": "0.1.0"}
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(url, data=data, headers=headers) as response,
    ):
        return response.status, dict(response.headers), await response.read()


def samples_answer(payload: bytes) -> list[list[tuple[Any, list[tuple[int, int]]]]]:
    response = read_pb2.ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(payload)))
    return [
        [
            (
                tuple((label.name, label.value) for label in series.labels),
                [(s.timestamp, bits(s.value)) for s in series.samples],
            )
            for series in result.timeseries
        ]
        for result in response.results
    ]


def stream_answer(payload: bytes) -> list[tuple[Any, list[tuple[int, int]]]]:
    frames = read_frames(payload)
    assert all(len(frame.chunked_series) == 1 for frame in frames)
    return list(series_samples(frames, first_only=True).items())
