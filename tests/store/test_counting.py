"""`store.counting.CountingStore`: what each call costs, by operation and by S3 price class,
the ordered request log, and `scope` (the requests made within a scope, and by the tasks
started in it, are counted apart; those of tasks started before it are not)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from protocol.clock import ManualClock
from store.counting import CountingStore, area_of, by_class, request_class
from store.memory import MemoryStore
from store.time import ClockOffset, store_clock


async def test_a_scope_counts_its_own_requests_and_its_tasks_but_not_earlier_tasks() -> None:
    store = CountingStore(MemoryStore())
    release = asyncio.Event()

    async def background() -> None:  # started before the scope: a daemon's audit, say
        await release.wait()
        await store.put("reconciler/v1/audits/a.json", b"{}")

    earlier = asyncio.create_task(background())
    with store.scope("gc-1") as tally:
        await store.put("gc/v1/marks/x.json", b"{}", if_none_match=True)
        release.set()
        await earlier  # runs while the scope is open, in its own context
        await asyncio.gather(store.get("gc/v1/marks/x.json"), store.head("gc/v1/marks/x.json"))
        child = asyncio.create_task(store.delete("gc/v1/marks/x.json"))
        await child
    await store.put("gc/v1/marks/y.json", b"{}")  # after the scope

    assert dict(tally) == {
        ("put_if_none_match", "gc/marks"): 1,
        ("get", "gc/marks"): 1,
        ("head", "gc/marks"): 1,
        ("delete", "gc/marks"): 1,
    }
    assert store.tally[("put", "reconciler/audits")] == 1  # counted, but not in the scope
    assert store.tally[("put", "gc/marks")] == 1
    assert store.scoped == {"gc-1": tally}


async def test_each_call_is_counted_by_operation_area_and_price_class(tmp_path: Path) -> None:
    store = CountingStore(MemoryStore())
    etag = await store.put("gc/v1/marks/a.json", b"{}", if_none_match=True)
    await store.put("gc/v1/marks/a.json", b"{}", if_match=etag)
    await store.put("accepted/v1/x.json", b"{}")
    (tmp_path / "f").write_bytes(b"file")
    await store.put_file("accepted/v1/y.json", str(tmp_path / "f"), if_none_match=True)
    await store.get("gc/v1/marks/a.json")
    assert await store.get_range("gc/v1/marks/a.json", 1, 1) == b"}"  # a ranged GET
    assert (
        await store.get_if_none_match(
            "accepted/v1/x.json", (await store.head("accepted/v1/x.json")).etag
        )
        is None
    )
    assert [f async for f in store.common_prefixes("accepted/")] == ["accepted/v1/"]
    signed = await store.sign_delete("accepted/v1/x.json", expires_in_s=60)  # sends nothing
    await store.send_signed_delete(signed)
    await store.delete("accepted/v1/y.json")

    assert dict(store.tally) == {
        ("put_if_none_match", "gc/marks"): 1,
        ("put_if_match", "gc/marks"): 1,
        ("put", "accepted"): 1,
        ("put_if_none_match", "accepted"): 1,
        ("get", "gc/marks"): 2,
        ("get", "accepted"): 1,
        ("head", "accepted"): 1,
        ("list", "accepted"): 1,
        ("delete", "accepted"): 2,
    }
    # PUT-class: 4 puts and 1 LIST; GET-class: 3 GETs (one ranged), 1 HEAD and the 2
    # DELETEs (free on S3, counted GET-class to be conservative).
    assert store.by_class() == by_class(store.tally) == {"PUT": 5, "GET": 6}
    assert [request_class(op) for op in ("post", "list", "head", "delete")] == [
        "PUT",
        "PUT",
        "GET",
        "GET",
    ]
    # The log names the method without its condition, in order.
    assert [method for method, _key in store.requests] == [
        "put",
        "put",
        "put",
        "put",
        "get",
        "get",
        "head",
        "get",
        "list",
        "delete",
        "delete",
    ]
    assert store.count("put") == 4 and store.count("put", "gc/") == 2
    assert store.keys_of("delete") == ["accepted/v1/x.json", "accepted/v1/y.json"]


@pytest.mark.parametrize("keys, pages", [(0, 1), (1000, 1), (1001, 2), (2500, 3)])
async def test_a_listing_counts_one_page_per_thousand_keys_returned(keys: int, pages: int) -> None:
    inner = MemoryStore()
    for i in range(keys):
        await inner.put(f"raw-blobs/v1/{i:05d}", b"")
    store = CountingStore(inner)

    listed = [info.key async for info in store.list("raw-blobs/", start_after="raw-blobs/")]

    assert len(listed) == keys
    assert store.tally == {("list", "raw-blobs"): pages}
    assert store.lists == [("raw-blobs/", "raw-blobs/")]  # one call, however many pages
    assert store.listed == ({"raw-blobs": keys} if keys else {})
    store.clear()
    assert not store.tally and not store.requests and not store.lists and not store.listed


async def test_overlap_lets_concurrent_calls_be_in_flight_together() -> None:
    store = CountingStore(MemoryStore(), overlap=True)
    await asyncio.gather(*(store.put(f"k{i}", b"") for i in range(5)))
    assert store.max_in_flight == 5 and store.in_flight == 0
    calm = CountingStore(MemoryStore())
    await asyncio.gather(*(calm.put(f"k{i}", b"") for i in range(5)))
    assert calm.max_in_flight == 1  # a memory store answers without yielding


def test_areas_name_the_layout_parts() -> None:
    assert [
        area_of(k)
        for k in (
            "index/v1/log/x",
            "reconciler/v1/audits/a.json",
            "gc/v1/raw-retention.json",
            "work/x",
            "raw-blobs/v1/ab",
            "",
        )
    ] == [
        "index-log",
        "reconciler/audits",
        "gc/raw-retention",
        "work-markers",
        "raw-blobs",
        "(root)",
    ]


def test_store_time_looks_through_the_wrapper() -> None:
    inner = MemoryStore()
    inner.clock_offset = ClockOffset()  # type: ignore[attr-defined]  # as S3Store has
    clock = ManualClock()
    assert store_clock(CountingStore(inner), clock).offset is inner.clock_offset  # type: ignore[attr-defined]


async def test_the_request_log_is_bounded() -> None:
    counting = CountingStore(MemoryStore(), max_logged=3)
    for n in range(3):
        await counting.put(f"k{n}", b"x")
    with pytest.raises(OverflowError, match="logged 3 requests"):
        await counting.get("k0")
    counting.clear()
    assert (await counting.get("k0"))[0] == b"x"  # cleared: logging again
