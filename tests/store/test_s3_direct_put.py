"""`store.s3_direct_put`: small PutObjects signed by the client and sent without its
pipeline. The failure mapping of every put (hangs, drops, 5xx, 409, 403) runs through
this path in test_s3.py's `test_failure_mapping_and_retries`; here, what is its own: the
URL and signing region are learnt from the client's own first PUT, the signature matches
the path on the wire, the SDK's marks are absent, a redirect hands the store's PUTs back
to the SDK, the store time is read."""

from __future__ import annotations

import hashlib
import hmac
import re
from urllib.parse import quote, unquote_to_bytes

import pytest
from botocore.awsrequest import AWSRequest

from protocol.clock import ManualClock
from store.s3 import S3Store
from store.s3_direct_put import has_private_parts
from store.s3_requests import SDK_CHECKSUM_MIN_BYTES
from store.time import ClockOffset
from tests.store.s3_helpers import ScriptedS3Server, make_store

ACCESS_KEY, SECRET_KEY = "AKIDLIGHTMETRICSTEST", "lightmetrics-test-secret"
REGION = "eu-west-1"
SDK_MARK = "amz-sdk-invocation-id"  # botocore's retry handler adds it to every request
AWKWARD_KEY = "a b/é+x~*'()!$&,;=@:%25[]"
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<access>[^/]+)/(?P<scope>[^,]+), "
    r"SignedHeaders=(?P<signed>[^,]+), Signature=(?P<signature>[0-9a-f]{64})"
)


def signature_is_valid(
    method: str, path: str, headers: dict[str, str], body: bytes, secret: str
) -> bool:
    """SigV4 as S3 checks it (AWS's published algorithm, written out here rather than
    taken from botocore, so that it checks the request as it arrived). S3 builds the
    canonical URI from the key it decoded, encoding every byte but the unreserved ones
    and ``/``; a path on the wire encoded any other way fails here as it would there."""
    match = _AUTHORIZATION.fullmatch(headers["authorization"])
    assert match is not None, headers["authorization"]
    payload_hash = headers["x-amz-content-sha256"]
    if payload_hash != hashlib.sha256(body).hexdigest():
        return False
    raw_uri, _, query = path.partition("?")
    uri = quote(unquote_to_bytes(raw_uri), safe="/")
    signed = match["signed"].split(";")
    canonical_headers = "".join(f"{name}:{' '.join(headers[name].split())}\n" for name in signed)
    canonical = "\n".join([method, uri, query, canonical_headers, match["signed"], payload_hash])
    scope = match["scope"]
    to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            headers["x-amz-date"],
            scope,
            hashlib.sha256(canonical.encode()).hexdigest(),
        ]
    )
    key = f"AWS4{secret}".encode()
    for part in scope.split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, match["signature"])


def signed_store(endpoint_url: str, prefix: str = "p", **options: object) -> S3Store:
    return make_store(
        endpoint_url,
        "lm-test-bucket",
        prefix,
        region=REGION,
        credentials=(ACCESS_KEY, SECRET_KEY),
        **options,
    )


async def test_a_stores_first_small_put_teaches_the_url_and_later_ones_go_direct() -> None:
    async with ScriptedS3Server((200, "")) as server:
        async with signed_store(server.endpoint_url) as store:
            await store.put(AWKWARD_KEY, b"first", if_none_match=True)
            assert await store.put("small", b"m" * 600, if_none_match=True) == (
                '"0123456789abcdef0123456789abcdef"'
            )
            await store.put("large", b"b" * SDK_CHECKSUM_MIN_BYTES, if_none_match=True)
            assert store._put_base_url == f"{server.endpoint_url}/lm-test-bucket/"
    (_, first_path, first), (_, small_path, small), (_, _, large) = server.requests
    assert first_path.startswith("/lm-test-bucket/p/a%20b/")
    assert small_path == "/lm-test-bucket/p/small"
    assert SDK_MARK in first and SDK_MARK not in small and SDK_MARK in large
    # The client's own User-Agent, so S3's access logs still name the project.
    assert "lightmetrics-ingest" in small["user-agent"]
    assert small["if-none-match"] == "*"


