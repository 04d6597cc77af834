"""PROTOCOL §2 through real HTTP against a running ``lm-collector serve`` (filesystem store).

One collector process serves the whole module (with a tokens file and a 64 KiB frame
limit); tests use agent_ids of their own so they do not see each other's batches, and
every test that gets a new batch accepted waits for its index log row, so that a later
"the store did not change" check is not disturbed by a background write.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import random
import struct
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from protocol import keys, records
from store.fs import FileSystemStore
from tests.collector.conftest import (
    BOOT,
    FRAME_TYPE,
    Answer,
    CollectorLauncher,
    CollectorProcess,
    Tokens,
    get,
    make_frame,
    manifest_key_of,
    metric_value,
    post_frame,
    store_keys,
    wait_for_log_rows,
    wait_for_log_rows_named,
    write_tokens_file,
)

LIMIT = 64 * 1024
COLLECTOR_ID = "api-collector"


@pytest.fixture(scope="module")
def api_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("http-api")


@pytest.fixture(scope="module")
def api_tokens(api_dir: Path) -> Tokens:
    return write_tokens_file(api_dir / "tokens.toml")


@pytest.fixture(scope="module")
def api_collector(api_dir: Path, api_tokens: Tokens) -> Iterator[CollectorProcess]:
    launcher = CollectorLauncher(api_dir / "collectors")
    try:
        yield launcher.start(
            store_url=f"file://{api_dir / 'store'}",
            name=COLLECTOR_ID,
            tokens=api_tokens,
            env={"LM_INGEST__MAX_FRAME_BYTES": str(LIMIT)},
        )
    finally:
        launcher.stop_all()


@pytest.fixture
async def store(api_dir: Path, api_collector: CollectorProcess) -> AsyncIterator[FileSystemStore]:
    opened = FileSystemStore(api_dir / "store")
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened:
        yield opened


def with_crc(body_without_crc: bytes) -> bytes:
    return body_without_crc + struct.pack(">I", zlib.crc32(body_without_crc))


def patched(frame: bytes, offset: int, new: bytes) -> bytes:
    """``frame`` with bytes at ``offset`` replaced and a correct CRC: only the field is wrong."""
    body = frame[:-4]
    return with_crc(body[:offset] + new + body[offset + len(new) :])


def assert_error(answer: Answer, status: int, error: str) -> None:
    assert answer.status == status, answer
    assert answer.json["error"] == error, answer
    assert answer.request_id, f"no X-Request-Id on {answer}"


# --- 200 ----------------------------------------------------------------------------------


async def test_new_batch_is_accepted_with_every_field(
    api_collector: CollectorProcess,
    api_tokens: Tokens,
    session: aiohttp.ClientSession,
    store: FileSystemStore,
) -> None:
    frame = make_frame("agent-new", seq_start=10)
    sha = hashlib.sha256(frame).hexdigest()

    answer = await post_frame(session, api_collector.base_url, frame, token=api_tokens.writer)

    assert answer.status == 200, answer
    assert answer.request_id
    assert answer.json == {
        "accepted": True,
        "duplicate": False,
        "agent_id": "agent-new",
        "boot_id": str(BOOT),  # canonical lowercase hyphenated
        "seq_start": 10,
        "seq_end": 12,
        "frame_sha256": sha,
        "manifest_key": manifest_key_of("agent-new", 10),
        "collector_id": COLLECTOR_ID,
    }
    body, _ = await store.get(answer.json["manifest_key"])
    manifest = records.AcceptedManifest.from_json(body)
    assert (manifest.frame_sha256, manifest.frame_bytes, manifest.record_count) == (
        sha,
        len(frame),
        3,
    )
    assert (await store.get(keys.raw_blob_key(sha)))[0] == frame
    await wait_for_log_rows(store, answer.json)


async def test_resend_is_a_duplicate_and_writes_nothing(
    api_collector: CollectorProcess,
    api_tokens: Tokens,
    session: aiohttp.ClientSession,
    store: FileSystemStore,
) -> None:
    frame = make_frame("agent-dup", seq_start=0)
    first = await post_frame(session, api_collector.base_url, frame, token=api_tokens.writer)
    assert first.status == 200 and first.json["duplicate"] is False, first
    await wait_for_log_rows(store, first.json)
    before = await store_keys(store)

    again = await post_frame(session, api_collector.base_url, frame, token=api_tokens.writer)

    assert again.status == 200, again
    assert again.json == {**first.json, "duplicate": True}
    assert again.request_id and again.request_id != first.request_id
    # Nothing written for the batch; only the index log gains its row (PROTOCOL §3.2: every
    # 200 appends one, so a batch whose first answer was lost is still indexed).
    after = await wait_for_log_rows(store, first.json)
    assert [k for k in await store_keys(store) if not k.startswith(keys.INDEX_LOG_PREFIX)] == [
        k for k in before if not k.startswith(keys.INDEX_LOG_PREFIX)
    ]
    assert first.json["manifest_key"] in after


# --- 409 and GET /v1/conflicts ------------------------------------------------------------


async def test_identity_conflict_is_409_quarantined_and_listed(
    api_collector: CollectorProcess,
    api_tokens: Tokens,
    session: aiohttp.ClientSession,
    store: FileSystemStore,
) -> None:
    url = api_collector.base_url
    accepted_frame = make_frame("agent-conflict", seq_start=5, value=1.0)
    submitted_frame = make_frame("agent-conflict", seq_start=5, value=2.0)
    accepted_sha = hashlib.sha256(accepted_frame).hexdigest()
    submitted_sha = hashlib.sha256(submitted_frame).hexdigest()
    identity = keys.BatchIdentity("agent-conflict", BOOT, 5, 7)
    first = await post_frame(session, url, accepted_frame, token=api_tokens.writer)
    assert first.status == 200, first
    await wait_for_log_rows(store, first.json)
    started_ns = time.time_ns()

    answer = await post_frame(session, url, submitted_frame, token=api_tokens.writer)

    assert_error(answer, 409, "identity_conflict")
    assert answer.json == {
        "error": "identity_conflict",
        "accepted_frame_sha256": accepted_sha,
        "submitted_frame_sha256": submitted_sha,
        "accepted_manifest_key": keys.accepted_manifest_key(identity),
        "quarantine_key": keys.quarantine_key(identity, submitted_sha),
    }
    # The accepted manifest is untouched; the quarantine record and its index exist.
    manifest = records.AcceptedManifest.from_json(
        (await store.get(keys.accepted_manifest_key(identity)))[0]
    )
    assert manifest.frame_sha256 == accepted_sha
    conflict = records.IdentityConflict.from_json(
        (await store.get(keys.quarantine_key(identity, submitted_sha)))[0]
    )
    assert conflict.submitted_frame_sha256 == submitted_sha
    assert keys.quarantine_key(identity, submitted_sha) in await wait_for_log_rows_named(
        store, keys.quarantine_key(identity, submitted_sha)
    )

    # Another agent's conflict, to see the agent_id filter work.
    other_first = make_frame("agent-conflict-b", seq_start=1, value=1.0)
    other_second = make_frame("agent-conflict-b", seq_start=1, value=3.0)
    other_answer = await post_frame(session, url, other_first, token=api_tokens.writer)
    await wait_for_log_rows(store, other_answer.json)
    conflict_b = await post_frame(session, url, other_second, token=api_tokens.writer)
    assert conflict_b.status == 409, conflict_b

    listed = await get(
        session,
        f"{url}/v1/conflicts",
        token=api_tokens.admin,
        params={"agent_id": "agent-conflict"},
    )
    assert listed.status == 200, listed
    assert listed.request_id
    assert listed.json["truncated"] is False
    assert len(listed.json["conflicts"]) == 1
    record = listed.json["conflicts"][0]
    assert record["agent_id"] == "agent-conflict"
    assert record["boot_id"] == str(BOOT)
    assert (record["seq_start"], record["seq_end"]) == (5, 7)
    assert record["accepted_frame_sha256"] == accepted_sha
    assert record["submitted_frame_sha256"] == submitted_sha
    assert record["accepted_raw_blob_key"] == keys.raw_blob_key(accepted_sha)
    assert record["submitted_raw_blob_key"] == keys.raw_blob_key(submitted_sha)
    assert record["accepted_manifest_key"] == keys.accepted_manifest_key(identity)
    assert record["quarantine_key"] == keys.quarantine_key(identity, submitted_sha)
    assert record["collector_id"] == COLLECTOR_ID
    observed = record["observed_at_unix_ns"]
    assert started_ns <= observed <= time.time_ns()

    everything = await get(session, f"{url}/v1/conflicts", token=api_tokens.admin)
    listed_agents = {c["agent_id"] for c in everything.json["conflicts"]}
    assert {"agent-conflict", "agent-conflict-b"} <= listed_agents

    async def agents_since(since: str) -> set[str]:
        found = await get(
            session, f"{url}/v1/conflicts", token=api_tokens.admin, params={"since": since}
        )
        assert found.status == 200, found
        return {c["agent_id"] for c in found.json["conflicts"]}

    assert "agent-conflict" in await agents_since(str(observed))
    assert "agent-conflict" not in await agents_since(str(observed + 1))
    assert "agent-conflict" in await agents_since("2020-01-01T00:00:00Z")
    assert await agents_since("2999-01-01T00:00:00Z") == set()

    bad_since = await get(
        session, f"{url}/v1/conflicts", token=api_tokens.admin, params={"since": "yesterday"}
    )
    assert_error(bad_since, 400, "invalid_query")
    not_admin = await get(session, f"{url}/v1/conflicts", token=api_tokens.writer)
    assert_error(not_admin, 403, "forbidden")
    no_token = await get(session, f"{url}/v1/conflicts")
    assert_error(no_token, 401, "unauthenticated")
    unknown = await get(session, f"{url}/v1/conflicts", token="not-a-known-token")
    assert_error(unknown, 401, "unauthenticated")


async def test_a_128_byte_agent_id_is_accepted_and_its_conflict_listed(
    api_collector: CollectorProcess,
    api_tokens: Tokens,
    session: aiohttp.ClientSession,
) -> None:
    """PROTOCOL §1 allows 128-byte agent_ids; on the fs store they were a 500 forever
    (a 256-hex-digit key segment). Keys now hold ``agent=h-<sha256>`` (PROTOCOL §3), and
    the agent_id filter of /v1/conflicts finds records under that form."""
    url = api_collector.base_url
    agent = "agent-".ljust(128, "l")
    identity = keys.BatchIdentity(agent, BOOT, 3, 5)
    first_frame = make_frame(agent, seq_start=3, value=1.0)
    second_frame = make_frame(agent, seq_start=3, value=2.0)
    first = await post_frame(session, url, first_frame, token=api_tokens.writer)
    assert first.status == 200 and first.json["duplicate"] is False, first
    assert first.json["manifest_key"] == keys.accepted_manifest_key(identity)
    assert f"agent=h-{identity.agent_sha256}/" in first.json["manifest_key"]
    again = await post_frame(session, url, first_frame, token=api_tokens.writer)
    assert again.status == 200 and again.json["duplicate"] is True, again
    conflict = await post_frame(session, url, second_frame, token=api_tokens.writer)
    assert_error(conflict, 409, "identity_conflict")

    listed = await get(
        session, f"{url}/v1/conflicts", token=api_tokens.admin, params={"agent_id": agent}
    )
    assert listed.status == 200, listed
    assert [c["quarantine_key"] for c in listed.json["conflicts"]] == [
        conflict.json["quarantine_key"]
    ]


# --- 400 ----------------------------------------------------------------------------------

VALID = make_frame("agent-bad", seq_start=100)
INVALID_FRAMES = {
    "empty": (b"", "truncated"),
    "bad_magic": (b"XXXX" + VALID[4:], "magic"),
    "flipped_payload_bit": (
        VALID[:70] + bytes([VALID[70] ^ 0x10]) + VALID[71:],
        "crc32 mismatch",
    ),
    "truncated": (VALID[:-1], "frame length"),
    "trailing_byte": (VALID + b"\x00", "frame length"),
    "unknown_flag": (patched(VALID, 5, b"\x03"), "flags"),
    "zero_boot_id": (patched(VALID, 8, bytes(16)), "boot_id is all-zero"),
    "seq_end_before_start": (patched(VALID, 24, struct.pack(">Q", 10**6)), "seq_end"),
    "control_char_in_agent_id": (patched(VALID, 52, b"\x01"), "control character"),
    "garbage_payload": (patched(VALID, 61, bytes(len(VALID) - 65)), "payload"),
    "random_bytes": (random.Random(7).randbytes(300), "magic"),
    "not_a_frame": (b"hello, collector", "truncated"),
}


@pytest.mark.parametrize("case", sorted(INVALID_FRAMES))
async def test_invalid_frame_is_400_naming_the_problem_and_changes_nothing(
    case: str,
    api_collector: CollectorProcess,
    api_tokens: Tokens,
    session: aiohttp.ClientSession,
    store: FileSystemStore,
) -> None:
    body, problem = INVALID_FRAMES[case]
    before = await store_keys(store)

    answer = await post_frame(session, api_collector.base_url, body, token=api_tokens.writer)

    assert_error(answer, 400, "invalid_frame")
    assert problem in answer.json["detail"], answer.json
    assert await store_keys(store) == before


# --- 401 / 403 ----------------------------------------------------------------------------

BAD_AUTHORIZATION = {
    "none": None,
    "unknown_token": "Bearer lm-no-such-token",
    "basic_scheme": "Basic bG0tdGVzdC13cml0ZXItdG9rZW4=",
    "bearer_without_token": "Bearer",
    "bearer_blank_token": "Bearer    ",
    "token_without_scheme": "lm-test-writer-token",
    "other_scheme_same_token": "Token lm-test-writer-token",
    "token_with_suffix": "Bearer lm-test-writer-token-x",
}


@pytest.mark.parametrize("case", sorted(BAD_AUTHORIZATION))
async def test_missing_unknown_or_malformed_token_is_401_and_changes_nothing(
    case: str,
    api_collector: CollectorProcess,
    session: aiohttp.ClientSession,
    store: FileSystemStore,
) -> None:
    authorization = BAD_AUTHORIZATION[case]
    headers = {} if authorization is None else {"Authorization": authorization}
    before = await store_keys(store)

    answer = await post_frame(
        session, api_collector.base_url, make_frame("agent-401"), headers=headers
    )

    assert_error(answer, 401, "unauthenticated")
    assert await store_keys(store) == before


async def test_authentication_comes_before_every_other_check(
    api_collector: CollectorProcess, store: FileSystemStore
) -> None:
    before = await store_keys(store)
    url = api_collector.base_url
    for body, content_type, headers in (
        (b"junk", FRAME_TYPE, {}),
        (make_frame("agent-401"), "text/plain", {}),
        (gzip.compress(make_frame("agent-401")), FRAME_TYPE, {"Content-Encoding": "gzip"}),
        (bytes(LIMIT + 1), FRAME_TYPE, {}),
    ):
        async with aiohttp.ClientSession() as session:  # a fresh connection per case
            answer = await post_frame(
                session, url, body, content_type=content_type, headers=headers
            )
        assert_error(answer, 401, "unauthenticated")
    assert await store_keys(store) == before


async def test_principal_not_allowed_for_agent_id_is_403_and_changes_nothing(
    api_collector: CollectorProcess,
    api_tokens: Tokens,
    session: aiohttp.ClientSession,
    store: FileSystemStore,
) -> None:
    url = api_collector.base_url
    frame = make_frame("agent-403")  # "other" may write other-*; "ops" writes nothing
    before = await store_keys(store)

    denied = await post_frame(session, url, frame, token=api_tokens.other)
    admin = await post_frame(session, url, frame, token=api_tokens.admin)
    # Decoding comes before authorization: an invalid frame is 400 even for "other".
    invalid = await post_frame(session, url, frame[:-1], token=api_tokens.other)

    assert_error(denied, 403, "forbidden")
    assert "other" in denied.json["detail"] and "agent-403" in denied.json["detail"]
    assert_error(admin, 403, "forbidden")
    assert_error(invalid, 400, "invalid_frame")
    assert await store_keys(store) == before
    # The same principal may write its own agents.
    own = await post_frame(session, url, make_frame("other-1"), token=api_tokens.other)
    assert own.status == 200, own
    await wait_for_log_rows(store, own.json)


# --- 413 ----------------------------------------------------------------------------------


async def test_declared_content_length_over_the_limit_is_413(
    api_collector: CollectorProcess,
    api_tokens: Tokens,
    session: aiohttp.ClientSession,
    store: FileSystemStore,
) -> None:
    before = await store_keys(store)
    body = make_frame("agent-413") + bytes(LIMIT)  # > LIMIT bytes, sent with Content-Length

    answer = await post_frame(session, api_collector.base_url, body, token=api_tokens.writer)

    assert_error(answer, 413, "frame_too_large")
    assert answer.json["limit_bytes"] == LIMIT
    assert await store_keys(store) == before


async def test_chunked_body_growing_past_the_limit_is_413_before_it_ends(
    api_collector: CollectorProcess,
    api_tokens: Tokens,
    session: aiohttp.ClientSession,
    store: FileSystemStore,
) -> None:
    before = await store_keys(store)
    answered = asyncio.Event()
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        # No Content-Length: aiohttp sends an async iterator chunked. After LIMIT + 4 KiB
        # the body stalls until the answer arrived, so a server that waited for the end
        # of the body would never answer (and the test would time out, not pass).
        nonlocal sent
        prefix = make_frame("agent-413")
        yield prefix
        sent = len(prefix)
        while sent <= LIMIT + 4096:
            yield bytes(4096)
            sent += 4096
        await asyncio.wait_for(answered.wait(), timeout=60)

    answer = await asyncio.wait_for(
        post_frame(session, api_collector.base_url, body(), token=api_tokens.writer), timeout=60
    )
    answered.set()

    assert_error(answer, 413, "frame_too_large")
    assert answer.json["limit_bytes"] == LIMIT
    assert await store_keys(store) == before


# --- 415 ----------------------------------------------------------------------------------

UNSUPPORTED_MEDIA = {
    "gzip_encoding": (FRAME_TYPE, {"Content-Encoding": "gzip"}, True),
    "deflate_encoding": (FRAME_TYPE, {"Content-Encoding": "deflate"}, False),
    "br_encoding": (FRAME_TYPE, {"Content-Encoding": "br"}, False),
    "zstd_encoding": (FRAME_TYPE, {"Content-Encoding": "zstd"}, False),
    "identity_then_gzip": (FRAME_TYPE, {"Content-Encoding": "identity, gzip"}, True),
    "text_plain": ("text/plain", {}, False),
    "json": ("application/json", {}, False),
    "form": ("application/x-www-form-urlencoded", {}, False),
    "almost_lmbatch": ("application/x-lmbatch2", {}, False),
}
MEDIA_CASES = [
    pytest.param(
        name,
        id=name,
    )
    for name in sorted(UNSUPPORTED_MEDIA)
]


@pytest.mark.parametrize("case", MEDIA_CASES)
async def test_content_encoding_or_wrong_content_type_is_415_and_changes_nothing(
    case: str,
    api_collector: CollectorProcess,
    api_tokens: Tokens,
    store: FileSystemStore,
) -> None:
    content_type, headers, gzipped = UNSUPPORTED_MEDIA[case]
    frame = make_frame("agent-415")
    body = gzip.compress(frame) if gzipped else frame
    before = await store_keys(store)

    async with aiohttp.ClientSession() as session:  # a fresh connection for each case
        answer = await post_frame(
            session,
            api_collector.base_url,
            body,
            token=api_tokens.writer,
            content_type=content_type,
            headers=headers,
        )

    assert_error(answer, 415, "unsupported_media")
    assert await store_keys(store) == before


async def test_identity_encoding_and_octet_stream_are_accepted(
    api_collector: CollectorProcess,
    api_tokens: Tokens,
    session: aiohttp.ClientSession,
    store: FileSystemStore,
) -> None:
    for seq, content_type, headers in (
        (0, "application/octet-stream", {}),
        (3, FRAME_TYPE, {"Content-Encoding": "identity"}),
    ):
        answer = await post_frame(
            session,
            api_collector.base_url,
            make_frame("agent-media", seq_start=seq),
            token=api_tokens.writer,
            content_type=content_type,
            headers=headers,
        )
        assert answer.status == 200, answer
        await wait_for_log_rows(store, answer.json)


async def test_415_for_bad_gzip_body_keeps_the_connection_usable(
    api_collector: CollectorProcess, api_tokens: Tokens
) -> None:
    # One connection, two requests in turn, as a keep-alive agent sends them.
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        refused = await post_frame(
            session,
            api_collector.base_url,
            make_frame("agent-415b"),  # labelled gzip, but not gzip
            token=api_tokens.writer,
            headers={"Content-Encoding": "gzip"},
        )
        assert_error(refused, 415, "unsupported_media")
        next_answer = await post_frame(
            session, api_collector.base_url, make_frame("agent-415b"), token=api_tokens.writer
        )
    assert next_answer.status == 200, next_answer
    assert not [e for e in api_collector.events() if e.get("event") == "Unhandled exception"]


# --- X-Request-Id, 404/405, health, readiness, metrics ------------------------------------


async def test_every_response_carries_x_request_id(
    api_collector: CollectorProcess, api_tokens: Tokens, session: aiohttp.ClientSession
) -> None:
    url = api_collector.base_url
    offered = "client-req-0001"
    echoed = await post_frame(
        session,
        url,
        make_frame("agent-rid"),
        token=api_tokens.writer,
        headers={"X-Request-Id": offered},
    )
    assert echoed.status == 200 and echoed.request_id == offered
    for bad_id in ("has spaces", "x" * 129, "semi;colon", ""):
        replaced = await post_frame(
            session, url, b"junk", token=api_tokens.writer, headers={"X-Request-Id": bad_id}
        )
        assert replaced.status == 400
        assert replaced.request_id and replaced.request_id != bad_id

    answers = {
        "400": await post_frame(session, url, b"junk", token=api_tokens.writer),
        "401": await post_frame(session, url, make_frame("agent-rid")),
        "403": await post_frame(session, url, make_frame("agent-rid"), token=api_tokens.other),
        "413": await post_frame(session, url, bytes(LIMIT + 1), token=api_tokens.writer),
        "415": await post_frame(
            session, url, make_frame("agent-rid"), token=api_tokens.writer, content_type="a/b"
        ),
        "404": await get(session, f"{url}/no/such/path"),
        "405": await get(session, f"{url}/v1/batches"),
        "healthz": await get(session, f"{url}/healthz"),
        "readyz": await get(session, f"{url}/readyz"),
        "metrics": await get(session, f"{url}/metrics"),
        "conflicts": await get(session, f"{url}/v1/conflicts", token=api_tokens.admin),
    }
    request_ids = {name: answer.request_id for name, answer in answers.items()}
    assert all(request_ids.values()), request_ids
    assert len(set(request_ids.values())) == len(request_ids)
    assert answers["404"].status == 404 and answers["404"].json == {"error": "not_found"}
    assert answers["405"].status == 405 and "error" in answers["405"].json


async def test_healthz_readyz_and_metrics(
    api_collector: CollectorProcess,
    api_tokens: Tokens,
    session: aiohttp.ClientSession,
    store: FileSystemStore,
) -> None:
    url = api_collector.base_url
    health = await get(session, f"{url}/healthz")
    assert health.status == 200 and health.json["status"] == "alive"
    ready = await get(session, f"{url}/readyz")
    assert ready.status == 200, ready
    assert ready.json["ready"] is True and ready.json["probe_passed"] is True

    before = (await get(session, f"{url}/metrics")).text
    accepted = await post_frame(
        session, url, make_frame("agent-metrics", seq_start=7), token=api_tokens.writer
    )
    assert accepted.status == 200
    await post_frame(session, url, b"junk", token=api_tokens.writer)
    await wait_for_log_rows(store, accepted.json)
    metrics = await get(session, f"{url}/metrics")

    assert metrics.status == 200
    assert metrics.headers["Content-Type"].startswith("text/plain")
    for name in (
        "lm_collector_requests_total",
        "lm_collector_ack_latency_seconds_bucket",
        "lm_collector_store_operations_total",
        "lm_collector_in_flight_requests",
        "lm_collector_accepted_bytes_total",
        "lm_collector_index_log_buffered_rows",
    ):
        assert f"\n{name}" in metrics.text, name

    def delta(name: str, labels: str) -> float:
        old = metric_value(before, name, labels) or 0.0
        return (metric_value(metrics.text, name, labels) or 0.0) - old

    assert delta("lm_collector_requests_total", 'outcome="accepted"') == 1
    assert delta("lm_collector_requests_total", 'outcome="invalid_frame"') == 1
    accepted_bytes = len(make_frame("agent-metrics", seq_start=7))
    assert delta("lm_collector_accepted_bytes_total", "") == accepted_bytes
    assert delta("lm_collector_store_operations_total", 'op="put_manifest",result="ok"') == 1


# --- 429 ----------------------------------------------------------------------------------


async def test_in_flight_cap_answers_429_with_retry_after(
    collectors: CollectorLauncher, tmp_path: Path
) -> None:
    collector = collectors.start(
        store_url=f"file://{tmp_path / 'store'}",
        env={"LM_HTTP__MAX_IN_FLIGHT_REQUESTS": "1"},
    )
    store = FileSystemStore(tmp_path / "store")
    slow_frame = make_frame("agent-slow")
    release = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield slow_frame[:20]
        await asyncio.wait_for(release.wait(), timeout=60)
        yield slow_frame[20:]

    async with aiohttp.ClientSession() as slow_session, aiohttp.ClientSession() as session:
        slow = asyncio.create_task(post_frame(slow_session, collector.base_url, slow_body()))
        try:
            deadline = time.monotonic() + 20
            while True:  # until the slow upload holds the only slot
                text = (await get(session, f"{collector.base_url}/metrics")).text
                if metric_value(text, "lm_collector_in_flight_requests") == 1.0:
                    break
                assert time.monotonic() < deadline, "the slow upload never got in flight"
                await asyncio.sleep(0.02)
            keys_before = await store_keys(store)

            refused = await post_frame(session, collector.base_url, make_frame("agent-fast"))

            assert_error(refused, 429, "overloaded")
            assert refused.json == {"error": "overloaded"}
            assert int(refused.headers["Retry-After"]) >= 1
            assert await store_keys(store) == keys_before
        finally:
            release.set()
            slow_answer = await slow
        assert slow_answer.status == 200, slow_answer
        retried = await post_frame(session, collector.base_url, make_frame("agent-fast"))
        assert retried.status == 200, retried
    await store.close()
