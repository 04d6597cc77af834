"""`store.s3_direct`: small PutObjects and the GetObjects, signed by the client and sent
without its pipeline. The failure mapping of these requests (hangs, drops, 5xx, 409,
403) runs through this path in test_s3_scripted.py
(`test_failure_mapping_of_direct_requests`); here, what is its own: the URL and signing
region are learnt from the client's own first object request, the signature matches the
path on the wire, the SDK's marks are absent, a GET's checksum is checked, a redirect
hands the store's requests back to the SDK, the store time is read."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import zlib
from urllib.parse import quote, unquote_to_bytes

import pytest
from botocore.awsrequest import AWSRequest

from protocol.clock import ManualClock
from store.errors import Unavailable
from store.s3 import S3Store
from store.s3_direct import has_private_parts
from store.s3_requests import SDK_CHECKSUM_MIN_BYTES
from store.time import ClockOffset
from tests.store.s3_helpers import ATTEMPTS, ScriptedS3Server, make_store

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
            assert store._object_base_url == f"{server.endpoint_url}/lm-test-bucket/"
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
            store._object_base_url = None
            store._note_sdk_request(
                AWSRequest("PUT", f"{server.endpoint_url}/lm-test-bucket/p/two")
            )
            store._learn_object_url("one")
            assert store._object_base_url is None
            store._learn_object_url("two")
            assert store._object_base_url == f"{server.endpoint_url}/lm-test-bucket/"


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
            store._watch_sdk_requests(object())  # type: ignore[arg-type]
            for key in ("k1", "k2"):
                await store.put(key, b"1")
    assert [SDK_MARK in headers for _, _, headers in server.requests] == [True, True]


# -- GETs --------------------------------------------------------------------------------

OBJECT = b"an object's bytes, " * 8


def crc32_header(body: bytes) -> str:
    return base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()


async def test_a_stores_first_get_teaches_the_url_and_later_requests_go_direct() -> None:
    async with ScriptedS3Server((200, ""), object_body=OBJECT) as server:
        async with signed_store(server.endpoint_url) as store:
            assert (await store.get("learn"))[0] == OBJECT  # through the client
            body, etag = await store.get(AWKWARD_KEY)
            await store.put("small", b"m", if_none_match=True)
    assert (body, etag) == (OBJECT, '"0123456789abcdef0123456789abcdef"')
    (_, _, learn), (_, get_path, get), (_, _, put) = server.requests
    assert SDK_MARK in learn and SDK_MARK not in get and SDK_MARK not in put
    assert get_path.startswith("/lm-test-bucket/p/a%20b/%C3%A9%2Bx~%2A%27%28%29%21")
    # The client asks S3 for the object's checksum; so does the direct GET.
    assert learn["x-amz-checksum-mode"] == get["x-amz-checksum-mode"] == "ENABLED"
    assert "lightmetrics-ingest" in get["user-agent"]


GET_CALLS = {
    "get": lambda s, key: s.get(key),
    "if_none_match": lambda s, key: s.get_if_none_match(key, '"abc"'),
    "range": lambda s, key: s.get_range(key, 3, 5),
}


@pytest.mark.parametrize("key", ["plain", AWKWARD_KEY, "deep/er/key-1.arrow"])
@pytest.mark.parametrize("call", list(GET_CALLS))
async def test_every_get_arrives_signed_for_the_path_it_was_sent_to(key: str, call: str) -> None:
    async with ScriptedS3Server((200, ""), object_body=OBJECT) as server:
        async with signed_store(server.endpoint_url) as store:
            await GET_CALLS[call](store, key)
            await GET_CALLS[call](store, key)
    assert [SDK_MARK in headers for _, _, headers in server.requests] == [True, False]
    (_, sdk_path, sdk), (method, path, direct) = server.requests
    assert (method, path) == ("GET", sdk_path)  # the same URL as the client's
    for name in ("range", "if-none-match"):
        assert direct.get(name) == sdk.get(name)
    for method, path, headers in server.requests:
        assert signature_is_valid(method, path, headers, b"", SECRET_KEY)
        assert not signature_is_valid(method, path, headers, b"", SECRET_KEY + "x")


@pytest.mark.parametrize("direct", [False, True], ids=["sdk", "direct"])
@pytest.mark.parametrize(
    ("behaviour", "call", "expected"),
    [
        ((304, ""), "if_none_match", None),
        ((200, ""), "if_none_match", (OBJECT, '"0123456789abcdef0123456789abcdef"')),
        ((206, ""), "range", OBJECT),  # the server cut the range: taken as sent
        ((200, ""), "range", OBJECT[3:8]),  # the server ignored the range: cut here
        ((416, "InvalidRange"), "range", b""),
    ],
    ids=str,
)
async def test_conditional_and_ranged_gets_answer_alike_on_both_paths(
    behaviour: tuple[int, str], call: str, expected: object, direct: bool
) -> None:
    async with ScriptedS3Server((200, ""), behaviour, object_body=OBJECT) as server:
        async with signed_store(server.endpoint_url) as store:
            if direct:
                await store.get("learn")
            else:
                await store.delete("learn")  # a request that teaches nothing
            assert await GET_CALLS[call](store, "k") == expected
    assert (SDK_MARK in server.requests[-1][2]) is not direct


@pytest.mark.parametrize("direct", [False, True], ids=["sdk", "direct"])
@pytest.mark.parametrize(
    ("checksums", "accepted"),
    [
        ({"x-amz-checksum-crc32": crc32_header(OBJECT)}, True),
        ({"x-amz-checksum-crc32": crc32_header(OBJECT + b"x")}, False),
        (
            {"x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(b"x").digest()).decode()},
            False,
        ),
        ({"x-amz-checksum-crc32": "AAAAAA==-3"}, True),  # composite (multipart): skipped
        ({}, True),
    ],
    ids=["crc32", "bad-crc32", "bad-sha256", "composite", "none"],
)
async def test_a_get_whose_body_does_not_match_its_checksum_is_read_again(
    checksums: dict[str, str], accepted: bool, direct: bool
) -> None:
    """A damaged body is `Unavailable` (a read: repeated, bounded), on either path."""
    async with ScriptedS3Server((200, ""), object_body=OBJECT) as server:
        async with signed_store(server.endpoint_url) as store:
            await (store.get("learn") if direct else store.delete("learn"))
            server.object_headers = checksums
            if accepted:
                assert (await store.get("k"))[0] == OBJECT
            else:
                with pytest.raises(Unavailable, match="checksum"):
                    await store.get("k")
    sent = server.requests[1:]
    assert len(sent) == (1 if accepted else ATTEMPTS)
    assert all((SDK_MARK in headers) is not direct for _, _, headers in sent)


async def test_a_redirect_answer_to_a_get_hands_this_stores_requests_back_to_the_sdk() -> None:
    behaviours = ((200, ""), (301, "PermanentRedirect"), (200, ""))
    async with ScriptedS3Server(*behaviours, object_body=OBJECT) as server:
        async with signed_store(server.endpoint_url) as store:
            for key in ("k1", "k2", "k3"):
                assert (await store.get(key))[0] == OBJECT
            await store.put("k4", b"1", if_none_match=True)
    sdk = [SDK_MARK in headers for _, _, headers in server.requests]
    assert sdk == [True, False, True, True, True]


async def test_a_ranged_answer_is_not_checked_against_the_whole_objects_checksum() -> None:
    """A 206 carries part of the object: a whole-object checksum sent with it is not the
    part's (S3 sends none with a ranged answer; the client's own path would check one and
    fail)."""
    whole = crc32_header(OBJECT + b"the rest of the object")
    async with ScriptedS3Server((200, ""), (206, ""), object_body=OBJECT) as server:
        async with signed_store(server.endpoint_url) as store:
            await store.get("learn")
            server.object_headers = {"x-amz-checksum-crc32": whole}
            assert await store.get_range("k", 0, len(OBJECT)) == OBJECT
    assert len(server.requests) == 2 and SDK_MARK not in server.requests[1][2]