async def test_a_large_first_put_teaches_the_url_too() -> None:
    """As in the §3.6 probe: a create of the largest raw object, then small creates."""
    async with ScriptedS3Server((200, "")) as server:
        async with signed_store(server.endpoint_url) as store:
            await store.put("large", b"b" * SDK_CHECKSUM_MIN_BYTES, if_none_match=True)
            await store.put("small", b"s", if_none_match=True)
    assert [SDK_MARK in headers for _, _, headers in server.requests] == [True, False]


async def test_the_url_is_learnt_only_from_the_put_of_the_same_key() -> None:
    """PUTs run concurrently: the last request the client created may be another's."""
    async with ScriptedS3Server((200, "")) as server:
        async with signed_store(server.endpoint_url) as store:
            await store.put("one", b"1")
            store._put_base_url = None
            store._note_sdk_put(AWSRequest("PUT", f"{server.endpoint_url}/lm-test-bucket/p/two"))
            store._learn_put_url("one")
            assert store._put_base_url is None
            store._learn_put_url("two")
            assert store._put_base_url == f"{server.endpoint_url}/lm-test-bucket/"


@pytest.mark.parametrize("key", ["plain", AWKWARD_KEY, "deep/er/key-1.arrow"])
@pytest.mark.parametrize("size", [600, SDK_CHECKSUM_MIN_BYTES], ids=["direct", "sdk"])
async def test_every_put_arrives_signed_for_the_path_it_was_sent_to(key: str, size: int) -> None:
    """Local S3 servers do not check signatures; this server's check does. The SDK's own
    PUTs (the first of each store, and large bodies) are the control for the check."""
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    async with ScriptedS3Server((200, "")) as server:
        async with signed_store(server.endpoint_url) as store:
            await store.put(key, body, if_match='"abc"')
            await store.put(key, body, if_match='"abc"')
    assert [SDK_MARK in headers for _, _, headers in server.requests] == [True, size > 600]
    for (method, path, headers), received in zip(server.requests, server.bodies, strict=True):
        assert received == body
        assert signature_is_valid(method, path, headers, received, SECRET_KEY)
        assert not signature_is_valid(method, path, headers, received, SECRET_KEY + "x")
        assert headers["authorization"].split("/")[2] == REGION


async def test_a_redirect_answer_hands_this_stores_puts_back_to_the_sdk() -> None:
    """A bucket in another region: the answer applied nothing, so the same create is sent
    again through the client (whose redirector can find the region), and so is every
    later PUT of this store."""
    behaviours = ((200, ""), (301, "PermanentRedirect"), (200, ""))
    async with ScriptedS3Server(*behaviours) as server:
        async with signed_store(server.endpoint_url) as store:
            for key in ("k1", "k2", "k3"):
                assert await store.put(key, b"1", if_none_match=True)
    sdk = [SDK_MARK in headers for _, _, headers in server.requests]
    assert sdk == [True, False, True, True]
    paths = [path for _, path, _ in server.requests]
    assert paths == [f"/lm-test-bucket/p/{key}" for key in ("k1", "k2", "k2", "k3")]


async def test_a_direct_put_tells_the_store_time() -> None:
    clock = ManualClock(start_ns=1_764_504_000_000_000_000)  # 2025-11-30 12:00:00 UTC
    date = "Sun, 30 Nov 2025 12:00:30 GMT"  # the store runs 30 s ahead
    async with ScriptedS3Server((200, ""), date=date) as server:
        async with signed_store(server.endpoint_url, clock=clock) as store:
            await store.put("learn", b"1")  # through the client, which reads Date too
            store.clock_offset = ClockOffset()
            await store.put("k", b"1", if_none_match=True)
    assert SDK_MARK not in server.requests[1][2]
    assert store.clock_offset.skew_s is not None
    assert -31.0 <= store.clock_offset.skew_s <= -29.0


async def test_a_client_without_the_private_parts_sends_every_put_itself() -> None:
    async with ScriptedS3Server((200, "")) as server:
        async with signed_store(server.endpoint_url) as store:
            assert has_private_parts(await store._s3())  # fails on an aiobotocore rename
            assert not has_private_parts(object())
            store._watch_sdk_puts(object())  # type: ignore[arg-type]
            for key in ("k1", "k2"):
                await store.put(key, b"1")
    assert [SDK_MARK in headers for _, _, headers in server.requests] == [True, True]
