"""``POST /api/v1/write``: Prometheus remote_write v1 into frames.

The sender is a real third-party client (``prometheus-remote-writer`` from PyPI) where
it can express the case; hand-built bodies cover what no well-behaved client sends
(bombs, garbage, remote write 2.0). The in-process app runs over a memory store behind
`FaultyStore`; the last tests run ``lm-collector serve`` processes on the filesystem
store and MiniStack.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import cramjam
import pytest
import snappy  # type: ignore[import-untyped]  # python-snappy: another sender's compressor
from prometheus_remote_writer import RemoteWriter  # type: ignore[import-untyped]

from chaos.faulty_store import Fault
from collector.intake import HttpLimits
from collector.receivers.frames import PointRows, content_boot_id
from collector.receivers.proto.wire_pb2 import WriteRequest
from config import ReceiverSettings
from protocol import keys
from protocol.frame_encode import encode_frame, points_table
from tests.collector.conftest import CollectorLauncher, metric_value, post_frame, store_keys
from tests.collector.inprocess import InProcessCollector
from tests.collector.receiver_fixtures import (
    LIMITS,
    OTHER_TOKEN,
    STORE_KINDS,
    TOKENS_TOML,
    WRITER_TOKEN,
    accepted_batches,
    in_process_collector,
    open_test_store,
    receiver_store_fixture,  # noqa: F401  # the receiver_store fixture
)
from tests.collector.test_processes import opened

MS0 = 1_760_000_000_000
STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}


@pytest.fixture
async def collector() -> AsyncIterator[InProcessCollector]:
    async with in_process_collector() as running:
        yield running


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened_session:
        yield opened_session


def remote_writer(base_url: str, token: str = WRITER_TOKEN, agent: str | None = "prom-1") -> Any:
    headers = {"X-Lightmetrics-Agent-Id": agent} if agent else {}
    return RemoteWriter(
        url=f"{base_url}/api/v1/write",
        auth={"bearer_token": token},
        headers=headers,
        retries=0,  # each send is one request: the test decides about re-sends
    )


SERIES = [
    {"metric": {"__name__": "cpu_seconds_total", "host": "a", "mode": "user"},
     "values": [10.0, 11.5, 13.0], "timestamps": [MS0, MS0 + 15_000, MS0 + 30_000]},
    {"metric": {"__name__": "up", "job": "node"}, "values": [1.0], "timestamps": [MS0]},
]  # fmt: skip


async def send(writer: Any, series: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    result = await asyncio.to_thread(writer.send, series)
    response = result.last_response
    return response.status_code, response.json()


def write_body(
    series: list[tuple[list[tuple[str, str]], list[tuple[float, int]]]],
    *,
    compress: Any = cramjam.snappy.compress_raw,
    histograms: int = 0,
) -> bytes:
    """A snappy WriteRequest from (labels in the order given, samples) pairs."""
    request = WriteRequest()
    for labels, samples in series:
        entry = request.timeseries.add()
        for name, value in labels:
            entry.labels.add(name=name, value=value)
        for value, timestamp in samples:
            entry.samples.add(value=value, timestamp=timestamp)
        entry.histograms.extend([b"\x08\x01"] * histograms)
    return bytes(compress(request.SerializeToString()))


async def post(
    session: aiohttp.ClientSession,
    base_url: str,
    body: bytes,
    *,
    token: str | None = WRITER_TOKEN,
    agent: str | None = "prom-1",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any], dict[str, str]]:
    sent = dict(HEADERS)
    if agent is not None:
        sent["X-Lightmetrics-Agent-Id"] = agent
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    sent.update(headers or {})
    async with session.post(f"{base_url}/api/v1/write", data=body, headers=sent) as answer:
        return answer.status, await answer.json(), dict(answer.headers)


# --- a real sender -----------------------------------------------------------------------


async def test_a_real_remote_writer_is_stored_once_and_a_resend_is_a_duplicate(
    collector: InProcessCollector,
) -> None:
    writer = remote_writer(collector.base_url)

    status, first = await send(writer, SERIES)
    resent_status, resent = await send(writer, SERIES)

    assert status == 200 and first["duplicate"] is False, first
    assert resent_status == 200 and resent["duplicate"] is True, resent
    assert resent["manifest_key"] == first["manifest_key"]
    assert (first["seq_start"], first["seq_end"], first["points"]) == (0, 3, 4)
    (batch,) = await accepted_batches(collector.memory)
    assert batch.manifest.agent_id == "prom-1"
    assert batch.manifest.boot_id == first["boot_id"]
    assert [(p["metric"], p["value"], p["ts"], p["seq"]) for p in batch.points] == [
        ("cpu_seconds_total", 10.0, MS0 * 10**6, 0),
        ("cpu_seconds_total", 11.5, (MS0 + 15_000) * 10**6, 1),
        ("cpu_seconds_total", 13.0, (MS0 + 30_000) * 10**6, 2),
        ("up", 1.0, MS0 * 10**6, 3),
    ]
    assert batch.points[0]["labels"] == {"host": "a", "mode": "user"}


async def test_a_reencoded_resend_is_a_duplicate_and_other_points_are_a_new_batch(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    labels = [("__name__", "temp"), ("room", "a"), ("floor", "1")]
    first = write_body([(labels, [(21.5, MS0)])])
    # Another client: labels in another order, another snappy implementation.
    reencoded = write_body([(list(reversed(labels)), [(21.5, MS0)])], compress=snappy.compress)
    other = write_body([(labels, [(21.5, MS0 + 1)])])
    assert reencoded != first

    answers = [await post(session, collector.base_url, body) for body in (first, reencoded, other)]

    assert [(status, body["duplicate"]) for status, body, _ in answers] == [
        (200, False),
        (200, True),
        (200, False),
    ]
    assert answers[0][1]["frame_sha256"] == answers[1][1]["frame_sha256"]
    assert answers[2][1]["boot_id"] != answers[0][1]["boot_id"]
    assert len(await accepted_batches(collector.memory)) == 2


async def test_the_same_points_in_other_frame_bytes_are_answered_as_a_duplicate(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    """Another library version may encode the same points into other bytes under the same
    (content-derived) identity: the points are stored, so the answer is a duplicate; the
    acceptor's quarantine record shows the pair to operators."""
    rows = PointRows()
    rows.append(MS0 * 10**6, "temp", 21.5, {"room": "a"})
    table = points_table(rows.ts_ns, rows.metrics, rows.values, rows.labels)
    other_bytes = encode_frame(
        agent_id="prom-1", boot_id=content_boot_id(rows), seq_start=0, points=table, compress=False
    )
    earlier = await post_frame(session, collector.base_url, other_bytes, token=WRITER_TOKEN)
    assert earlier.status == 200, earlier

    status, answer, _ = await post(
        session,
        collector.base_url,
        write_body([([("__name__", "temp"), ("room", "a")], [(21.5, MS0)])]),
    )

    assert status == 200, answer
    assert answer["duplicate"] is True and answer["encoding_differs"] is True
    assert answer["manifest_key"] == earlier.json["manifest_key"]
    assert len(await store_keys(collector.memory, keys.QUARANTINE_PREFIX)) == 1
    assert len(await accepted_batches(collector.memory)) == 1


