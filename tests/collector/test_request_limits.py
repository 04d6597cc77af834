"""PROTOCOL §2 order of checks and the per-worker limits, through real HTTP to a collector
served in this process (`tests.collector.inprocess`), so monkeypatches and captured logs
reach the server: issue 10 items 3 (decode amplification), 7 (headers, connections) and
9 (a duplicate's store requests).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
import zstandard
from structlog.testing import capture_logs

import protocol.frame
from chaos.faulty_store import Fault
from protocol import keys, records
from tests.collector.conftest import (
    Answer,
    get,
    make_frame,
    metric_value,
    post_frame,
    store_keys,
)
from tests.collector.inprocess import (
    ADMIN_TOKEN,
    LIMITS,
    WRITER_TOKEN,
    InProcessCollector,
    in_process_collector,
)
from tests.protocol import frame_vectors as vectors

BOMB_ROWS = 300_000
# Room for the bomb's payload (about 21 bytes a row) and its decoded points (about 280
# bytes a row, refused past max_raw_bytes: test_decode_amplification), nothing else changed.
BOMB_LIMITS = dataclasses.replace(LIMITS, max_raw_bytes=128 * 1024 * 1024)


def bomb_frame(agent_id: str = "agent-bomb", rows: int = BOMB_ROWS) -> bytes:
    """A few KB: a dictionary-encoded metric of one 256-byte value, ``rows`` rows (the
    frame of issue 10 item 3, smaller). ``decode_frame`` would expand it to 256 B a row."""
    table = pa.table(
        {
            "ts": pa.array([0] * rows, pa.int64()).cast(vectors.TS),
            "metric": pa.DictionaryArray.from_arrays(
                pa.array([0] * rows, pa.int8()), pa.array(["m" * 256])
            ),
            "value": pa.array([0.0] * rows),
            "labels": pa.nulls(rows, vectors.LABELS),
        }
    )
    raw = vectors.spec_stream(table)
    return vectors.spec_frame(
        payload=zstandard.ZstdCompressor(level=19).compress(raw),
        agent_id=agent_id.encode(),
        boot_id=uuid.uuid4().bytes,
        flags=0x01,
        payload_raw_len=len(raw),
        record_count=rows,
    )


class Decompressions:
    """Counts calls of `protocol.frame._decompress` (the first touch of a zstd payload)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.real: Callable[..., bytes] = protocol.frame._decompress
        monkeypatch.setattr(protocol.frame, "_decompress", self._counted)

    def _counted(self, *args: Any) -> bytes:
        self.calls += 1
        return self.real(*args)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened:
        yield opened


def ops_of(collector: InProcessCollector) -> dict[tuple[str, str], float]:
    """``lm_collector_store_operations_total`` by (op, result)."""
    counted: dict[tuple[str, str], float] = {}
    for family in collector.app.metrics.registry.collect():
        if family.name != "lm_collector_store_operations":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                counted[(sample.labels["op"], sample.labels["result"])] = sample.value
    return counted


