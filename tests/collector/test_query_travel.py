"""``GET /v1/query`` time travel (``version=``/``as_of=``): what a request costs.

Counted at the store (`tests.rollup.dataset_builder.CountingStore`): a later request
walks only the versions no earlier one did, ``as_of`` before everything is bounded by
``max_travel_versions`` (400 ``travel_too_far``) or answered 404 from what is known, and
a version vacuum removed is a 404 whatever the cache held (issue 24 item 9)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from aiohttp.test_utils import make_mocked_request

from collector.auth import Authenticator
from collector.metrics import CollectorMetrics
from collector.query.api import LiveQuery, parse_query
from collector.query.committed import SnapshotSource
from collector.query.coverage import Coverage
from collector.query.endpoint import QueryEndpoint
from config import Principal, TokenTable, hash_token
from config.settings import QuerySettings
from protocol import keys
from protocol.clock import ManualClock
from rollup.read.chain_index import TravelTooFar
from rollup.table.commit import VersionNotFound
from rollup.table.manifest import parse_created_at
from rollup.table.owner import OwnerLease
from rollup.table.storage import arrow_filesystem
from store.counting import CountingStore
from store.memory import MemoryStore
from tests.rollup.dataset_builder import commit_rows, hour_at, points

VERSIONS = 12
MANIFESTS = keys.ROLLUP_MANIFESTS_PREFIX
TOKEN = "travel-reader"
TOKENS = TokenTable([Principal(name="r", token_sha256=hash_token(TOKEN), read=True)])


async def chain() -> tuple[CountingStore, ManualClock, list[datetime], list[str]]:
    """Versions 1..12, a minute apart: the store, the clock, their times and keys."""
    store = MemoryStore("memory://travel-query")
    clock = ManualClock(hour_at(3).start_ns)
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    times, manifest_keys = [], []
    for n in range(VERSIONS):
        loaded = await commit_rows(
            store, owner, clock, data=[("points", hour_at(0), points(hour_at(0), 1, seq_start=n))]
        )
        times.append(parse_created_at(loaded.snapshot.created_at))
        manifest_keys.append(loaded.manifest_key)
        clock.advance(60)
    return CountingStore(store), clock, times, manifest_keys


def source(store: CountingStore, clock: ManualClock, max_back: int) -> SnapshotSource:
    return SnapshotSource(
        store, refresh_interval_s=3600, max_travel_versions=max_back, monotonic=clock.monotonic
    )


def travel(**params: str) -> LiveQuery:
    query = {"metric": ["cpu"], **{k: [v] for k, v in params.items()}}
    return parse_query(query, now_ns=hour_at(4).start_ns)


def at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_later_request_does_not_walk_again() -> None:
    store, clock, times, _ = await chain()
    snapshots = source(store, clock, max_back=100)
    first = await snapshots.for_query(travel(as_of=at(times[2])))
    assert first is not None and first.version == 3
    # The pointer, the latest, then one manifest per version stepped back.
    assert store.count("get", MANIFESTS) == 1 + (VERSIONS - 3)

    for params, version in (
        ({"as_of": at(times[3])}, 4),
        ({"as_of": at(times[3] + timedelta(seconds=30))}, 4),
        ({"version": "6"}, 6),
        ({"as_of": at(times[-1] + timedelta(days=1))}, VERSIONS),
    ):
        store.clear()
        answer = await snapshots.for_query(travel(**params))
        assert answer is not None and answer.version == version
        # At most the asked-for manifest itself: no walk, not even the pointer.
        assert store.count("get", MANIFESTS) <= 1, (params, store.requests)
        assert store.count("get") == store.count("get", MANIFESTS)
        assert store.count("list") == 0


async def test_as_of_before_everything_is_bounded_then_answered_from_memory() -> None:
    store, clock, times, _ = await chain()
    bounded = source(store, clock, max_back=5)
    for _ in range(2):
        store.clear()
        with pytest.raises(TravelTooFar, match="within 5 versions") as caught:
            await bounded.for_query(travel(as_of="1970-01-01T00:00:00Z"))
        assert caught.value.limit == 5
        assert store.count("get", MANIFESTS) <= 1 + 5  # never the whole chain
    assert store.count("get") == 0  # the second time: nothing read at all
    with pytest.raises(TravelTooFar, match="6 versions behind"):
        await bounded.for_query(travel(version=str(VERSIONS - 6)))
    assert store.count("get") == 0  # refused before any step
    assert (await bounded.for_query(travel(version=str(VERSIONS - 5)))).version == VERSIONS - 5

    whole = source(store, clock, max_back=100)
    for expected_gets in (2 + VERSIONS - 1, 0):  # pointer, latest, 11 steps; then none
        store.clear()
        with pytest.raises(VersionNotFound, match="oldest committed is version 1"):
            await whole.for_query(travel(as_of=at(times[0] - timedelta(seconds=1))))
        assert store.count("get") == expected_gets


async def test_vacuumed_versions_are_404_whatever_the_cache_holds() -> None:
    store, clock, times, manifest_keys = await chain()
    snapshots = source(store, clock, max_back=100)
    with pytest.raises(VersionNotFound):
        await snapshots.for_query(travel(as_of="1970-01-01T00:00:00Z"))  # learns the chain
    for key in manifest_keys[:3]:  # as vacuum does beyond the retention
        await store.delete(key)
    for version in (2, 3):
        with pytest.raises(VersionNotFound, match=f"version {version} was vacuumed"):
            await snapshots.for_query(travel(version=str(version)))
    assert (await snapshots.for_query(travel(version="4"))).version == 4
    store.clear()
    with pytest.raises(VersionNotFound, match="oldest kept is 4"):
        await snapshots.for_query(travel(version="1"))
    assert store.count("get") == 0  # below the floor: no request
    with pytest.raises(VersionNotFound, match="oldest kept is version 4"):
        await snapshots.for_query(travel(as_of=at(times[1])))
    with pytest.raises(VersionNotFound, match="does not exist"):
        await snapshots.for_query(travel(version=str(VERSIONS + 1)))


async def test_http_answers_travel_too_far_and_version_not_found() -> None:
    store, clock, _, _ = await chain()
    endpoint = QueryEndpoint(
        authenticator=Authenticator(TOKENS),
        settings=QuerySettings(max_travel_versions=3),
        snapshots=source(store, clock, max_back=3),
        coverage=Coverage(store, settle_margin_s=5, refresh_interval_s=0.0, history_wait_s=60.0),
        filesystem=lambda: arrow_filesystem("file:///nonexistent"),
        metrics=CollectorMetrics(),
        now_ns=clock.now_ns,
    )

    async def get(query: str) -> tuple[int, dict[str, object]]:
        request = make_mocked_request(
            "GET", f"/v1/query?metric=cpu&{query}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        response = await endpoint.get_query(request)
        assert response.body is not None
        return response.status, json.loads(response.body)

    status, body = await get("as_of=1970-01-01T00:00:00Z")
    assert status == 400 and body["error"] == "travel_too_far", body
    assert (body["param"], body["limit"]) == ("as_of", 3)
    status, body = await get("version=1")
    assert (status, body["error"], body["param"]) == (400, "travel_too_far", "version")
    status, body = await get(f"version={VERSIONS + 5}")
    assert (status, body["error"]) == (404, "version_not_found")
