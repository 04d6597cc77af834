"""The collector's HTTP app in this process, over a memory store or a fault-injecting one.

The app is assembled from the same parts `collector.server.Worker` wires together and
served by an `aiohttp.web.AppRunner` configured like the worker's, on 127.0.0.1. This is
where store failures (503, readiness) are driven deterministically with `FaultyStore`,
and where hypothesis throws many bodies and headers at the API: every answer must be a
4xx (or 200/409 for a valid frame), never a 5xx, and the server must keep working.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.faulty_store import Fault, FaultyStore
from collector.auth import Authenticator
from collector.intake import HttpLimits
from collector.readiness import Readiness
from protocol import keys, records
from protocol.clock import ManualClock
from protocol.frame import FrameError, decode_frame
from protocol.frame_encode import encode_frame, points_table
from store.memory import MemoryStore
from tests.collector.conftest import (
    FRAME_TYPE,
    Answer,
    get,
    make_frame,
    post_frame,
    store_keys,
)
from tests.collector.inprocess import (
    ADMIN_TOKEN,
    LIMITS,
    TOKENS,
    WRITER_TOKEN,
    InProcessCollector,
    in_process_collector,
)

T = TypeVar("T")


@pytest.fixture
async def collector() -> AsyncIterator[InProcessCollector]:
    async with in_process_collector() as running:
        yield running


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened:
        yield opened


def sha_of(frame: bytes) -> str:
    return hashlib.sha256(frame).hexdigest()


async def manifest_keys(store: MemoryStore) -> list[str]:
    return await store_keys(store, keys.ACCEPTED_PREFIX)


# --- 503: the store does not settle the outcome -------------------------------------------


async def test_unavailable_store_is_503_with_retry_after_and_never_accepts(
    session: aiohttp.ClientSession,
) -> None:
    async with in_process_collector(budget_s=0.5) as collector:
        frame = make_frame("agent-503")
        collector.store.set_rates({"put_if_none_match": {Fault.UNAVAILABLE: 1.0}})

        answer = await post_frame(session, collector.base_url, frame, token=WRITER_TOKEN)

        assert answer.status == 503, answer
        assert answer.json == {"error": "store_unavailable"}
        assert int(answer.headers["Retry-After"]) >= 1
        assert answer.request_id
        assert await store_keys(collector.memory) == []

        collector.store.set_rates({})
        retried = await post_frame(session, collector.base_url, frame, token=WRITER_TOKEN)
        assert retried.status == 200 and retried.json["duplicate"] is False, retried


async def test_hanging_store_is_503_within_the_request_budget(
    session: aiohttp.ClientSession,
) -> None:
    async with in_process_collector(budget_s=0.5) as collector:
        collector.store.script("put_if_none_match", keys.ACCEPTED_PREFIX, Fault.HANG)
        started = time.monotonic()

        answer = await post_frame(
            session, collector.base_url, make_frame("agent-hang"), token=WRITER_TOKEN
        )

        assert answer.status == 503, answer
        assert time.monotonic() - started < 5.0
        assert await manifest_keys(collector.memory) == []


async def test_duplicate_whose_manifest_cannot_be_read_is_503_not_200(
    session: aiohttp.ClientSession,
) -> None:
    async with in_process_collector(budget_s=0.5) as collector:
        frame = make_frame("agent-unreadable")
        first = await post_frame(session, collector.base_url, frame, token=WRITER_TOKEN)
        assert first.status == 200
        collector.store.set_rates({"get": {Fault.UNAVAILABLE: 1.0}})

        again = await post_frame(session, collector.base_url, frame, token=WRITER_TOKEN)

        assert again.status == 503, again
        collector.store.set_rates({})
        settled = await post_frame(session, collector.base_url, frame, token=WRITER_TOKEN)
        assert settled.status == 200 and settled.json["duplicate"] is True, settled


async def test_lost_reply_of_our_own_manifest_create_is_one_new_acceptance(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    frame = make_frame("agent-lost-reply")
    collector.store.script("put_if_none_match", keys.ACCEPTED_PREFIX, Fault.LOST_REPLY)

    answer = await post_frame(session, collector.base_url, frame, token=WRITER_TOKEN)

    assert answer.status == 200 and answer.json["duplicate"] is False, answer
    assert await manifest_keys(collector.memory) == [answer.json["manifest_key"]]


async def test_conflict_listing_with_store_down_is_503(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    collector.store.set_rates({"list": {Fault.UNAVAILABLE: 1.0}})

    answer = await get(session, f"{collector.base_url}/v1/conflicts", token=ADMIN_TOKEN)

    assert answer.status == 503, answer
    assert answer.json["error"] == "store_unavailable"
    assert "Retry-After" in answer.headers


# --- the in-flight byte cap must not refuse what could never fit -------------------------


def _payload_raw_len(frame: bytes) -> int:
    (raw_len,) = struct.unpack_from(">I", frame, 48)
    return int(raw_len)


async def test_payload_raw_len_over_max_raw_bytes_is_400_not_429(
    session: aiohttp.ClientSession,
) -> None:
    frame = make_frame("agent-inflated")  # zstd-compressed
    body = frame[:-4]
    claimed = body[:48] + struct.pack(">I", 2**31) + body[52:]  # a header-valid claim

    async with in_process_collector(limits=HttpLimits()) as collector:  # the defaults
        answer = await post_frame(session, collector.base_url, _recrc(claimed), token=WRITER_TOKEN)

    assert answer.status == 400, answer  # poison: retrying can never help
    assert "payload_raw_len" in answer.json["detail"]


async def test_valid_frame_within_every_limit_is_accepted_by_an_idle_collector(
    session: aiohttp.ClientSession,
) -> None:
    rows = 40_000
    table = points_table(
        [1_760_000_000_000_000_000 + i for i in range(rows)],
        ["m"] * rows,
        [1.0] * rows,
        [None] * rows,
    )
    frame = encode_frame(agent_id="agent-big", boot_id=uuid.uuid4(), seq_start=0, points=table)
    raw_len = _payload_raw_len(frame)
    # As the shipped defaults: max_in_flight_bytes == max_raw_bytes (64 MiB each).
    limits = HttpLimits(
        max_frame_bytes=len(frame), max_raw_bytes=raw_len, max_in_flight_bytes=raw_len
    )
    async with in_process_collector(limits=limits) as collector:
        answer = await post_frame(session, collector.base_url, frame, token=WRITER_TOKEN)

    assert answer.status == 200, answer


# --- readiness ----------------------------------------------------------------------------


async def test_readyz_turns_503_when_the_store_stops_answering(
    session: aiohttp.ClientSession,
) -> None:
    clock = ManualClock()
    async with in_process_collector(readiness_clock=clock) as collector:
        url = f"{collector.base_url}/readyz"
        assert (await get(session, url)).status == 503  # nothing answered yet
        assert await collector.readiness.check_once() is True
        ready = await get(session, url)
        assert ready.status == 200 and ready.json["ready"] is True, ready

        collector.store.set_rates({"head": {Fault.UNAVAILABLE: 1.0}})
        assert await collector.readiness.check_once() is False
        clock.advance(16.0)  # past the readiness window since the last answer
        assert await collector.readiness.check_once() is False

        down = await get(session, url)
        assert down.status == 503, down
        assert down.json["ready"] is False and down.json["probe_passed"] is True
        assert down.request_id
        assert (await get(session, f"{collector.base_url}/healthz")).status == 200

        collector.store.set_rates({})
        assert await collector.readiness.check_once() is True
        assert (await get(session, url)).status == 200

        collector.readiness.probe_passed = False
        assert (await get(session, url)).status == 503


async def test_readiness_check_times_out_on_a_hanging_store() -> None:
    clock = ManualClock()
    store = FaultyStore(MemoryStore(), seed=1)
    readiness = Readiness(store=store, clock=clock, interval_s=0.2)
    store.set_rates({"head": {Fault.HANG: 1.0}})
    started = time.monotonic()
    assert await readiness.check_once() is False
    assert time.monotonic() - started < 5.0


# --- fuzz ---------------------------------------------------------------------------------

FUZZ_SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def run_on_loop(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], timeout_s: float = 30
) -> T:
    """Run ``coro`` on the test's event loop from hypothesis's worker thread."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=timeout_s)