def ops_delta(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]
) -> dict[tuple[str, str], float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


# --- item 3: authorize before the payload; check it off the loop, charged its bound -------


async def test_a_bomb_from_a_principal_allowed_no_agent_is_403_without_decompressing(
    session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    decompressions = Decompressions(monkeypatch)
    async with in_process_collector(limits=BOMB_LIMITS) as collector:
        answer = await post_frame(session, collector.base_url, bomb_frame(), token=ADMIN_TOKEN)

        assert answer.status == 403, answer
        assert answer.json["error"] == "forbidden"
        assert "may not write agent_id 'agent-bomb'" in answer.json["detail"]
        assert decompressions.calls == 0  # refused on the header alone
        assert await store_keys(collector.memory) == []


async def test_a_bomb_from_an_allowed_principal_is_checked_off_the_loop_and_accepted(
    session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()
    real = protocol.frame._decompress

    def held_decompress(*args: Any) -> bytes:
        entered.set()
        release.wait(timeout=30)
        try:
            return real(*args)
        finally:
            finished.set()

    monkeypatch.setattr(protocol.frame, "_decompress", held_decompress)
    frame = bomb_frame()
    async with in_process_collector(limits=BOMB_LIMITS) as collector:
        upload = asyncio.create_task(
            post_frame(session, collector.base_url, frame, token=WRITER_TOKEN)
        )
        try:
            assert await asyncio.to_thread(entered.wait, 30), "the payload was never checked"
            # The check is held inside decompression: the loop must still answer.
            timeout = aiohttp.ClientTimeout(total=10)
            async with aiohttp.ClientSession(timeout=timeout) as other:
                health = await get(other, f"{collector.base_url}/healthz")
            assert health.status == 200
            assert not finished.is_set(), "/healthz waited for the frame check"
        finally:
            release.set()
            answer = await upload

    assert answer.status == 200 and answer.json["duplicate"] is False, answer
    assert answer.json["seq_end"] - answer.json["seq_start"] + 1 == BOMB_ROWS


async def test_a_bomb_is_charged_what_checking_it_can_allocate(
    session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = bomb_frame()
    header = protocol.frame.decode_header(frame)
    # Room for the payload_raw_len it declares (the old charge), not for its check bound.
    cap = 2 * header.payload_raw_len
    limits = dataclasses.replace(BOMB_LIMITS, max_in_flight_bytes=cap)
    decompressions = Decompressions(monkeypatch)
    slow_started, release = asyncio.Event(), asyncio.Event()
    slow = make_frame("agent-slow")

    async def slow_body() -> AsyncIterator[bytes]:
        yield slow[:10]
        slow_started.set()
        await asyncio.wait_for(release.wait(), timeout=30)
        yield slow[10:]

    async with in_process_collector(limits=limits) as collector:
        async with aiohttp.ClientSession() as slow_session:
            held = asyncio.create_task(
                post_frame(slow_session, collector.base_url, slow_body(), token=WRITER_TOKEN)
            )
            try:
                await asyncio.wait_for(slow_started.wait(), timeout=30)
                deadline = time.monotonic() + 30
                while collector.app.in_flight < 1:  # the slow upload holds its slot
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)  # polling with a deadline
                refused = await post_frame(session, collector.base_url, frame, token=WRITER_TOKEN)
            finally:
                release.set()
                assert (await held).status == 200
        assert refused.status == 429 and refused.json == {"error": "overloaded"}, refused
        assert "Retry-After" in refused.headers
        assert decompressions.calls == 1  # only the slow upload's frame was checked

        alone = await post_frame(session, collector.base_url, frame, token=WRITER_TOKEN)
        assert alone.status == 200, alone  # alone in flight it is admitted, whatever it costs
    assert protocol.frame.payload_check_memory_bound(frame, header) > cap  # what it was charged


# --- item 7: Authorization bytes, slow headers, connection cap ------------------------


async def raw_request(port: int, request: bytes, *, timeout_s: float = 15) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=timeout_s)
    finally:
        writer.close()


def status_and_body(raw: bytes) -> tuple[int, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


@pytest.mark.parametrize("path", ["/v1/batches", "/v1/conflicts"])
async def test_an_authorization_header_that_is_not_utf8_is_401_without_a_traceback(
    path: str,
) -> None:
    frame = make_frame("agent-bytes")
    method = b"POST" if path == "/v1/batches" else b"GET"
    request = (
        method
        + b" "
        + path.encode()
        + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \xff\xfe\xc3(\r\n"
        + b"Content-Type: application/x-lmbatch\r\n"
        + f"Content-Length: {len(frame)}\r\nConnection: close\r\n\r\n".encode()
        + frame
    )
    async with in_process_collector() as collector:
        with capture_logs() as logs:
            raw = await raw_request(collector.port, request)
        status, body = status_and_body(raw)

        assert status == 401, raw[:300]
        assert b'"error": "unauthenticated"' in body
        assert not [e for e in logs if e.get("log_level") in ("error", "critical")], logs
        assert await store_keys(collector.memory) == []


async def test_request_headers_slower_than_the_read_timeout_are_cut_with_408() -> None:
    limits = dataclasses.replace(LIMITS, read_timeout_s=1.0)
    async with in_process_collector(limits=limits) as collector:
        reader, writer = await asyncio.open_connection("127.0.0.1", collector.port)
        started = time.monotonic()
        writer.write(b"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\n")

        async def trickle() -> None:  # one header byte every 0.2 s, never finishing
            for _ in range(200):
                await asyncio.sleep(0.2)
                writer.write(b"X")

        trickling = asyncio.create_task(trickle())
        try:
            # aiohttp alone would keep this connection for its 75 s keep-alive timeout.
            raw = await asyncio.wait_for(reader.read(), timeout=20)
        finally:
            trickling.cancel()
            writer.close()
        elapsed = time.monotonic() - started

        status, body = status_and_body(raw)
        assert status == 408 and b'"request_timeout"' in body, raw
        assert elapsed >= 1.0  # not before the read timeout
        metrics = (await _metrics(collector)).text
        assert (
            metric_value(
                metrics,
                "lm_collector_connections_refused_total",
                'reason="request_head_timeout"',
            )
            == 1
        )


async def _metrics(collector: InProcessCollector) -> Answer:
    async with aiohttp.ClientSession() as session:
        return await get(session, f"{collector.base_url}/metrics")


async def test_an_idle_keep_alive_connection_outlives_the_read_timeout(
    session: aiohttp.ClientSession,
) -> None:
    limits = dataclasses.replace(LIMITS, read_timeout_s=0.3)
    async with in_process_collector(limits=limits) as collector:
        reader, writer = await asyncio.open_connection("127.0.0.1", collector.port)
        try:
            for _ in range(2):
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
                assert head.startswith(b"HTTP/1.1 200"), head
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                await asyncio.sleep(0.6)  # idle (no request started) for twice the timeout
        finally:
            writer.close()


async def test_connections_beyond_the_cap_are_refused_and_a_freed_slot_is_reused() -> None:
    limits = dataclasses.replace(LIMITS, max_connections=2)
    ping = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    async with in_process_collector(limits=limits) as collector:
        held = []
        for _ in range(2):  # two keep-alive connections, each answered once: both counted
            reader, writer = await asyncio.open_connection("127.0.0.1", collector.port)
            writer.write(ping)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            assert head.startswith(b"HTTP/1.1 200"), head
            held.append(writer)

        refused = await raw_request(collector.port, ping, timeout_s=10)
        status, body = status_and_body(refused)
        assert status == 429 and b'"overloaded"' in body, refused

        held.pop().close()
        deadline = time.monotonic() + 20
        while True:  # the server notices the closed connection; then a new one is served
            raw = await raw_request(
                collector.port, ping.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
            )
            if raw.startswith(b"HTTP/1.1 200"):
                break
            assert time.monotonic() < deadline, raw
            await asyncio.sleep(0.05)  # polling with a deadline
        for writer in held:
            writer.close()
        metrics = (await _metrics(collector)).text
        refusals = metric_value(
            metrics, "lm_collector_connections_refused_total", 'reason="over_connection_cap"'
        )
        assert refusals is not None and refusals >= 1


# --- item 9 and §3.2: what a duplicate and a re-send cost ------------------------------


async def test_a_resend_is_answered_with_one_get_and_a_duplicate_with_one_refused_put(
    session: aiohttp.ClientSession,
) -> None:
    frame = make_frame("agent-resend")
    async with in_process_collector() as collector:
        first = await post_frame(session, collector.base_url, frame, token=WRITER_TOKEN)
        assert first.status == 200 and first.json["duplicate"] is False
        stored = sorted(await store_keys(collector.memory))

        before = ops_of(collector)
        resent = await post_frame(
            session,
            collector.base_url,
            frame,
            token=WRITER_TOKEN,
            headers={"X-Lightmetrics-Resend": "1"},
        )
        after_resend = ops_of(collector)
        again = await post_frame(session, collector.base_url, frame, token=WRITER_TOKEN)
        after_again = ops_of(collector)

        assert resent.status == 200 and resent.json["duplicate"] is True, resent
        assert resent.json["manifest_key"] == first.json["manifest_key"]
        assert ops_delta(before, after_resend) == {("get_manifest", "ok"): 1}
        assert again.status == 200 and again.json["duplicate"] is True, again
        assert ops_delta(after_resend, after_again) == {
            ("put_raw_blob", "precondition_failed"): 1,  # the only upload of the frame
            ("get_manifest", "ok"): 1,  # the blob existed: the manifest settles it
        }
        assert sorted(await store_keys(collector.memory)) == stored  # nothing written


async def test_a_resend_of_a_new_batch_takes_the_normal_steps(
    session: aiohttp.ClientSession,
) -> None:
    async with in_process_collector() as collector:
        before = ops_of(collector)
        answer = await post_frame(
            session,
            collector.base_url,
            make_frame("agent-resend-new"),
            token=WRITER_TOKEN,
            headers={"X-Lightmetrics-Resend": "1"},
        )

        assert answer.status == 200 and answer.json["duplicate"] is False, answer
        assert ops_delta(before, ops_of(collector)) == {
            ("get_manifest", "not_found"): 1,
            ("put_raw_blob", "ok"): 1,
            ("put_manifest", "ok"): 1,
        }


@pytest.mark.parametrize("resend", [False, True], ids=["plain", "resend"])
async def test_a_conflict_is_409_only_once_its_quarantine_record_exists(
    resend: bool, session: aiohttp.ClientSession
) -> None:
    accepted = make_frame("agent-conflict", value=1.0)
    other = make_frame("agent-conflict", value=2.0)
    headers = {"X-Lightmetrics-Resend": "1"} if resend else {}
    async with in_process_collector(budget_s=0.5) as collector:
        assert (
            await post_frame(session, collector.base_url, accepted, token=WRITER_TOKEN)
        ).status == 200
        # The quarantine create hangs past the request budget: its outcome is unknown.
        collector.store.script("put_if_none_match", keys.QUARANTINE_PREFIX, Fault.HANG)

        down = await post_frame(
            session, collector.base_url, other, token=WRITER_TOKEN, headers=headers
        )

        assert down.status == 503 and down.json == {"error": "store_unavailable"}, down
        assert await store_keys(collector.memory, keys.QUARANTINE_PREFIX) == []

        conflict = await post_frame(
            session, collector.base_url, other, token=WRITER_TOKEN, headers=headers
        )

        assert conflict.status == 409, conflict
        body, _ = await collector.memory.get(conflict.json["quarantine_key"])
        record = records.IdentityConflict.from_json(body)
        assert record.submitted_frame_sha256 == conflict.json["submitted_frame_sha256"]
        await collector.memory.head(record.submitted_raw_blob_key)  # the bytes are kept
