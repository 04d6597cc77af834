"""The feature gate of a process (PROTOCOL §3.10 "Writing", `index.features`): its version
entry, the feature record read with conditional GETs, the flip seen within one refresh,
and the refusal of a feature this version does not implement. Memory store, manual clock."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from index.features import BundleGate, FeatureRecordError, UnknownFeature, registered
from index.versions import ENTRY_TTL_S, HEARTBEAT_S, READS_BUNDLES, read_registry
from protocol import keys
from protocol.clock import ManualClock
from protocol.records import FeatureRecord, RecordError, VersionEntry
from store.counting import CountingStore
from store.memory import MemoryStore

T0_NS = 1_760_000_000_000_000_000
NS = 1_000_000_000


def feature_record(**fields: object) -> bytes:
    doc = {"schema": "lightmetrics.features.v1", "written_by": "op", "written_at_unix_ns": 1}
    return json.dumps({**doc, **fields}).encode()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0_NS)


def gate_on(store: object, clock: ManualClock, role: str = "collector") -> BundleGate:
    return BundleGate(store, clock, role=role, process_id="c-1")  # type: ignore[arg-type]


async def test_start_writes_the_entry_and_bundles_stay_off_without_a_record(
    clock: ManualClock,
) -> None:
    store = CountingStore(MemoryStore(clock=clock))
    gate = gate_on(store, clock)
    await gate.start()
    assert not gate.bundles_enabled
    body, _etag = await store.get(keys.version_entry_key("collector", "c-1"))
    entry = VersionEntry.from_json(body)
    assert entry.reads_bundles is READS_BUNDLES is True
    assert entry.expires_at_unix_ns == T0_NS + int(ENTRY_TTL_S * NS)
    assert entry.version


async def test_collectors_see_the_flip_within_one_refresh_and_pay_a_put_and_a_get(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CountingStore(MemoryStore(clock=clock))
    gate = gate_on(store, clock)
    await gate.start()
    await store.put(keys.INDEX_FEATURES_KEY, feature_record(bundles=False))
    await gate.refresh()
    assert not gate.bundles_enabled
    await store.put(keys.INDEX_FEATURES_KEY, feature_record(bundles=True))
    store.clear()
    clock.advance(HEARTBEAT_S)
    await gate.refresh()
    assert gate.bundles_enabled
    assert store.count("put") == 1 and store.count("get") == 1  # one refresh, one minute
    # The record has not changed: the next GET is conditional (304, no body re-read).
    unchanged = MemoryStore.get_if_none_match
    calls: list[str] = []

    async def spy(self: MemoryStore, key: str, etag: str) -> tuple[bytes, str] | None:
        answer = await unchanged(self, key, etag)
        calls.append("304" if answer is None else "200")
        return answer

    monkeypatch.setattr(MemoryStore, "get_if_none_match", spy)
    await gate.refresh()
    assert calls == ["304"] and gate.bundles_enabled
    assert gate.requests == {"PUT": 4, "GET": 4}  # start and three refreshes


async def test_a_process_refuses_to_start_on_a_feature_it_does_not_implement(
    clock: ManualClock,
) -> None:
    store = MemoryStore(clock=clock)
    await store.put(keys.INDEX_FEATURES_KEY, feature_record(bundles=True, zstd_frames=True))
    gate = gate_on(store, clock)
    with pytest.raises(UnknownFeature) as refused:
        await gate.start()
    assert "'zstd_frames'" in str(refused.value)
    assert keys.INDEX_FEATURES_KEY in str(refused.value)
    # Refused before anything was written: no entry says it runs.
    assert [i.key async for i in store.list(keys.INDEX_VERSIONS_PREFIX)] == []
    # A feature named but off, and a later version's metadata, are no reason to refuse.
    await store.put(keys.INDEX_FEATURES_KEY, feature_record(bundles=True, zstd_frames=False))
    await gate.start()
    assert gate.bundles_enabled


async def test_an_unreadable_feature_record_is_a_clear_error(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    await store.put(keys.INDEX_FEATURES_KEY, feature_record(bundles="yes"))
    with pytest.raises(FeatureRecordError, match=r"index/v1/features\.json.*bundles"):
        await gate_on(store, clock).start()


async def test_a_one_shot_process_registers_for_its_block_and_leaves(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    async with registered(store, clock, role="rollup-verify", process_id="h-1-ab") as gate:
        registry = await read_registry(store, clock)
        assert [e.key for e in registry.entries] == [gate.key]
        assert registry.lacking_reads_bundles() == []
    assert (await read_registry(store, clock)).entries == []
    # A collector's entry stays: enable-bundles matches log writers to it.
    async with registered(store, clock, role="collector", process_id="c-1"):
        pass
    assert [e.process_id for e in (await read_registry(store, clock)).entries] == ["c-1"]


async def test_the_heartbeat_renews_the_entry_and_reports_an_unknown_feature(
    clock: ManualClock,
) -> None:
    store = MemoryStore(clock=clock)
    found: list[UnknownFeature] = []
    gate = gate_on(store, clock)
    gate.on_unknown_feature = found.append
    await gate.start()
    task = asyncio.create_task(gate.run())  # ManualClock.sleep moves the clock: no waiting
    for _turn in range(20):
        await asyncio.sleep(0)
    assert gate.requests["PUT"] >= 10
    registry = await read_registry(store, clock)
    assert registry.unexpired()[0].process_id == "c-1"
    await store.put(keys.INDEX_FEATURES_KEY, feature_record(bundles=True, later=True))
    for _turn in range(20):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert found and found[-1].names == ["later"] and gate.unknown_feature is found[-1]
    clock.advance(ENTRY_TTL_S)
    assert (await read_registry(store, clock)).unexpired() == []


def test_records_parse_strictly() -> None:
    with pytest.raises(RecordError, match="reads_bundles"):
        VersionEntry.from_json(
            b'{"schema":"lightmetrics.version_entry.v1","version":"1","reads_bundles":"true",'
            b'"expires_at_unix_ns":5}'
        )
    with pytest.raises(RecordError, match="schema"):
        VersionEntry.from_json(b'{"schema":"x","version":"1","expires_at_unix_ns":5}')
    lacking = VersionEntry.from_json(
        b'{"schema":"lightmetrics.version_entry.v1","version":"0.9","expires_at_unix_ns":5}'
    )
    assert lacking.reads_bundles is False
    record = FeatureRecord.from_json(feature_record(bundles=True, later=True, note="x"))
    assert record.features() == {"bundles": True, "later": True}
    with pytest.raises(RecordError, match="written_by"):
        FeatureRecord.from_json(b'{"schema":"lightmetrics.features.v1","bundles":true}')


def test_version_entry_keys() -> None:
    key = keys.version_entry_key("query-collector", "c-1")
    assert key == "index/v1/versions/query-collector-c-1.json"
    assert keys.parse_version_entry_key(key) == ("query-collector", "c-1")
    assert keys.parse_version_entry_key("index/v1/versions/collector-query-x.json") == (
        "collector",
        "query-x",
    )
    for bad_role, bad_id in (("compactor", "x"), ("collector", "a/b"), ("collector", "")):
        with pytest.raises(keys.KeyFormatError):
            keys.version_entry_key(bad_role, bad_id)
    with pytest.raises(keys.KeyFormatError):
        keys.parse_version_entry_key("index/v1/versions/compactor-x.json")