def decodes(body: bytes) -> bool:
    try:
        decode_frame(body, max_raw_bytes=LIMITS.max_raw_bytes)
    except FrameError:
        return False
    return True


def writer_may_write(body: bytes) -> bool:
    """Whether the writer token's principal may write the (valid) frame's agent_id."""
    writer = TOKENS.principal_for_token(WRITER_TOKEN)
    assert writer is not None
    return writer.may_write(decode_frame(body, max_raw_bytes=LIMITS.max_raw_bytes).agent_id)


@st.composite
def valid_frames(draw: st.DrawFn) -> bytes:
    rows = draw(st.integers(1, 4))
    agent = "agent-" + draw(st.text("abcdefghij0123456789-", min_size=1, max_size=12))
    values = draw(st.lists(st.floats(allow_nan=True), min_size=rows, max_size=rows))
    labels = draw(
        st.lists(
            st.one_of(
                st.none(),
                st.dictionaries(st.text("xyz", min_size=1, max_size=3), st.text(max_size=5)),
            ),
            min_size=rows,
            max_size=rows,
        )
    )
    table = points_table(
        [1_760_000_000_000_000_000 + i for i in range(rows)], ["m"] * rows, values, labels
    )
    return encode_frame(
        agent_id=agent,
        boot_id=uuid.UUID(int=draw(st.integers(1, 2**128 - 1))),
        seq_start=draw(st.integers(0, 2**40)),
        points=table,
        compress=draw(st.booleans()),
    )


