"""`store.s3.S3Store` against the scripted S3 server (tests/store/s3_helpers.py): what
local servers never do (5xx, 409, throttling, hangs, dropped connections), with the
requests that reach the server counted, through the client's pipeline and through the
direct requests of `store.s3_direct`; signed DELETEs; the headers sent."""

from __future__ import annotations

import base64
import hashlib
import zlib

import pytest

from store.errors import (
    ConditionConflict,
    OutcomeUnknown,
    RequestExpired,
    StoreConfigError,
    Unavailable,
)
from store.s3_requests import SDK_CHECKSUM_MIN_BYTES
from tests.store.s3_helpers import (
    ATTEMPTS,
    OPERATIONS,
    Behaviour,
    ScriptedS3Server,
    make_store,
)

READS = ("get", "head", "list")
SENT_ONCE = ("create", "swap", "signed_delete")  # never repeated, whatever the answer


def expected_outcome(behaviour: Behaviour, op: str) -> tuple[type[Exception], int]:
    """What the store must raise, and how many requests may reach the server."""
    tries = 1 if op in SENT_ONCE else ATTEMPTS
    if behaviour in ("hang", "close", "reset") or behaviour == (500, "InternalError"):
        # The request arrived; its answer was lost or says "maybe". A delete is not
        # repeated then: the first may still land after a repeat "succeeded" (GC race).
        return (Unavailable if op in READS else OutcomeUnknown), 1 if op == "delete" else tries
    if behaviour == (503, "SlowDown"):
        return Unavailable, tries
    if behaviour == (409, "ConditionalRequestConflict"):
        return ConditionConflict, 1
    return StoreConfigError, 1  # 403 AccessDenied: repeating cannot help


FAILURES: list[Behaviour] = [
    "hang",
    "close",
    "reset",
    (500, "InternalError"),
    (503, "SlowDown"),
    (409, "ConditionalRequestConflict"),
    (403, "AccessDenied"),
]
DIRECT = ("create", "swap", "put", "get")  # sent by store.s3_direct once it knows the URL
SDK_MARK = "amz-sdk-invocation-id"  # botocore's retry handler adds it to every request


@pytest.mark.parametrize("op", list(OPERATIONS))
@pytest.mark.parametrize("behaviour", FAILURES, ids=str)
async def test_failure_mapping_and_retries(behaviour: Behaviour, op: str) -> None:
    error, requests = expected_outcome(behaviour, op)
    async with ScriptedS3Server(behaviour) as server:
        store = make_store(server.endpoint_url, "lm-test-bucket", "p", read_timeout_s=0.2)
        try:
            with pytest.raises(error) as caught:
                await OPERATIONS[op](store)
        finally:
            await store.close()
    assert type(caught.value) is error
    # Neither botocore nor aiohttp may resend on their own: a resent conditional create
    # whose first answer was lost would report 412 for our own write.
    assert len(server.requests) == requests
    assert all(path.startswith("/lm-test-bucket") for _, path, _ in server.requests)


@pytest.mark.parametrize("op", DIRECT)
@pytest.mark.parametrize("behaviour", FAILURES, ids=str)
async def test_failure_mapping_of_direct_requests(behaviour: Behaviour, op: str) -> None:
    """The same failures and request counts once the store's first request taught it
    the URL, so that these requests skip botocore's pipeline (store.s3_direct)."""
    error, requests = expected_outcome(behaviour, op)
    async with ScriptedS3Server((200, ""), behaviour) as server:
        store = make_store(server.endpoint_url, "lm-test-bucket", "p", read_timeout_s=0.2)
        try:
            await (store.get("learn") if op == "get" else store.put("learn", b"1"))
            with pytest.raises(error) as caught:
                await OPERATIONS[op](store)
        finally:
            await store.close()
    assert type(caught.value) is error
    sent = server.requests[1:]
    assert len(sent) == requests
    assert not [headers for _, _, headers in sent if SDK_MARK in headers]