async def test_local_spool_mode_acknowledges_from_the_spool(
    session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with in_process_collector(spool_dir=tmp_path / "spool") as running:
        body = write_body([([("__name__", "x")], [(1.0, MS0)])])
        first = await post(session, running.base_url, body)
        again = await post(session, running.base_url, body)
    assert first[0] == 200 and first[1]["spooled"] is True and first[1]["duplicate"] is False
    assert again[0] == 200 and again[1]["duplicate"] is True
    assert len(list((tmp_path / "spool" / "pending").glob("*.lmbatch"))) == 1


# --- identity and authorization -----------------------------------------------------------


async def test_agent_id_is_the_header_or_the_principal_and_is_authorized_before_decoding(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    body = write_body([([("__name__", "x")], [(1.0, MS0)])])

    named = await post(
        session, collector.base_url, body, headers={"X-Lightmetrics-Agent-Id": "prom-7"}
    )
    status, from_principal = await send(remote_writer(collector.base_url, agent=None), SERIES)
    forbidden = await post(
        session,
        collector.base_url,
        b"garbage, never decoded",
        headers={"X-Lightmetrics-Agent-Id": "other-1"},
    )
    principal_not_allowed = await post(
        session, collector.base_url, body, token=OTHER_TOKEN, agent=None
    )
    empty = await post(session, collector.base_url, body, agent="")
    no_token = await post(session, collector.base_url, body, token=None)

    assert named[0] == 200 and named[1]["agent_id"] == "prom-7"
    assert status == 200 and from_principal["agent_id"] == "prom-a"  # the principal's name
    assert forbidden[0] == 403 and forbidden[1]["error"] == "forbidden", forbidden
    # agent_id "other" (the principal's name) is not among its patterns (other-*).
    assert principal_not_allowed[0] == 403, principal_not_allowed
    assert empty[0] == 400 and empty[1]["error"] == "invalid_agent_id"
    assert no_token[0] == 401 and no_token[1] == {"error": "unauthenticated"}
    stored = {b.manifest.agent_id for b in await accepted_batches(collector.memory)}
    assert stored == {"prom-7", "prom-a"}


async def test_a_configured_tenant_header_names_the_agent(session: aiohttp.ClientSession) -> None:
    settings = ReceiverSettings(agent_id_header="X-Prometheus-Remote-Write-Tenant")
    async with in_process_collector(receivers=settings) as running:
        body = write_body([([("__name__", "x")], [(1.0, MS0)])])
        status, answer, _ = await post(
            session, running.base_url, body, headers={"X-Prometheus-Remote-Write-Tenant": "prom-t"}
        )
    assert status == 200 and answer["agent_id"] == "prom-t"


# --- bad input: clear 4xx, nothing stored ---------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"}, "remote write 2.0"),
        ({"Content-Encoding": "identity"}, "snappy"),
        ({"Content-Type": "application/json"}, "application/x-protobuf"),
    ],
)  # fmt: skip
async def test_other_media_is_415(
    collector: InProcessCollector,
    session: aiohttp.ClientSession,
    headers: dict[str, str],
    detail: str,
) -> None:
    status, answer, _ = await post(session, collector.base_url, b"x", headers=headers)
    assert status == 415 and answer["error"] == "unsupported_media" and detail in answer["detail"]


