"""The `ObjectStore` contract (store/base.py), run on every backend in conftest.py."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from store.base import ConditionalGet, ObjectInfo, ObjectStore, get_if_changed, list_range
from store.errors import NotFound, PreconditionFailed, RequestExpired
from store.s3 import MIN_PART_BYTES


async def _list(store: ObjectStore, prefix: str, start_after: str | None = None) -> list[str]:
    return [info.key async for info in store.list(prefix, start_after)]


def _s3_order(keys: list[str]) -> list[str]:
    return sorted(keys, key=lambda k: k.encode("utf-8"))


# Keys chosen to catch directory-walk and UTF-16 orderings: '-' (0x2d) < '.' < '/' (0x2f)
# < '0' < 'A' < 'a' < '~' < 'é' (c3 a9) < 'ﬀ' (U+FB00, ef ac 80) < '😀' (f0 9f 98 80),
# while UTF-16 puts the emoji's surrogate before U+FB00. No key is a "directory" of
# another, which the filesystem store cannot hold.
ORDER_KEYS = [
    "t/a-c",
    "t/a.c",
    "t/a/b",
    "t/a/b-c/d",
    "t/a/b.c",
    "t/a/b0",
    "t/a0",
    "t/a~",
    "t/A",
    "t/b",
    "t/e",
    "t/é",
    "t/éa/x",
    "t/ﬀ",
    "t/😀",
    "t/z/y/x",
    "u",
]


async def test_put_get_head_round_trip(store: ObjectStore) -> None:
    body = bytes(range(256)) * 3
    etag = await store.put("a/b/c.bin", body)
    assert await store.get("a/b/c.bin") == (body, etag)
    info = await store.head("a/b/c.bin")
    assert (info.key, info.size, info.etag) == ("a/b/c.bin", len(body), etag)


async def test_get_range_reads_the_bytes_of_a_range(store: ObjectStore) -> None:
    body = bytes(range(256)) * 3
    await store.put("r/blob", body)
    assert await store.get_range("r/blob", 0, 1) == body[:1]
    assert await store.get_range("r/blob", 100, 300) == body[100:400]
    assert await store.get_range("r/blob", 700, 68) == body[700:]  # the last byte exactly
    assert await store.get_range("r/blob", 700, 1000) == body[700:]  # ends past the object
    assert await store.get_range("r/blob", len(body), 10) == b""  # starts at its end (416)
    assert await store.get_range("r/blob", len(body) + 5, 10) == b""
    with pytest.raises(NotFound):
        await store.get_range("r/absent", 0, 10)


async def test_get_range_refuses_a_range_http_cannot_send(store: ObjectStore) -> None:
    await store.put("r/blob", b"0123456789")
    for offset, length in [(-1, 10), (0, 0), (0, -5), (1.0, 10), (0, True), (0, 1 << 40)]:
        with pytest.raises(ValueError, match="get_range"):
            await store.get_range("r/blob", offset, length)  # type: ignore[arg-type]


async def test_empty_body_round_trip(store: ObjectStore) -> None:
    etag = await store.put("empty", b"")
    assert await store.get("empty") == (b"", etag)
    assert (await store.head("empty")).size == 0


# Larger than two S3 parts as the S3 backends are configured (conftest.py): a multipart
# upload of three parts there, the last a short one.
BIG_FILE_BYTES = 2 * MIN_PART_BYTES + 12345


def _file(tmp_path: Path, name: str, body: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(body)
    return str(path)


async def test_put_file_round_trips_a_file_larger_than_a_part(
    store: ObjectStore, tmp_path: Path
) -> None:
    body = os.urandom(BIG_FILE_BYTES)
    etag = await store.put_file("files/big.parquet", _file(tmp_path, "big", body))
    assert await store.get("files/big.parquet") == (body, etag)
    info = await store.head("files/big.parquet")
    assert (info.size, info.etag) == (len(body), etag)
    listed = [i async for i in store.list("files/")]
    assert [(i.key, i.size, i.etag) for i in listed] == [("files/big.parquet", len(body), etag)]


async def test_put_file_of_a_small_file_and_an_empty_one(
    store: ObjectStore, tmp_path: Path
) -> None:
    etag = await store.put_file("small", _file(tmp_path, "small", b"small body"))
    assert await store.get("small") == (b"small body", etag)
    empty = await store.put_file("empty", _file(tmp_path, "empty", b""))
    assert await store.get("empty") == (b"", empty)
    with pytest.raises(FileNotFoundError):  # the caller's file: no store error, no object
        await store.put_file("never", str(tmp_path / "absent"))
    with pytest.raises(NotFound):
        await store.head("never")


async def test_put_file_keeps_the_conditions_of_put(store: ObjectStore, tmp_path: Path) -> None:
    """If-None-Match and If-Match as `put` has them, above and below one part; a refused
    file leaves the object as it was."""
    big = os.urandom(BIG_FILE_BYTES)
    big_path, small_path = _file(tmp_path, "big", big), _file(tmp_path, "small", b"small")
    first = await store.put_file("k", big_path, if_none_match=True)
    for path in (big_path, small_path):
        with pytest.raises(PreconditionFailed):
            await store.put_file("k", path, if_none_match=True)
    assert await store.get("k") == (big, first)
    with pytest.raises(PreconditionFailed):
        await store.put_file("absent", small_path, if_match=first)
    second = await store.put_file("k", small_path, if_match=first)
    with pytest.raises(PreconditionFailed):
        await store.put_file("k", small_path, if_match=first)  # stale now
    assert await store.get("k") == (b"small", second)
    with pytest.raises(NotFound):
        await store.head("absent")


async def test_unconditional_put_replaces_and_changes_etag(store: ObjectStore) -> None:
    first = await store.put("k", b"one")
    second = await store.put("k", b"two")
    assert first != second
    assert await store.get("k") == (b"two", second)


async def test_second_create_if_absent_fails_and_keeps_body(store: ObjectStore) -> None:
    etag = await store.put("k", b"first", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        await store.put("k", b"second", if_none_match=True)
    assert await store.get("k") == (b"first", etag)


async def test_racing_creators_have_exactly_one_winner(concurrent_store: ObjectStore) -> None:
    async def create(i: int) -> bytes | None:
        body = f"writer-{i}".encode()
        try:
            await concurrent_store.put("race/new.json", body, if_none_match=True)
        except PreconditionFailed:
            return None
        return body

    results = await asyncio.gather(*(create(i) for i in range(64)))
    winners = [body for body in results if body is not None]
    assert len(winners) == 1
    assert (await concurrent_store.get("race/new.json"))[0] == winners[0]


async def test_if_match_with_current_etag_replaces(store: ObjectStore) -> None:
    etag = await store.put("k", b"v1")
    new_etag = await store.put("k", b"v2", if_match=etag)
    assert new_etag != etag
    assert await store.get("k") == (b"v2", new_etag)
    assert (await store.head("k")).etag == new_etag


async def test_if_match_with_stale_etag_fails(store: ObjectStore) -> None:
    stale = await store.put("k", b"v1")
    current = await store.put("k", b"v2")
    with pytest.raises(PreconditionFailed):
        await store.put("k", b"v3", if_match=stale)
    assert await store.get("k") == (b"v2", current)


async def test_if_match_on_missing_key_fails(store: ObjectStore) -> None:
    etag = await store.put("other", b"v1")
    with pytest.raises(PreconditionFailed):
        await store.put("missing", b"v2", if_match=etag)
    with pytest.raises(NotFound):
        await store.get("missing")


async def test_racing_swaps_have_exactly_one_winner_per_round(
    concurrent_store: ObjectStore,
) -> None:
    etag = await concurrent_store.put("pointer", b"round-0", if_none_match=True)
    for round_no in range(1, 5):

        async def swap(i: int, base: str, round_no: int = round_no) -> tuple[bytes, str] | None:
            body = f"round-{round_no}-writer-{i}".encode()
            try:
                return body, await concurrent_store.put("pointer", body, if_match=base)
            except PreconditionFailed:
                return None

        results = await asyncio.gather(*(swap(i, etag) for i in range(32)))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1, f"round {round_no}: {len(winners)} winners"
        body, etag = winners[0]
        assert await concurrent_store.get("pointer") == (body, etag)


async def _put_all(store: ObjectStore, keys: list[str], parallel: int = 32) -> None:
    limit = asyncio.Semaphore(parallel)

    async def put(key: str) -> None:
        async with limit:
            await store.put(key, key.encode())

    await asyncio.gather(*(put(key) for key in keys))


async def test_list_is_in_bytewise_key_order(store: ObjectStore) -> None:
    await _put_all(store, ORDER_KEYS)
    assert await _list(store, "") == _s3_order(ORDER_KEYS)


async def test_list_reports_what_head_reports(store: ObjectStore) -> None:
    await store.put("info/x", b"12345")
    await store.put("info/y/z", b"")
    listed = [info async for info in store.list("info/")]
    assert listed == [await store.head("info/x"), await store.head("info/y/z")]
    assert all(isinstance(info, ObjectInfo) for info in listed)


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "t",
        "t/",
        "t/a",
        "t/a/",
        "t/a/b",
        "t/a/b-",
        "t/é",
        "t/\u00e9a/",
        "t/z/y/x",
        "u",
        "v",
        "t//",
    ],
)
async def test_list_prefix_may_end_mid_segment(store: ObjectStore, prefix: str) -> None:
    await _put_all(store, ORDER_KEYS)
    expected = _s3_order([k for k in ORDER_KEYS if k.startswith(prefix)])
    assert await _list(store, prefix) == expected


async def test_list_start_after(store: ObjectStore) -> None:
    await _put_all(store, ORDER_KEYS)
    ordered = _s3_order(ORDER_KEYS)
    # Every key, plus bounds that are not keys: inside, between and around subtrees.
    bounds = [*ordered, "", "a", "t/", "t/a", "t/a/", "t/a/b-", "t/a/zzz", "t/é/", "zzz"]
    for after in bounds:
        expected = [k for k in ordered if k.encode() > after.encode()]
        assert await _list(store, "", start_after=after) == expected, after
        in_t = [k for k in expected if k.startswith("t/a")]
        assert await _list(store, "t/a", start_after=after) == in_t, after


async def test_list_pages_past_a_thousand_keys(store: ObjectStore) -> None:
    # Spread over directories and flat names so that pages end mid-directory.
    keys = [f"p/{i % 7}/{i:05d}" if i % 3 else f"p/{i % 7}-{i:05d}" for i in range(1100)]
    await _put_all(store, keys)
    ordered = _s3_order(keys)
    assert await _list(store, "p/") == ordered
    assert await _list(store, "p/", start_after=ordered[998]) == ordered[999:]
    assert await _list(store, "p/3") == [k for k in ordered if k.startswith("p/3")]


async def test_missing_object(store: ObjectStore) -> None:
    with pytest.raises(NotFound):
        await store.get("no/such/key")
    with pytest.raises(NotFound):
        await store.head("no/such/key")
    await store.delete("no/such/key")  # absent is not an error


async def test_delete(store: ObjectStore) -> None:
    await store.put("d/e/f", b"x")
    await store.put("d/g", b"y")
    await store.delete("d/e/f")
    with pytest.raises(NotFound):
        await store.get("d/e/f")
    with pytest.raises(NotFound):
        await store.head("d/e/f")
    assert await _list(store, "d/") == ["d/g"]
    await store.delete("d/e/f")


async def test_key_can_be_recreated_after_delete(store: ObjectStore) -> None:
    await store.put("d/e/f", b"x", if_none_match=True)
    await store.delete("d/e/f")
    await store.put("d/e/f", b"again", if_none_match=True)
    await store.delete("d/e/f")
    # Once its only key below is gone, "d/e" no longer names anything else.
    await store.put("d/e", b"now a leaf", if_none_match=True)
    assert (await store.get("d/e"))[0] == b"now a leaf"


async def test_last_modified_is_write_time(store: ObjectStore) -> None:
    before = time.time_ns()
    await store.put("lm", b"x")
    after = time.time_ns()
    # S3 reports whole seconds (and a server's clock may differ a little).
    slack = 2_000_000_000
    assert before - slack <= (await store.head("lm")).last_modified_ns <= after + slack


INVALID_KEYS = ["", "/a", "a/", "a//b", ".", "..", "a/./b", "a/../b", "../a", "a\x00b"]


@pytest.mark.parametrize("key", INVALID_KEYS)
async def test_invalid_keys_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(ValueError):
        await store.put(key, b"x")
    with pytest.raises(ValueError):
        await store.put(key, b"x", if_none_match=True)
    with pytest.raises(ValueError):
        await store.get(key)
    with pytest.raises(ValueError):
        await store.head(key)
    with pytest.raises(ValueError):
        await store.delete(key)


async def test_both_conditions_at_once_are_refused(store: ObjectStore) -> None:
    etag = await store.put("k", b"x")
    with pytest.raises(ValueError):
        await store.put("k", b"y", if_none_match=True, if_match=etag)
    assert (await store.get("k"))[0] == b"x"


# --- signed deletes (PROTOCOL §3.5 rule 6) ------------------------------------------------


async def test_signed_delete_deletes_only_when_sent(store: ObjectStore) -> None:
    await store.put("sd/k", b"x")
    await store.put("sd/other", b"y")
    signed = await store.sign_delete("sd/k", expires_in_s=60)
    assert signed.expires_at_unix_ns == signed.signed_at_unix_ns + 60 * 1_000_000_000
    assert (await store.get("sd/k"))[0] == b"x"  # signing sends nothing
    await store.send_signed_delete(signed)
    with pytest.raises(NotFound):
        await store.head("sd/k")
    assert await _list(store, "sd/") == ["sd/other"]


async def test_signed_delete_of_an_absent_key_succeeds(store: ObjectStore) -> None:
    await store.send_signed_delete(await store.sign_delete("sd/absent", expires_in_s=60))


async def test_signed_delete_sent_after_its_expiry_is_refused(
    store: ObjectStore, store_backend: str
) -> None:
    if store_backend == "moto":
        pytest.skip("moto 5.2.5 does not check X-Amz-Expires: it runs expired pre-signed URLs")
    await store.put("sd/k", b"x")
    signed = await store.sign_delete("sd/k", expires_in_s=1)
    # Real time has to pass for a real server to judge the expiry. Every backend here
    # judges it by this host's clock (MiniStack runs on it; S3 truncates X-Amz-Date to the
    # second, so signed_at_unix_ns may be up to 1 s early: the request expires no later).
    await asyncio.sleep((signed.expires_at_unix_ns - time.time_ns()) / 1e9 + 1.1)
    with pytest.raises(RequestExpired):
        await store.send_signed_delete(signed)
    assert (await store.get("sd/k"))[0] == b"x"


@pytest.mark.parametrize("expires_in_s", [0, -1, 7 * 24 * 3600 + 1])
async def test_sign_delete_refuses_an_expiry_s3_would_refuse(
    store: ObjectStore, expires_in_s: int
) -> None:
    with pytest.raises(ValueError, match="expires_in_s"):
        await store.sign_delete("sd/k", expires_in_s=expires_in_s)


async def test_conditional_get_answers_not_modified_until_the_object_changes(
    store: ObjectStore,
) -> None:
    assert isinstance(store, ConditionalGet)  # every backend answers 304 itself
    etag = await store.put("pointer", b"v1")
    assert await store.get_if_none_match("pointer", etag) is None
    assert await get_if_changed(store, "pointer", etag) is None
    assert await store.get_if_none_match("pointer", '"some-other-etag"') == (b"v1", etag)
    second = await store.put("pointer", b"v2")
    assert await store.get_if_none_match("pointer", etag) == (b"v2", second)
    assert await get_if_changed(store, "pointer", None) == (b"v2", second)
    await store.delete("pointer")
    with pytest.raises(NotFound):
        await store.get_if_none_match("pointer", second)


async def test_get_if_changed_falls_back_to_a_plain_get(store: ObjectStore) -> None:
    class PlainStore:  # a wrapper that only has the ObjectStore methods
        def __init__(self, inner: ObjectStore) -> None:
            self.inner = inner

        async def get(self, key: str) -> tuple[bytes, str]:
            return await self.inner.get(key)

    plain = PlainStore(store)
    assert not isinstance(plain, ConditionalGet)
    etag = await store.put("k", b"body")
    assert await get_if_changed(plain, "k", etag) is None  # type: ignore[arg-type]
    assert await get_if_changed(plain, "k", '"x"') == (b"body", etag)  # type: ignore[arg-type]


def _folders(keys: list[str], prefix: str) -> list[str]:
    found = set()
    for key in keys:
        rest = key.removeprefix(prefix) if key.startswith(prefix) else None
        if rest is not None and "/" in rest:
            found.add(prefix + rest[: rest.index("/") + 1])
    return _s3_order(list(found))


@pytest.mark.parametrize("prefix", ["", "t", "t/", "t/a", "t/a/", "t/é", "t/z/", "u", "v/"])
async def test_common_prefixes_are_the_folders_under_a_prefix(
    store: ObjectStore, prefix: str
) -> None:
    await _put_all(store, ORDER_KEYS)
    assert [f async for f in store.common_prefixes(prefix)] == _folders(ORDER_KEYS, prefix)


async def test_common_prefixes_page_past_a_thousand_folders(store: ObjectStore) -> None:
    # Folders with several keys each, and flat keys between them, so pages end anywhere.
    keys = [f"g/{i:04d}/{j}" for i in range(1010) for j in range(2)] + [
        f"g/{i:04d}-flat" for i in range(0, 1010, 100)
    ]
    await _put_all(store, keys)
    assert [f async for f in store.common_prefixes("g/")] == _folders(keys, "g/")


async def test_list_range_stops_at_its_last_key(store: ObjectStore) -> None:
    keys = [f"r/{i:04d}" for i in range(2100)]
    await _put_all(store, keys)
    for after, until in [
        (None, "r/0999"),
        ("r/0999", "r/1000"),
        ("r/0500", "r/1999x"),
        ("r/2", None),
    ]:
        got = [i.key async for i in list_range(store, "r/", after, until)]
        want = [k for k in keys if (after is None or k > after) and (until is None or k <= until)]
        assert got == want, (after, until)