@pytest.mark.parametrize(
    ("behaviour", "outcome"),
    [
        ((204, ""), None),
        ((404, "NoSuchKey"), None),  # gone already: what `delete` promises too
        ((403, "AccessDenied", "Request has expired"), RequestExpired),
        ((403, "AccessDenied", "Access Denied"), StoreConfigError),
    ],
    ids=str,
)
async def test_a_signed_delete_is_sent_once_to_its_presigned_url(
    behaviour: Behaviour, outcome: type[Exception] | None
) -> None:
    async with ScriptedS3Server(behaviour) as server:
        async with make_store(server.endpoint_url, "lm-test-bucket", "p") as store:
            signed = await store.sign_delete("a b/é", expires_in_s=7)
            assert server.requests == []  # signing sends nothing
            if outcome is None:
                await store.send_signed_delete(signed)
            else:
                with pytest.raises(outcome):
                    await store.send_signed_delete(signed)
    [(method, path, _headers)] = server.requests
    assert method == "DELETE"
    assert path.startswith("/lm-test-bucket/p/a%20b/%C3%A9?")
    assert "X-Amz-Expires=7" in path and "X-Amz-Signature=" in path
    assert signed.signed_at_unix_ns % 1_000_000_000 == 0  # X-Amz-Date: whole seconds


async def test_conditional_headers_are_sent() -> None:
    async with ScriptedS3Server((200, "")) as server:
        async with make_store(server.endpoint_url, "lm-test-bucket", "p") as store:
            assert await store.put("a", b"1", if_none_match=True) == (
                '"0123456789abcdef0123456789abcdef"'
            )
            await store.put("b", b"2", if_match='"abc"')
            await store.put("c", b"3")
    (_, create_path, create), (_, _, swap), (_, _, plain) = server.requests
    assert create_path == "/lm-test-bucket/p/a"
    assert create.get("if-none-match") == "*" and "if-match" not in create
    assert swap.get("if-match") == '"abc"' and "if-none-match" not in swap
    assert "if-match" not in plain and "if-none-match" not in plain


async def test_only_large_bodies_carry_an_sdk_checksum_and_small_ones_are_signed() -> None:
    """store.s3_requests "Checksums": a body under SDK_CHECKSUM_MIN_BYTES goes without
    botocore's CRC32 (its SHA-256 is signed instead), a larger one keeps the CRC32."""
    small, large = b"m" * 1000, b"b" * SDK_CHECKSUM_MIN_BYTES
    async with ScriptedS3Server((200, "")) as server:
        async with make_store(server.endpoint_url, "lm-test-bucket") as store:
            await store.put("small", small, if_none_match=True)
            await store.put("large", large, if_none_match=True)
    (_, _, small_headers), (_, _, large_headers) = server.requests
    assert not [name for name in small_headers if name.startswith("x-amz-checksum")]
    assert small_headers["x-amz-content-sha256"] == hashlib.sha256(small).hexdigest()
    assert (
        large_headers["x-amz-checksum-crc32"]
        == base64.b64encode(zlib.crc32(large).to_bytes(4, "big")).decode()
    )


async def test_repeatable_operations_recover_after_transient_failures() -> None:
    async with ScriptedS3Server((503, "SlowDown"), "close", (200, "")) as server:
        async with make_store(server.endpoint_url, "lm-test-bucket") as store:
            assert await store.put("k", b"same body")  # repeated: same body, same object
    assert [method for method, _, _ in server.requests] == ["PUT"] * 3


async def test_a_409_on_a_conditional_create_is_surfaced_not_retried() -> None:
    async with ScriptedS3Server((409, "ConditionalRequestConflict"), (200, "")) as server:
        async with make_store(server.endpoint_url, "lm-test-bucket") as store:
            with pytest.raises(ConditionConflict):
                await store.put("k", b"x", if_none_match=True)
            assert await store.put("k", b"x", if_none_match=True)  # the caller's retry
    assert len(server.requests) == 2