async def test_a_snappy_bomb_is_413_before_anything_is_decompressed(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    varint_4gib = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F])  # raw snappy: declared length first
    status, answer, _ = await post(session, collector.base_url, varint_4gib + b"\x00" * 64)
    assert status == 413, answer
    assert answer["error"] == "decompressed_too_large"
    assert answer["limit_bytes"] == LIMITS.max_raw_bytes
    assert "4294967295" in answer["detail"]
    assert await accepted_batches(collector.memory) == []


GOOD_SERIES = ([("__name__", "fine")], [(1.0, MS0)])


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b"\x05not-snappy", "snappy"),
        (bytes(cramjam.snappy.compress_raw(b"\xff\xff\xff")), "prometheus.WriteRequest"),
        # A good series first: one bad series refuses the whole request.
        (write_body([GOOD_SERIES, ([("job", "x")], [(1.0, MS0)])]), "series 1 (?{job='x'}): has no __name__"),
        (write_body([GOOD_SERIES, ([("__name__", "x"), ("k", "v" * 1025)], [(1.0, MS0)])]), "value must be"),
        (write_body([GOOD_SERIES, ([("__name__", "x"), ("a", "1"), ("a", "2")], [(1.0, MS0)])]), "appears twice"),
        (write_body([GOOD_SERIES, ([("__name__", "x")], [(1.0, 2**62)])]), "out of range"),
    ],
    ids=["not-snappy", "not-protobuf", "no-name", "long-label", "duplicate-label", "timestamp"],
)  # fmt: skip
async def test_bad_data_is_400_with_the_problem_and_stores_nothing(
    collector: InProcessCollector, session: aiohttp.ClientSession, body: bytes, detail: str
) -> None:
    status, answer, _ = await post(session, collector.base_url, body)
    assert status == 400, answer
    assert answer["error"] == "invalid_request" and detail in answer["detail"], answer
    assert await accepted_batches(collector.memory) == []


