"""``lm-reconciler enable-bundles`` (PROTOCOL §3.10 "Writing", `reconciler.features_cmd`):
refused while an unexpired entry lacks ``reads_bundles``, a log writer of the retention
window has no entry, or the lease holder has none; written (once) otherwise; and the
reconciler refusing to start on a feature it does not implement. Memory store and a
manual clock, then the real console entry on an fs store."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from index.features import BundleGate, UnknownFeature
from index.versions import ENTRY_TTL_S, HEARTBEAT_S, reconciler_process_id
from protocol import keys
from protocol.clock import ManualClock
from protocol.records import FeatureRecord, VersionEntry
from reconciler import __main__ as cli
from reconciler.features_cmd import EnableResult, enable_bundles
from reconciler.status import gather_status
from store.memory import MemoryStore
from tests.reconciler.conftest import cli_env, context, make_settings, run_cli

NS = keys.NS_PER_S
SETTINGS = make_settings()
RETENTION_S = SETTINGS.reconciler.segment_retention_s


async def enable(store: MemoryStore, clock: ManualClock, *, dry_run: bool = False) -> EnableResult:
    return await enable_bundles(store, clock, SETTINGS, by="op@host", dry_run=dry_run)


async def register(store: MemoryStore, clock: ManualClock, role: str, pid: str) -> BundleGate:
    gate = BundleGate(store, clock, role=role, process_id=pid)
    await gate.start()
    return gate


async def old_entry(store: MemoryStore, clock: ManualClock, key: str) -> None:
    """An entry of a version whose records cannot hold a range (no ``reads_bundles``)."""
    entry = VersionEntry(
        version="0.9", expires_at_unix_ns=clock.now_ns() + int(ENTRY_TTL_S * NS)
    ).model_dump(by_alias=True, exclude={"reads_bundles"})
    await store.put(key, json.dumps(entry).encode())


async def log_segment(store: MemoryStore, clock: ManualClock, writer: str, age_s: float) -> str:
    key = keys.index_log_segment_key(clock.now_ns() - int(age_s * NS), writer, 7)
    await store.put(key, b"segment")  # enable-bundles reads names only
    return key


async def features(store: MemoryStore) -> FeatureRecord | None:
    try:
        body, _etag = await store.get(keys.INDEX_FEATURES_KEY)
    except Exception:
        return None
    return FeatureRecord.from_json(body)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_760_000_000_000_000_000)


async def test_refused_while_an_unexpired_entry_lacks_reads_bundles_until_it_expires(
    clock: ManualClock,
) -> None:
    store = MemoryStore(clock=clock)
    old = keys.version_entry_key("rollup-job", "old-host-1")
    await old_entry(store, clock, old)
    refused = await enable(store, clock)
    assert not refused.bundles and len(refused.blocking) == 1
    assert old in refused.blocking[0] and "'0.9'" in refused.blocking[0]
    assert await features(store) is None
    # The old process stopped: once its entry expires it says nothing about the store.
    clock.advance(ENTRY_TTL_S + 1)
    done = await enable(store, clock)
    assert done.bundles and done.written and done.blocking == []
    record = await features(store)
    assert record is not None and record.bundles and record.written_by == "op@host"


async def test_refused_while_a_recent_log_writer_has_no_entry(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    segment = await log_segment(store, clock, "old-collector", age_s=3600)
    await log_segment(store, clock, "new-collector", age_s=60)
    await log_segment(store, clock, "gone-collector", age_s=RETENTION_S + 3600)  # past it
    await register(store, clock, "collector", "new-collector")
    refused = await enable(store, clock)
    assert len(refused.blocking) == 1 and refused.log_writers == 2
    assert "'old-collector'" in refused.blocking[0] and segment in refused.blocking[0]
    assert keys.version_entry_key("collector", "old-collector") in refused.blocking[0]
    assert await features(store) is None
    await register(store, clock, "query-collector", "old-collector")  # upgraded
    assert (await enable(store, clock)).written


async def test_refused_while_the_lease_holder_has_no_entry(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    ctx = await context(store, clock, owner="reconciler-host-1-abc")
    refused = await enable(store, clock)
    assert refused.lease_holder == "reconciler-host-1-abc" and len(refused.blocking) == 1
    assert "lease holder 'reconciler-host-1-abc'" in refused.blocking[0]
    assert "index/v1/versions/reconciler-host-1-abc.json" in refused.blocking[0]
    await register(store, clock, "reconciler", reconciler_process_id(ctx.fence.owner))
    assert (await enable(store, clock)).written


async def test_success_is_idempotent_and_collectors_see_it_within_one_refresh(
    clock: ManualClock,
) -> None:
    store = MemoryStore(clock=clock)
    await log_segment(store, clock, "c-1", age_s=10)
    collector = await register(store, clock, "collector", "c-1")
    dry = await enable(store, clock, dry_run=True)
    assert dry.blocking == [] and not dry.bundles and await features(store) is None
    assert "bundles         off" in (await gather_status(store, clock, lookback_s=300)).render()
    first = await enable(store, clock)
    assert first.written and first.entries == 1
    status = await gather_status(store, clock, lookback_s=300)
    assert status.to_json()["features"]["bundles"] is True
    assert "bundles         on since" in status.render() and "op@host" in status.render()
    written = await store.get(keys.INDEX_FEATURES_KEY)
    again = await enable(store, clock)
    assert again.bundles and not again.written
    assert await store.get(keys.INDEX_FEATURES_KEY) == written  # untouched
    assert not collector.bundles_enabled
    clock.advance(HEARTBEAT_S)
    await collector.refresh()
    assert collector.bundles_enabled


async def test_the_dry_run_names_every_blocker_and_writes_nothing(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    await old_entry(store, clock, keys.version_entry_key("chaos", "a"))
    await log_segment(store, clock, "w-1", age_s=5)
    await context(store, clock, owner="reconciler-b")
    result = await enable(store, clock, dry_run=True)
    assert len(result.blocking) == 3 and await features(store) is None


async def test_an_unknown_feature_stops_the_command(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    record = {"schema": "lightmetrics.features.v1", "written_by": "x", "written_at_unix_ns": 1}
    await store.put(keys.INDEX_FEATURES_KEY, json.dumps({**record, "later": True}).encode())
    with pytest.raises(UnknownFeature):
        await enable(store, clock)


def test_the_reconciler_refuses_to_start_on_an_unknown_feature(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in cli_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    target = tmp_path / keys.INDEX_FEATURES_KEY
    target.parent.mkdir(parents=True)
    record = {"schema": "lightmetrics.features.v1", "written_by": "x", "written_at_unix_ns": 1}
    target.write_text(json.dumps({**record, "bundles": True, "zstd_frames": True}))
    assert cli.main(["run", "--once"]) == cli.EXIT_FAILED
    error = capsys.readouterr().err
    assert "refusing to start" in error and "'zstd_frames'" in error
    assert keys.INDEX_FEATURES_KEY in error
    assert not (tmp_path / keys.RECONCILER_LEASE_KEY).exists()  # no lease was taken


@pytest.mark.skipif(sys.platform != "linux", reason="fs store paths")
def test_enable_bundles_through_the_console_entry(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    segment = tmp_path / keys.index_log_segment_key(2**62, "c-9", 1)  # a writer of 2116
    segment.parent.mkdir(parents=True)
    segment.write_bytes(b"segment")
    refused = run_cli("enable-bundles", env=env)
    assert refused.returncode == 1, refused.stderr
    assert "blocking: index log writer 'c-9'" in refused.stderr
    segment.unlink()
    done = run_cli("enable-bundles", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["written"] is True
    assert FeatureRecord.from_json((tmp_path / keys.INDEX_FEATURES_KEY).read_bytes()).bundles


async def test_a_record_with_bundles_off_is_replaced_on_its_etag(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    record = {"schema": "lightmetrics.features.v1", "written_by": "x", "written_at_unix_ns": 1}
    await store.put(keys.INDEX_FEATURES_KEY, json.dumps({**record, "note": "kept"}).encode())
    assert (await enable(store, clock)).written
    body, _etag = await store.get(keys.INDEX_FEATURES_KEY)
    assert json.loads(body)["note"] == "kept" and FeatureRecord.from_json(body).bundles