def _recrc(body_without_crc: bytes) -> bytes:
    return body_without_crc + struct.pack(">I", zlib.crc32(body_without_crc))


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    frame = bytearray(draw(valid_frames()))
    kind = draw(st.sampled_from(["flip", "flip_fix_crc", "truncate", "extend", "splice"]))
    if kind in ("flip", "flip_fix_crc"):
        limit = len(frame) - (4 if kind == "flip_fix_crc" else 0)
        for position in draw(st.lists(st.integers(0, limit - 1), min_size=1, max_size=4)):
            frame[position] ^= 1 << draw(st.integers(0, 7))
        return _recrc(bytes(frame[:-4])) if kind == "flip_fix_crc" else bytes(frame)
    if kind == "truncate":
        return bytes(frame[: draw(st.integers(0, len(frame) - 1))])
    if kind == "extend":
        return bytes(frame) + draw(st.binary(min_size=1, max_size=64))
    start = draw(st.integers(0, len(frame) - 1))
    end = draw(st.integers(start, len(frame)))
    spliced = bytes(frame[:start]) + draw(st.binary(max_size=32)) + bytes(frame[end:])
    return _recrc(spliced[:-4]) if draw(st.booleans()) and len(spliced) > 4 else spliced


FUZZ_BODIES = st.one_of(
    valid_frames(), mutated_frames(), st.binary(max_size=2048), st.just(b"LMB1")
)


async def _still_works(collector: InProcessCollector, session: aiohttp.ClientSession) -> None:
    fresh = make_frame("agent-canary", boot_id=uuid.uuid4())
    answer = await post_frame(session, collector.base_url, fresh, token=WRITER_TOKEN)
    assert answer.status == 200, f"collector stopped working: {answer}"