async def test_staleness_markers_are_stored_bit_for_bit_and_native_histograms_counted(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    """A staleness marker is a sample (PROTOCOL §5: it survives, bit for bit, so a PromQL
    engine ends the series where the sender did); native histograms are left out."""
    body = write_body(
        [([("__name__", "up")], [(1.0, MS0), (STALE_NAN, MS0 + 1), (float("nan"), MS0 + 2)])],
        histograms=2,
    )
    status, answer, _ = await post(session, collector.base_url, body)
    assert status == 200 and answer["points"] == 3, answer
    assert answer["dropped"] == {"native_histogram": 2}
    (batch,) = await accepted_batches(collector.memory)
    assert [p["ts"] for p in batch.points] == [MS0 * 10**6, (MS0 + 1) * 10**6, (MS0 + 2) * 10**6]
    bits = [struct.unpack("<Q", struct.pack("<d", p["value"]))[0] for p in batch.points]
    assert bits[1] == 0x7FF0000000000002  # the marker's own NaN, not an ordinary one
    assert bits[2] != 0x7FF0000000000002 and batch.points[0]["value"] == 1.0
    async with aiohttp.ClientSession() as metrics_session:
        async with metrics_session.get(f"{collector.base_url}/metrics") as response:
            text = await response.text()
    labels = 'reason="native_histogram",receiver="remote_write"'
    assert metric_value(text, "lm_collector_receiver_dropped_points_total", labels) == 2.0
    stale = 'reason="stale_marker",receiver="remote_write"'
    assert metric_value(text, "lm_collector_receiver_dropped_points_total", stale) is None
    outcome = 'outcome="accepted",receiver="remote_write"'
    assert metric_value(text, "lm_collector_receiver_requests_total", outcome) == 1.0


async def test_too_many_points_is_413(session: aiohttp.ClientSession) -> None:
    async with in_process_collector(
        receivers=ReceiverSettings(max_points_per_request=3)
    ) as running:
        body = write_body([([("__name__", "x")], [(1.0, MS0 + i) for i in range(4)])])
        status, answer, _ = await post(session, running.base_url, body)
    assert status == 413 and answer["error"] == "too_many_points", answer


# --- retryable answers are 5xx -------------------------------------------------------------


async def test_store_unavailable_is_503_with_retry_after_and_the_retry_is_stored(
    session: aiohttp.ClientSession,
) -> None:
    async with in_process_collector(budget_s=0.5) as running:
        running.store.set_rates({"put_if_none_match": {Fault.UNAVAILABLE: 1.0}})
        body = write_body([([("__name__", "x")], [(1.0, MS0)])])

        status, answer, headers = await post(session, running.base_url, body)

        assert status == 503 and answer == {"error": "store_unavailable"}
        assert int(headers["Retry-After"]) == LIMITS.retry_after_s
        assert await accepted_batches(running.memory) == []
        running.store.set_rates({})
        retried = await post(session, running.base_url, body)
        assert retried[0] == 200 and retried[1]["duplicate"] is False


async def test_overload_is_503_because_remote_write_senders_retry_only_5xx(
    session: aiohttp.ClientSession,
) -> None:
    limits = HttpLimits(
        max_frame_bytes=LIMITS.max_frame_bytes,
        max_raw_bytes=LIMITS.max_raw_bytes,
        max_in_flight_bytes=16,  # less than the body: the cap refuses it
        read_timeout_s=5.0,
        retry_after_s=2,
    )
    async with in_process_collector(limits=limits) as running:
        body = write_body([([("__name__", "x")], [(1.0, MS0)])])
        status, answer, headers = await post(session, running.base_url, body)
    assert status == 503 and answer == {"error": "overloaded"}
    assert headers["Retry-After"] == "2"


# --- collector processes on real stores ----------------------------------------------------


@pytest.mark.parametrize("receiver_store", STORE_KINDS, indirect=True)
async def test_remote_write_to_a_collector_process(
    receiver_store: tuple[str, dict[str, str]], collectors: CollectorLauncher, tmp_path: Any
) -> None:
    url, env = receiver_store
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    process = collectors.start(store_url=url, env={**env, "LM_AUTH__TOKENS_FILE": str(tokens)})
    writer = remote_writer(process.base_url)

    answers = [await send(writer, SERIES) for _ in range(2)]

    assert [(s, a["duplicate"]) for s, a in answers] == [(200, False), (200, True)]
    async with opened(open_test_store(url, env)) as store:
        (batch,) = await accepted_batches(store)
        assert batch.manifest.manifest_key == answers[0][1]["manifest_key"]
        assert len(batch.points) == 4
        assert [info.key async for info in store.list(keys.RAW_BLOBS_PREFIX)] == [
            batch.manifest.raw_blob_key
        ]
    assert process.stop() == 0


class SkewedClock:
    """Stands in for `store.time.StoreClock` of a host an hour off the store's."""

    skewed = True
    skew_s = 3600.0


@pytest.mark.parametrize("spooling", [False, True], ids=["acceptance", "local_spool"])
async def test_a_collector_whose_clock_is_off_answers_503_clock_skewed_and_stores_nothing(
    session: aiohttp.ClientSession, tmp_path: Path, spooling: bool
) -> None:
    spool_dir = tmp_path / "spool" if spooling else None
    async with in_process_collector(store_clock=SkewedClock(), spool_dir=spool_dir) as running:
        body = write_body([([("__name__", "x")], [(1.0, MS0)])])
        status, answer, headers = await post(session, running.base_url, body)
        assert status == 503 and answer == {"error": "clock_skewed"}, answer
        assert int(headers["Retry-After"]) == LIMITS.retry_after_s
        assert await accepted_batches(running.memory) == []
    if spool_dir is not None:
        assert not list((spool_dir / "pending").glob("*.lmbatch"))
