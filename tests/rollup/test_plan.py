"""`rollup.plan.make_plan`: what a rollup run must include (no Spark needed)."""

from __future__ import annotations

import uuid

from protocol import derived, keys
from protocol.clock import ManualClock
from protocol.records import AcceptedManifest, IndexEntry
from rollup.plan import make_plan
from store.memory import MemoryStore

HOUR_NS = 3600 * keys.NS_PER_S
T0_NS = 1_760_000_000_000_000_000  # 2025-10-09T08:53:20Z


def manifest(seq: int, accepted_at_ns: int) -> AcceptedManifest:
    sha = f"{seq:064x}"
    return AcceptedManifest(
        agent_id="agent-plan",
        boot_id=str(uuid.UUID(int=1)),
        seq_start=seq,
        seq_end=seq,
        record_count=1,
        frame_sha256=sha,
        frame_bytes=100,
        raw_blob_key=keys.raw_blob_key(sha),
        accepted_at_unix_ns=accepted_at_ns,
        collector_id="collector-plan",
    )


async def test_an_entry_filed_under_another_hour_is_reported_not_counted() -> None:
    store = MemoryStore(clock=ManualClock(T0_NS))
    filed_right, misfiled = manifest(1, T0_NS), manifest(2, T0_NS)
    for accepted in (filed_right, misfiled):
        await store.put(accepted.manifest_key, accepted.to_json(), if_none_match=True)
    for entry in derived.manifest_backfill(filed_right):
        await store.put(entry.key, entry.body, if_none_match=True)
    hour = keys.UtcHour.from_unix_ns(T0_NS)
    wrong_hour = keys.UtcHour.from_unix_ns(T0_NS + HOUR_NS)
    misfiled_entry = IndexEntry(
        kind="accepted-by-time",
        source_key=misfiled.manifest_key,
        frame_sha256=misfiled.frame_sha256,
        indexed_time_unix_ns=T0_NS + HOUR_NS,
    )
    await store.put(
        keys.accepted_by_time_key(wrong_hour, misfiled.identity), misfiled_entry.to_json()
    )

    plan = await make_plan(store, None)

    assert [(item.manifest_id, item.accepted_hour) for item in plan.items] == [
        (filed_right.identity.manifest_id, hour.iso)
    ]
    [skipped] = plan.skipped
    assert skipped.manifest_key == misfiled.manifest_key
    assert skipped.reason == (
        f"indexed under hour {wrong_hour.iso}, but the manifest was accepted in {hour.iso}"
    )
