"""``lm-reconciler status`` shows bundles' listed, dead and pinned bytes from the last
completed audit (`reconciler.bundle_status`, PROTOCOL §3.10), and nothing about bundles
before an audit listed one."""

from __future__ import annotations

from protocol import bundle as bd
from protocol.clock import ManualClock
from reconciler.audit.run import run_full_audit
from reconciler.bundle_status import bundle_bytes, bundle_line
from reconciler.status import gather_status
from store.memory import MemoryStore
from tests.reconciler.conftest import context
from tests.reconciler.test_gc_bundles import FRAMES, manifest_of


async def test_status_shows_the_dead_bytes_of_bundles_from_the_last_audit(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    assert "bundle bytes" not in (await gather_status(memory_store, clock, lookback_s=300)).render()
    bundle = bd.encode_bundle(FRAMES)
    await memory_store.put(bundle.key, bundle.data)
    # Frames 0 and 1 accepted in the bundle; frame 2 accepted elsewhere: its bytes, the
    # index and the footer are dead.
    for i in (0, 1):
        manifest = manifest_of(FRAMES[i], bundle=bundle, i=i)
        await memory_store.put(manifest.manifest_key, manifest.to_json())
    ctx = await context(memory_store, clock)
    record = await run_full_audit(ctx)
    assert record.status == "completed" and record.bundles_listed == 1
    dead = len(bundle.data) - bundle.entries[0].length - bundle.entries[1].length
    status = await gather_status(memory_store, clock, lookback_s=300)
    shown = status.to_json()["bundle_bytes"]
    assert shown["bundles"] == 1 and shown["bytes"] == len(bundle.data)
    assert shown["dead_bytes"] == dead
    assert shown["pinned_bytes"] in (None, 0)  # nothing retired
    assert f"bundle bytes    1 bundles, {len(bundle.data) / 2**20:.1f} MiB listed" in (
        status.render()
    )


def test_the_line_says_what_an_older_audit_did_not_record() -> None:
    line = bundle_line(
        {
            "audit_id": "ab" * 8,
            "bundles": 2,
            "bytes": 3 << 20,
            "dead_bytes": 1 << 20,
            "pinned_bytes": None,
        }
    )
    assert line == f"2 bundles, 3.0 MiB listed, 1.0 MiB dead, - pinned (audit {'ab' * 8})"
    assert bundle_bytes(None) is None