async def test_fuzz_bodies_get_200_409_or_400_never_5xx(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    loop = asyncio.get_running_loop()
    seen: dict[int, int] = {}

    @FUZZ_SETTINGS
    @given(body=FUZZ_BODIES)
    def check(body: bytes) -> None:
        answer = run_on_loop(
            loop, post_frame(session, collector.base_url, body, token=WRITER_TOKEN)
        )
        seen[answer.status] = seen.get(answer.status, 0) + 1
        assert answer.status < 500, answer
        assert answer.request_id, answer
        if decodes(body) and not writer_may_write(body):
            # A bit flip in agent_id with the CRC fixed is a valid frame of another agent.
            assert answer.status == 403 and answer.json["error"] == "forbidden", answer
        elif decodes(body):
            assert answer.status in (200, 409), answer
            if answer.status == 200:
                assert answer.json["frame_sha256"] == sha_of(body), answer
                stored, _ = run_on_loop(loop, collector.memory.get(answer.json["manifest_key"]))
                manifest = records.AcceptedManifest.from_json(stored)
                assert manifest.frame_sha256 == sha_of(body)
        else:
            assert answer.status == 400 and answer.json["error"] == "invalid_frame", answer
            assert answer.json["detail"]

    await asyncio.to_thread(check)
    assert sum(seen.values()) >= 100 and seen.get(400, 0) > 0 and seen.get(200, 0) > 0, seen
    await _still_works(collector, session)


HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
CONTENT_TYPES = st.one_of(
    st.sampled_from(
        [
            FRAME_TYPE,
            "application/octet-stream",
            "APPLICATION/X-LMBATCH",
            "application/x-lmbatch; charset=utf-8",
            "text/plain",
            "application/json",
            "multipart/form-data; boundary=x",
            "",
            ";;;",
        ]
    ),
    HEADER_TEXT,
)
ENCODINGS = st.one_of(
    st.none(),
    st.sampled_from(["identity", "IDENTITY", " identity ", "", "gzip", "deflate", "chunked", "x"]),
    HEADER_TEXT,
)
AUTHORIZATIONS = st.one_of(
    st.none(),
    st.sampled_from(
        [
            f"Bearer {WRITER_TOKEN}",
            f"bearer {WRITER_TOKEN}",
            f"Bearer  {WRITER_TOKEN} ",
            f"Bearer {ADMIN_TOKEN}",
            "Bearer",
            "Basic abc",
            WRITER_TOKEN,
        ]
    ),
    HEADER_TEXT,
    HEADER_TEXT.map(lambda text: f"Bearer {text}"),
)


def _valid_writer(authorization: str | None) -> bool:
    return Authenticator(TOKENS).authenticate(authorization) is not None


async def _post_with_headers(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> Answer | None:
    try:
        async with session.post(
            f"{url}/v1/batches", data=body, headers=headers, skip_auto_headers=["Content-Type"]
        ) as response:
            return Answer(response.status, response.headers.copy(), await response.text())
    except ValueError:
        return None  # the client refused to send this header value


async def test_fuzz_headers_get_4xx_or_200_never_5xx(
    collector: InProcessCollector,
) -> None:
    loop = asyncio.get_running_loop()
    valid = make_frame("agent-headers")

    @FUZZ_SETTINGS
    @given(
        content_type=CONTENT_TYPES,
        encoding=ENCODINGS,
        authorization=AUTHORIZATIONS,
        request_id=st.one_of(st.none(), HEADER_TEXT),
        body=st.one_of(st.just(valid), mutated_frames()),
    )
    def check(
        content_type: str,
        encoding: str | None,
        authorization: str | None,
        request_id: str | None,
        body: bytes,
    ) -> None:
        headers = {"Content-Type": content_type}
        for name, value in (
            ("Content-Encoding", encoding),
            ("Authorization", authorization),
            ("X-Request-Id", request_id),
        ):
            if value is not None:
                headers[name] = value

        async def one() -> Answer | None:
            # A new connection per example: every example starts from a clean connection.
            async with aiohttp.ClientSession() as session:
                return await _post_with_headers(session, collector.base_url, body, headers)

        answer = run_on_loop(loop, one())
        if answer is None:
            return
        assert answer.status < 500, answer
        if answer.headers.get("Content-Type", "").startswith("application/json"):
            assert answer.request_id, answer
        if not _valid_writer(authorization):
            assert answer.status == 401, answer
        elif (encoding or "identity").strip().lower() not in ("", "identity"):
            assert answer.status in (400, 415), answer  # 400: aiohttp's own for malformed HTTP
        if answer.status in (200, 409):
            assert decodes(body)

    await asyncio.to_thread(check)
    async with aiohttp.ClientSession() as session:
        await _still_works(collector, session)


async def _raw_exchange(port: int, request: bytes, *, half_close: bool) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        if half_close:
            writer.write_eof()
        return await asyncio.wait_for(reader.read(), timeout=10)
    except ConnectionError:
        return b""
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass


def _statuses(raw: bytes) -> list[int]:
    return [
        int(line.split(b" ")[1])
        for line in raw.split(b"\r\n")
        if line.startswith(b"HTTP/1.") and len(line.split(b" ")) > 1
    ]


async def test_fuzz_content_length_mismatch_never_5xx(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    loop = asyncio.get_running_loop()
    valid = make_frame("agent-raw")

    @settings(FUZZ_SETTINGS, max_examples=80)
    @given(body=st.one_of(st.just(valid), mutated_frames()), delta=st.integers(-64, 64))
    def check(body: bytes, delta: int) -> None:
        declared = max(0, len(body) + delta)
        request = (
            b"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/x-lmbatch\r\n"
            + f"Authorization: Bearer {WRITER_TOKEN}\r\nContent-Length: {declared}\r\n".encode()
            + b"Connection: close\r\n\r\n"
            + body
        )
        # Declared longer than sent: close our side, or the server waits for the rest.
        raw = run_on_loop(loop, _raw_exchange(collector.port, request, half_close=delta > 0))
        statuses = _statuses(raw)
        assert all(status < 500 for status in statuses), raw[:500]
        if delta == 0:
            allowed = (403,) if decodes(body) and not writer_may_write(body) else (200, 400, 409)
            assert len(statuses) == 1 and statuses[0] in allowed, raw[:500]

    await asyncio.to_thread(check)
    await _still_works(collector, session)
