"""S3-specific behaviour of `store.s3.S3Store`.

Three kinds of server:
- MiniStack and moto (session fixtures, a fresh bucket per test) for what a real S3
  implementation answers; races only on MiniStack (moto's conditions are not atomic);
- a scripted HTTP server (tests/store/s3_helpers.py) for what local servers never do:
  5xx, 409, throttling, hangs and dropped connections, counting the requests that reach
  it (the failure matrix: test_s3_scripted.py);
- no server at all (a closed port, a stopped MiniStack).
The shared `ObjectStore` contract runs separately in test_contract.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from protocol.clock import ManualClock
from store.base import ObjectStore
from store.errors import (
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    StoreConfigError,
    Unavailable,
)
from store.s3 import MIN_PART_BYTES, S3Credentials, S3Store, parse_s3_url
from tests.s3_servers import RunningServer, fresh_bucket, start_ministack
from tests.store.s3_helpers import OPERATIONS, ScriptedS3Server, keys_of, make_store

SERVERS = ["ministack", "moto"]


@pytest.fixture(params=SERVERS)
def s3_server(request: pytest.FixtureRequest) -> RunningServer:
    server: RunningServer = request.getfixturevalue(f"{request.param}_server")
    return server


@pytest.fixture
async def s3_store(s3_server: RunningServer) -> AsyncIterator[S3Store]:
    """A store under a two-level prefix in a fresh bucket, on MiniStack and on moto."""
    async with make_store(s3_server.endpoint_url, fresh_bucket(s3_server), "lm/test") as store:
        yield store


@pytest.fixture
async def ministack_store(
    ministack_server: RunningServer, ministack_bucket: str
) -> AsyncIterator[S3Store]:
    async with make_store(ministack_server.endpoint_url, ministack_bucket, "lm") as store:
        yield store


def s3_order(keys: list[str]) -> list[str]:
    return sorted(keys, key=lambda k: k.encode("utf-8"))


# -- against MiniStack and moto ---------------------------------------------------------


@pytest.mark.s3
async def test_it_is_an_object_store(s3_store: S3Store) -> None:
    assert isinstance(s3_store, ObjectStore)
    assert s3_store.url.startswith("s3://lm-test-") and s3_store.url.endswith("/lm/test")


@pytest.mark.s3
async def test_conditional_create_twice_is_precondition_failed(s3_store: S3Store) -> None:
    etag = await s3_store.put("accepted/m.json", b"first", if_none_match=True)
    with pytest.raises(PreconditionFailed) as caught:
        await s3_store.put("accepted/m.json", b"second", if_none_match=True)
    assert (caught.value.op, caught.value.key) == ("put", "accepted/m.json")
    assert await s3_store.get("accepted/m.json") == (b"first", etag)


@pytest.mark.s3
async def test_if_match_current_stale_and_missing(s3_store: S3Store) -> None:
    v1 = await s3_store.put("pointer", b"v1", if_none_match=True)
    v2 = await s3_store.put("pointer", b"v2", if_match=v1)
    with pytest.raises(PreconditionFailed):
        await s3_store.put("pointer", b"stale", if_match=v1)
    with pytest.raises(PreconditionFailed):
        await s3_store.put("pointer", b"wrong", if_match='"00000000000000000000000000000000"')
    # S3 answers 404 NoSuchKey here; the contract says PreconditionFailed.
    with pytest.raises(PreconditionFailed):
        await s3_store.put("absent", b"x", if_match=v2)
    assert await s3_store.get("pointer") == (b"v2", v2)
    with pytest.raises(NotFound):
        await s3_store.head("absent")


@pytest.mark.s3
async def test_a_refused_multipart_upload_is_aborted(
    s3_server: RunningServer, tmp_path: Path
) -> None:
    """A `put_file` in parts whose completion is refused (412: If-None-Match on the
    completion) leaves no incomplete upload behind: its parts are not left billed."""
    path = tmp_path / "big"
    path.write_bytes(os.urandom(MIN_PART_BYTES + 1))
    bucket = fresh_bucket(s3_server)
    async with make_store(
        s3_server.endpoint_url, bucket, "lm", upload_part_bytes=MIN_PART_BYTES
    ) as store:
        etag = await store.put_file("catalog/f.parquet", str(path), if_none_match=True)
        assert etag.endswith('-2"')  # a multipart ETag: two parts
        with pytest.raises(PreconditionFailed):
            await store.put_file("catalog/f.parquet", str(path), if_none_match=True)
        client = await store._s3()
        uploads = await client.list_multipart_uploads(Bucket=bucket)
        assert uploads.get("Uploads", []) == []
        assert (await store.head("catalog/f.parquet")).etag == etag


@pytest.mark.s3
async def test_get_head_list_and_put_agree(s3_store: S3Store) -> None:
    etag = await s3_store.put("a/b", b"hello")
    body, got_etag = await s3_store.get("a/b")
    info = await s3_store.head("a/b")
    (listed,) = [i async for i in s3_store.list("a/")]
    assert (body, got_etag) == (b"hello", etag)
    assert info == listed
    assert (info.key, info.size, info.etag) == ("a/b", 5, etag)
    assert info.last_modified_ns % 1_000_000_000 == 0  # whole seconds everywhere
    assert abs(info.last_modified_ns - time.time_ns()) < 60 * 1_000_000_000


@pytest.mark.s3
async def test_missing_objects_and_idempotent_delete(s3_store: S3Store) -> None:
    with pytest.raises(NotFound):
        await s3_store.get("nope")
    with pytest.raises(NotFound):
        await s3_store.head("nope")
    await s3_store.delete("nope")
    await s3_store.put("yes", b"1")
    await s3_store.delete("yes")
    await s3_store.delete("yes")
    assert await keys_of(s3_store) == []


@pytest.mark.s3
async def test_frame_sized_bodies_round_trip(s3_store: S3Store) -> None:
    body = bytes(range(256)) * (8 * 1024 * 1024 // 256)  # max_frame_bytes: 8 MiB
    etag = await s3_store.put("raw-blobs/big.lmbatch", body, if_none_match=True)
    assert await s3_store.get("raw-blobs/big.lmbatch") == (body, etag)
    swapped = await s3_store.put("raw-blobs/big.lmbatch", body[::-1], if_match=etag)
    assert (await s3_store.head("raw-blobs/big.lmbatch")).etag == swapped


@pytest.mark.s3
async def test_awkward_keys_round_trip_in_s3_order(s3_store: S3Store) -> None:
    keys = ["sp ace/+plus", "pct%2Fx", "q?x=1&y", "é/ü", "ctl\x01x", "hash#frag", "tilde~", "😀"]
    for key in keys:
        await s3_store.put(key, key.encode())
    for key in keys:
        assert (await s3_store.get(key))[0] == key.encode()
    assert await keys_of(s3_store) == s3_order(keys)


@pytest.mark.s3
async def test_list_pages_past_a_thousand_keys_in_order(s3_store: S3Store) -> None:
    keys = [f"many/{i % 5}/{i:05d}" for i in range(1100)] + ["many/é", "many/Z", "many/~"]
    limit = asyncio.Semaphore(32)

    async def put(key: str) -> None:
        async with limit:
            await s3_store.put(key, b"")

    await asyncio.gather(*(put(key) for key in keys))
    listed = await keys_of(s3_store, "many/")
    assert listed == s3_order(keys)  # 1103 keys: at least two pages of at most 1000
    assert await keys_of(s3_store, "many/", start_after=listed[999]) == listed[1000:]


@pytest.mark.s3
async def test_a_listing_asks_for_the_next_page_while_the_caller_reads_this_one(
    s3_store: S3Store,
) -> None:
    limit = asyncio.Semaphore(32)

    async def put(key: str) -> None:
        async with limit:
            await s3_store.put(key, b"")

    await asyncio.gather(*(put(f"many/{i:05d}") for i in range(1100)))
    asked: list[str | None] = []
    list_page = s3_store._list_page

    async def recording(prefix: str, full_prefix: str, after: str | None) -> Any:
        asked.append(after)
        return await list_page(prefix, full_prefix, after)

    s3_store._list_page = recording  # type: ignore[method-assign]
    listing = s3_store.list("many/")
    first = await anext(listing)
    await asyncio.sleep(0)  # one turn of the loop: the look-ahead task takes its first step
    assert first.key == "many/00000"
    assert asked[0] is None and asked[1] is not None and asked[1].endswith("many/00999")
    # page 2 was requested before page 1 was read
    await listing.aclose()  # stopping early cancels the page ahead: nothing left running
    assert len(asked) == 2
    assert len([info async for info in s3_store.list("many/")]) == 1100


@pytest.mark.s3
async def test_start_after_is_relative_to_the_prefix(s3_store: S3Store) -> None:
    keys = ["a/1", "a/2", "b/1", "b/2", "c"]
    for key in keys:
        await s3_store.put(key, b"")
    assert await keys_of(s3_store, "", start_after="a/2") == ["b/1", "b/2", "c"]
    assert await keys_of(s3_store, "", start_after="a/9") == ["b/1", "b/2", "c"]
    assert await keys_of(s3_store, "b/", start_after="a") == ["b/1", "b/2"]
    assert await keys_of(s3_store, "b/", start_after="b/1") == ["b/2"]
    assert await keys_of(s3_store, "", start_after="c") == []
    assert await keys_of(s3_store, "", start_after="") == keys


@pytest.mark.s3
async def test_prefixes_isolate_stores_in_one_bucket(s3_server: RunningServer) -> None:
    bucket = fresh_bucket(s3_server)
    url = s3_server.endpoint_url
    async with (
        make_store(url, bucket, "tenant") as tenant,
        make_store(url, bucket, "tenant2") as tenant2,
        make_store(url, bucket) as whole,
    ):
        await tenant.put("k", b"one", if_none_match=True)
        await tenant2.put("k", b"two", if_none_match=True)  # same relative key: no clash
        await tenant2.put("x/y", b"three")
        assert await keys_of(tenant) == ["k"]
        assert await keys_of(tenant2) == ["k", "x/y"]
        assert await keys_of(tenant2, "", start_after="k") == ["x/y"]
        assert (await tenant.get("k"))[0] == b"one"
        with pytest.raises(NotFound):
            await tenant.get("x/y")
        assert await keys_of(whole) == ["tenant/k", "tenant2/k", "tenant2/x/y"]
        assert await keys_of(whole, "", start_after="") == await keys_of(whole)
        assert await keys_of(whole, "tenant", start_after="tenant/k") == [
            "tenant2/k",
            "tenant2/x/y",
        ]
        await tenant.delete("x/y")  # absent under this prefix: nothing happens
        assert await keys_of(tenant2) == ["k", "x/y"]


@pytest.mark.s3
async def test_missing_bucket_is_a_configuration_error(s3_server: RunningServer) -> None:
    async with make_store(s3_server.endpoint_url, "lm-test-no-such-bucket") as store:
        with pytest.raises(StoreConfigError, match="bucket does not exist"):
            await store.get("k")
        with pytest.raises(StoreConfigError):
            await store.put("k", b"x", if_none_match=True)
        with pytest.raises(StoreConfigError):
            await keys_of(store)


@pytest.mark.s3
async def test_explicit_credentials_and_closed_store(s3_server: RunningServer) -> None:
    store = make_store(
        s3_server.endpoint_url,
        fresh_bucket(s3_server),
        credentials=S3Credentials("explicit-key", "explicit-secret"),
    )
    await store.put("k", b"v")
    await store.close()
    await store.close()
    with pytest.raises(RuntimeError, match="closed"):
        await store.get("k")


# -- MiniStack only: races, stop and restart -------------------------------------------


@pytest.mark.s3
async def test_64_concurrent_creators_exactly_one_wins(ministack_store: S3Store) -> None:
    async def create(i: int) -> tuple[bytes, str] | None:
        body = f"writer-{i}".encode()
        try:
            return body, await ministack_store.put("race/m.json", body, if_none_match=True)
        except PreconditionFailed:
            return None

    results = await asyncio.gather(*(create(i) for i in range(64)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert await ministack_store.get("race/m.json") == winners[0]


@pytest.mark.s3
async def test_stopped_server_is_unavailable_fast_and_restart_keeps_objects(
    tmp_path: Path,
) -> None:
    with start_ministack(tmp_path / "ministack") as server:
        bucket = fresh_bucket(server)
        async with make_store(server.endpoint_url, bucket, "lm") as store:
            etag = await store.put("kept/a", b"persisted", if_none_match=True)
            await store.put("kept/b", b"also")

            # Stop from a thread so this loop sees the server's FINs on pooled connections.
            await asyncio.to_thread(server.stop)
            started = time.monotonic()
            with pytest.raises(Unavailable) as refused:
                await store.put("new", b"x", if_none_match=True)
            assert not isinstance(refused.value, OutcomeUnknown)  # refused: never sent
            for op in ("get", "head", "list", "delete", "put"):
                with pytest.raises(Unavailable):
                    await OPERATIONS[op](store)
            assert time.monotonic() - started < 2.0

            await asyncio.to_thread(server.start)
            assert await store.get("kept/a") == (b"persisted", etag)
            assert await keys_of(store) == ["kept/a", "kept/b"]
            with pytest.raises(PreconditionFailed):
                await store.put("kept/a", b"again", if_none_match=True)
            await store.put("after-restart", b"x", if_none_match=True)


async def test_nothing_listening_is_unavailable_without_sdk_retries() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    clock = ManualClock()
    async with make_store(f"http://127.0.0.1:{port}", "lm-test-bucket", clock=clock) as store:
        with pytest.raises(Unavailable) as caught:
            await store.get("k")
    assert not isinstance(caught.value, OutcomeUnknown)
    assert clock.monotonic() > 0  # our backoff ran between attempts


# -- configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://my-bucket", ("my-bucket", "")),
        ("s3://my-bucket/", ("my-bucket", "")),
        ("s3://my.bucket-1/lm/prod/", ("my.bucket-1", "lm/prod")),
        ("S3://abc/x", ("abc", "x")),
        ("s3://" + "a" * 63 + "/p", ("a" * 63, "p")),
    ],
)
def test_parse_s3_url(url: str, expected: tuple[str, str]) -> None:
    assert parse_s3_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "my-bucket/prefix",
        "file:///var/lib/x",
        "s3:/my-bucket",
        "s3://",
        "s3:///prefix",
        "s3://ab",
        "s3://" + "a" * 64,
        "s3://My-Bucket",
        "s3://my_bucket",
        "s3://-bucket",
        "s3://bucket-",
        "s3://my..bucket",
        "s3://my.-bucket",
        "s3://192.168.1.1",
        "s3://xn--bucket",
        "s3://bucket-s3alias",
        "s3://bucket/a//b",
        "s3://bucket/a/../b",
        "s3://bucket/./a",
        "s3://bucket/p?versionId=1",
        "s3://bucket/p#frag",
    ],
)
def test_parse_s3_url_refuses(url: str) -> None:
    with pytest.raises(StoreConfigError):
        parse_s3_url(url)


def test_constructor_validates_and_from_url_parses() -> None:
    with pytest.raises(StoreConfigError):
        S3Store(bucket="Bad_Bucket")
    with pytest.raises(StoreConfigError):
        S3Store(bucket="good-bucket", prefix="a//b")
    with pytest.raises(StoreConfigError):
        S3Store(bucket="good-bucket", credentials=("k", "s"), profile="dev")
    with pytest.raises(StoreConfigError):
        S3Store(bucket="good-bucket", read_timeout_s=0)
    store = S3Store.from_url("s3://good-bucket/lm/prod/", endpoint_url="http://127.0.0.1:1")
    assert (store.bucket, store.prefix, store.url) == (
        "good-bucket",
        "lm/prod",
        "s3://good-bucket/lm/prod",
    )
    assert "s3cr3t-value" not in repr(S3Credentials("key-id", "s3cr3t-value"))


async def test_invalid_keys_are_refused_before_any_request() -> None:
    async with ScriptedS3Server((200, "")) as server:
        async with make_store(server.endpoint_url, "lm-test-bucket") as store:
            for key in ["", "/a", "a//b", "a/../b"]:
                with pytest.raises(ValueError):
                    await store.put(key, b"x", if_none_match=True)
                with pytest.raises(ValueError):
                    await store.get(key)
            with pytest.raises(ValueError):
                await store.put("k", b"x", if_none_match=True, if_match='"e"')
            with pytest.raises(ValueError):
                await keys_of(store, "/abs")
    assert server.requests == []
