"""``POST /api/v1/read`` answers through real HTTP (`read_client`) over a committed
snapshot and a live window (`read_world`): equal to the per-sample oracle in both
response types, all four matcher types, hints narrowing, tombstones masking both parts,
and the internal principal's own byte pool. Every `serving` block asserts the event
loop never stalled more than 100 ms."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rollup.table.commit import commit as commit_snapshot
from rollup.table.commit import load_latest
from rollup.table.manifest import Changes
from rollup.table.owner import OwnerLease
from rollup.table.tombstones import Tombstone

from .read_client import END_MS, START_MS, body, post, query, samples_answer, serving, stream_answer
from .read_world import ALL, Matcher, World, at, bits, make_world, oracle


@pytest.fixture(params=[False, True], ids=["points-only", "series-index"])
async def world(tmp_path: Path, request: pytest.FixtureRequest) -> World:
    """The world committed without the series index (read as before it existed) and with
    it (matchers resolved against ``series`` rows first): the same answers."""
    return await make_world(tmp_path, series=request.param)


MATCHER_CASES: list[list[Matcher]] = [
    [("RE", "__name__", ".+")],
    [("EQ", "__name__", "cpu")],
    [("EQ", "__name__", "cpu"), ("NEQ", "host", "a")],
    [("RE", "__name__", "cpu|mem"), ("NRE", "host", "b")],
    [("EQ", "__name__", "http_server_duration")],  # two stored series, one presented
    [("EQ", "__name__", "temp"), ("EQ", "a_b", "x")],  # a.b keeps a_b's name? no: exact wins
    [("EQ", "__name__", "temp"), ("EQ", "a_b", "y")],
    [("RE", "__name__", "c.*"), ("EQ", "zone", "")],  # a label no series has, against ""
    [("EQ", "__name__", "nothing")],
    # Every matcher matches "": Prometheus' remote read server serves it (its TSDB selects
    # every series lacking the label); so does this one, bounded by max_read_samples.
    [("EQ", "zone", "")],
    [("NEQ", "host", "a")],
]


async def test_samples_and_streamed_answers_equal_the_oracle(world: World) -> None:
    async with serving(world) as (url, _probe):
        for matchers in MATCHER_CASES:
            expected = oracle(ALL, matchers, START_MS, END_MS)
            status, headers, payload = await post(url, body([query(matchers)]))
            assert status == 200, payload
            assert headers["Content-Type"] == "application/x-protobuf"
            assert headers["Content-Encoding"] == "snappy"
            assert samples_answer(payload) == [expected], matchers
            status, headers, payload = await post(url, body([query(matchers)], [1, 0]))
            assert status == 200 and headers["Content-Type"].startswith(
                "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse"
            )
            assert stream_answer(payload) == expected, matchers
    # The rules the oracle holds the answers to were exercised by the data.
    cpu = dict(oracle(ALL, [("EQ", "__name__", "cpu")], START_MS, END_MS))
    host_a = cpu[(("__name__", "cpu"), ("host", "a"))]
    assert (at(2) // 1_000_000, bits(-2.0)) in host_a  # the later µs, from the live part
    assert (at(8) // 1_000_000, 0x7FF0000000000002) in host_a  # staleness marker bits
    host_b = cpu[(("__name__", "cpu"), ("host", "b"))]
    assert (at(9) // 1_000_000, bits(9.0)) in host_b  # agent-a after agent-0 at one µs
    http = dict(oracle(ALL, [("EQ", "__name__", "http_server_duration")], START_MS, END_MS))
    assert list(http.values()) == [
        [(at(5) // 1_000_000, bits(10.0)), (at(7) // 1_000_000, bits(12.0))]
    ]
    assert world.endpoint.metrics.query_name_collisions._value.get() >= 2
    assert world.endpoint.metrics.query_dropped_labels._value.get() >= 2
    # Footers come from the cache (query.cache_bytes) after the first read, counted.
    lookups = world.endpoint.metrics.query_cache
    assert lookups.labels(kind="footer", result="miss")._value.get() == 1
    assert lookups.labels(kind="footer", result="hit")._value.get() >= len(MATCHER_CASES)


async def test_extreme_ranges_select_everything_they_cover(world: World) -> None:
    everything = [("RE", "__name__", ".+")]
    async with serving(world) as (url, _probe):
        status, _, payload = await post(
            url,
            body(
                [
                    query(everything, start_ms=-(2**63), end_ms=2**63 - 1),
                    query(everything, hints=(-(2**63), 2**63 - 1)),
                    query(everything, start_ms=2**63 - 1, end_ms=-(2**63)),
                ]
            ),
        )
    assert status == 200, payload
    whole, hinted, empty = samples_answer(payload)
    assert whole == oracle(ALL, everything, -(2**63), 2**63 - 1) and hinted == whole[:]
    assert hinted == oracle(ALL, everything, START_MS, END_MS) and empty == []


async def test_hints_narrow_and_queries_answer_in_order(world: World) -> None:
    everything = [("RE", "__name__", ".+")]
    narrow = (at(3) // 1_000_000, at(7) // 1_000_000)
    async with serving(world) as (url, _probe):
        status, _, payload = await post(
            url,
            body(
                [
                    query(everything, hints=narrow),
                    query([("EQ", "__name__", "mem")]),
                    query(everything, start_ms=at(9) // 1_000_000),
                ]
            ),
        )
    assert status == 200
    first, second, third = samples_answer(payload)
    assert first == oracle(ALL, everything, *narrow)
    assert first != oracle(ALL, everything, START_MS, END_MS)
    assert second == oracle(ALL, [("EQ", "__name__", "mem")], START_MS, END_MS)
    assert third == oracle(ALL, everything, at(9) // 1_000_000, END_MS)


async def test_tombstones_mask_committed_and_live_parts(world: World) -> None:

    delete = Tombstone(
        id=str(uuid.UUID(int=7)),
        metric="cpu",
        labels=(("host", "b"),),
        end=datetime(2030, 1, 1, tzinfo=UTC),
        tables=("points",),
        requested_by="test",
        reason="a bad sensor",
        created_at="2026-11-21T11:00:00Z",
    )
    owner = await OwnerLease.acquire(world.store, "job", 600, world.clock)
    base = await load_latest(world.store)
    await commit_snapshot(
        world.store, base=base, changes=Changes(added_tombstones=(delete,)), owner=owner,
        clock=world.clock,
    )  # fmt: skip
    await owner.release()
    matchers = [("EQ", "__name__", "cpu")]
    expected = oracle(ALL, matchers, START_MS, END_MS, deleted=[("cpu", (("host", "b"),))])
    assert [s for s, _ in expected] == [(("__name__", "cpu"), ("host", "a"))]
    async with serving(world) as (url, _probe):
        _, _, payload = await post(url, body([query(matchers)]))
        assert samples_answer(payload) == [expected]
        _, _, payload = await post(url, body([query(matchers)], [1]))
        assert stream_answer(payload) == expected
    assert world.endpoint.last_work is not None and world.endpoint.last_work.rows_masked >= 3


async def test_internal_reads_have_a_pool_of_their_own(world: World) -> None:
    engine_token = "engine-internal-token"
    world.endpoint.internal.add("engine", engine_token)
    budget = world.endpoint.budget
    held = await budget.acquire(budget.capacity)  # outside readers hold every byte...
    for _ in range(2):
        await world.endpoint.selecting.acquire()  # ...and every selection slot
    try:
        async with serving(world) as (url, _probe):
            matchers = [("EQ", "__name__", "cpu")]
            status, _, payload = await post(url, body([query(matchers)]), token=engine_token)
            assert status == 200
            assert samples_answer(payload) == [oracle(ALL, matchers, START_MS, END_MS)]
            outside = asyncio.create_task(post(url, body([query(matchers)])))
            done, _ = await asyncio.wait({outside}, timeout=0.3)
            assert not done  # an outside read waits for bytes...
            budget.release(held)
            held = 0
            for _ in range(2):
                world.endpoint.selecting.release()
            status, _, _ = await outside  # ...and is served once they are free
            assert status == 200
    finally:
        if held:
            budget.release(held)
    assert world.endpoint.internal.authenticate("Bearer nope") is None
