"""``POST /api/v1/read``: the bad input of issue 32 through real HTTP (`read_client`),
each refused with a clear Prometheus-shaped error, never a 500, and with the event
loop's longest stall measured (at most 100 ms: `read_client.serving`): snappy bombs,
protobuf garbage, unknown media, tokens, RE2 refusals, 10,000 matchers, pathological
regexes, max_read_samples, a frame over max_read_frame_bytes, an error after the first
byte, and a client that goes away mid-read."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import aiohttp
import cramjam
import numpy as np
import pytest

from .read_client import body, post, query, samples_answer, serving
from .read_world import H1, WRITE_TOKEN, World, at, make_world, sent
from .xor_decode import read_frames


@pytest.fixture
async def world(tmp_path: Path) -> World:
    return await make_world(tmp_path)


def snappy_bomb(declared: int) -> bytes:
    """A snappy block declaring ``declared`` bytes, carrying a few."""
    preamble = bytearray()
    value = declared
    while value >= 0x80:
        preamble.append((value & 0x7F) | 0x80)
        value >>= 7
    preamble.append(value)
    return bytes(preamble) + b"\x00\x00"


BAD_INPUT = [
    ("snappy bomb (4 GiB declared)", snappy_bomb(0xFFFFFFFF), {}, 400, "max_read_request_bytes"),
    (
        "snappy bomb (just over)",
        snappy_bomb(4 * 1024 * 1024 + 1),
        {},
        400,
        "max_read_request_bytes",
    ),
    ("snappy that lies", snappy_bomb(1000), {}, 400, "snappy"),
    ("no snappy preamble", b"\xff\xff\xff\xff\xff\xff", {}, 400, "snappy"),
    ("protobuf garbage", bytes(cramjam.snappy.compress_raw(b"\xff" * 64)), {}, 400, "ReadRequest"),
    ("empty body", b"", {}, 400, "snappy"),
    ("unknown content type", body([]), {"content_type": "text/plain"}, 400, "Content-Type"),
    ("unknown encoding", body([]), {"encoding": "gzip"}, 400, "Content-Encoding"),
    ("no token", body([]), {"token": None}, 401, "token"),
    ("unknown token", body([]), {"token": "nope"}, 401, "token"),
    ("token without read", body([]), {"token": WRITE_TOKEN}, 403, "may not read"),
    ("regex RE2 refuses", body([query([("RE", "host", "(?<=a)b")])]), {}, 400, "invalid regex"),
    (
        "10,000 matchers",
        body([query([("EQ", "__name__", "cpu")] + [("NEQ", f"l{i}", "x") for i in range(9999)])]),
        {},
        400,
        "MAX_MATCHERS",
    ),
    (
        "unknown response types only",
        body([query([("EQ", "__name__", "cpu")])], [7]),
        {},
        400,
        "response type",
    ),
]


@pytest.mark.parametrize(
    ("data", "options", "status", "named"),
    [case[1:] for case in BAD_INPUT],
    ids=[case[0] for case in BAD_INPUT],
)
async def test_bad_input_is_refused_clearly_without_stalling(
    world: World, data: bytes, options: dict[str, Any], status: int, named: str
) -> None:
    async with serving(world) as (url, _probe):
        got, _headers, payload = await post(url, data, **options)
        assert got == status, payload
        answer = json.loads(payload)
        assert answer["status"] == "error" and named in answer["error"], answer
        assert answer["errorType"] in ("bad_data", "unauthorized", "forbidden")
        # The collector still answers a sound read afterwards.
        ok, _, _ = await post(url, body([query([("EQ", "__name__", "cpu")])]))
        assert ok == 200


async def test_regex_blowup_and_long_patterns_stay_linear(world: World) -> None:
    long_value = "a" * 1023 + "b"  # the longest label value the store keeps
    world.window.add(
        "long",
        H1.start_ns,
        sent(
            [(at(30), "long", 1.0, {"v": long_value})], seq_start=50, accepted_ns=H1.start_ns
        ).frame,
        now_ns=world.clock.now_ns(),
    )
    async with serving(world) as (url, _probe):
        for pattern in ("(a+)+$", "(a|aa)*(a|aa)*(a|aa)*c", "(x+x+)+y|" + "a?" * 2000 + "a" * 2000):
            status, _, payload = await post(
                url, body([query([("EQ", "__name__", "long"), ("RE", "v", pattern)])])
            )
            assert status == 200 and samples_answer(payload) == [[]]
        status, _, payload = await post(
            url, body([query([("EQ", "__name__", "long"), ("RE", "v", "(a+)+b")])])
        )
        assert status == 200 and len(samples_answer(payload)[0]) == 1
        huge = "(" + "a|" * 40_000 + "b)"  # over MAX_PATTERN_BYTES
        status, _, payload = await post(url, body([query([("RE", "v", huge)])]))
        assert status == 400 and b"MAX_PATTERN_BYTES" in payload


async def test_read_past_max_read_samples_is_refused_naming_the_limit(tmp_path: Path) -> None:
    world = await make_world(tmp_path, max_read_samples=3)
    async with serving(world) as (url, _probe):
        for types in ([], [1]):
            status, _, payload = await post(url, body([query([("RE", "__name__", ".+")])], types))
            assert status == 400 and b"query.max_read_samples" in payload
        status, _, payload = await post(url, body([query([("EQ", "__name__", "mem")])]))
        assert status == 200  # one sample: within the limit
    refused = world.endpoint.outcomes
    with refused.watch("reader") as seen:
        refused.record("reader", "limit", 400, "x")
    assert seen.failed and seen.of_kind("limit")


async def test_a_frame_over_max_read_frame_bytes_is_refused_before_the_first_frame(
    tmp_path: Path,
) -> None:
    world = await make_world(tmp_path, max_read_frame_bytes=64 * 1024)
    rng = np.random.default_rng(5)
    rows = [
        (at(20) + i * 1_000_000, "big", float(v), None) for i, v in enumerate(rng.random(12_000))
    ]
    big = sent(rows, seq_start=100, accepted_ns=H1.start_ns)
    world.window.add("big", H1.start_ns, big.frame, now_ns=world.clock.now_ns())
    async with serving(world) as (url, _probe):
        status, headers, payload = await post(url, body([query([("EQ", "__name__", "big")])], [1]))
        assert status == 400 and b"max_read_frame_bytes" in payload
        assert headers["Content-Type"].startswith("application/json")
        status, _, payload = await post(url, body([query([("EQ", "__name__", "big")])]))
    # Decoded outside `serving`: the probe measures the collector, not this test's work.
    assert status == 200 and len(samples_answer(payload)[0][0][1]) == 12_000  # no frames


async def test_an_error_after_the_first_byte_aborts_the_stream(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from collector.promql import encode

    real = encode.ChunkStream._frames

    def failing(self: encode.ChunkStream, query_index: int) -> Any:
        frames = real(self, query_index)
        yield next(frames)
        raise RuntimeError("encoder broke after the first frame")

    monkeypatch.setattr(encode.ChunkStream, "_frames", failing)
    with world.endpoint.outcomes.watch("reader") as seen:
        async with serving(world) as (url, _probe):
            with pytest.raises(aiohttp.ClientPayloadError):
                await post(url, body([query([("RE", "__name__", ".+")])], [1]))
    assert [o.message for o in seen.of_kind("load")] == [
        "stream aborted: RuntimeError('encoder broke after the first frame')"
    ]


async def test_a_client_that_goes_away_stops_the_read(tmp_path: Path) -> None:
    world = await make_world(tmp_path, fill=2000)  # the snapshot's file: 21 row groups
    started, calls = threading.Event(), []

    def hook(gone: threading.Event) -> None:  # on the selection's thread, before each unit
        calls.append(gone.is_set())
        if len(calls) == 3:  # the file, its first row group, now the second
            started.set()
            gone.wait(10)  # until the endpoint has seen the client leave

    world.endpoint.unit_hook = hook
    async with serving(world) as (url, _probe):
        task = asyncio.create_task(post(url, body([query([("RE", "__name__", ".+")])])))
        assert await asyncio.to_thread(started.wait, 10)
        task.cancel()  # closes the connection mid-read
        await asyncio.gather(task, return_exceptions=True)
        for _ in range(500):  # bounded: the read ends within one unit of work
            if world.endpoint.running == 0:
                break
            await asyncio.sleep(0.01)
        assert world.endpoint.running == 0
    work = world.endpoint.last_work
    assert work is not None
    # The row group in progress when the client left was the last one read: 2 of 21.
    assert calls == [False, False, False]
    assert (work.row_groups_read, work.row_groups_skipped, work.frames) == (2, 0, 0)
    assert (
        world.endpoint.metrics.remote_reads.labels(status="499", type="SAMPLES")._value.get() == 1
    )


async def test_a_snapshot_file_gone_is_503_and_recorded_as_load(world: World) -> None:
    snapshot = await world.endpoint.snapshots.latest()
    assert snapshot is not None
    for data_file in snapshot.data_files("points"):
        (world.store.root / data_file.path).unlink()
    with world.endpoint.outcomes.watch("reader") as seen:
        async with serving(world) as (url, _probe):
            status, headers, payload = await post(url, body([query([("RE", "__name__", ".+")])]))
    assert status == 503 and headers["Retry-After"] == "1"
    assert json.loads(payload)["errorType"] == "unavailable"
    assert len(seen.of_kind("load")) == 1 and seen.failed and not seen.of_kind("limit")
    # The world's window holds batches a collector accepted itself: a known gap.
    assert [o.message for o in seen.of_kind("partial")] == [
        "this collector follows only the batches it accepted itself"
    ]


async def test_a_stream_of_many_series_keeps_the_loop_free(world: World) -> None:
    rows = [(at(40) + i * 1_000_000, "many", float(i), {"i": str(i)}) for i in range(4000)]
    many = sent(rows, seq_start=200, accepted_ns=H1.start_ns)
    world.window.add("many", H1.start_ns, many.frame, now_ns=world.clock.now_ns())
    async with serving(world) as (url, _probe):  # asserts the loop was never busy > 100 ms
        status, _, payload = await post(url, body([query([("EQ", "__name__", "many")])], [1]))
    assert status == 200
    frames = read_frames(payload)
    assert len(frames) == 4000 and all(len(f.chunked_series) == 1 for f in frames)


async def test_a_designated_window_being_rebuilt_is_503(world: World) -> None:
    class Rebuilding:
        ready = False
        behind = True

    world.endpoint.follower = Rebuilding()  # type: ignore[assignment]
    async with serving(world) as (url, _probe):
        status, headers, payload = await post(url, body([query([("EQ", "__name__", "cpu")])]))
    assert status == 503 and headers["Retry-After"] == "1"
    assert "being rebuilt" in json.loads(payload)["error"]
