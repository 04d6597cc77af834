"""`collector.query.window.live_part`: the window's batches a query counts as live leave
out those the snapshot's ledger holds and those it retracted (``ledger.retracted``),
matched by accepted hour, ``manifest_id`` and frame digest. (End to end, through a
designated collector with a 4 h window: tests.rollup.test_retraction_live_query.)"""

from __future__ import annotations

from collector.query.window import LiveWindow, live_part
from rollup.table.ledger_retracted import RetractedBatch
from rollup.table.manifest import Snapshot
from tests.collector.promql.read_world import B1, B2, B3, H0, NS


def test_a_retracted_batch_is_not_live_and_a_new_record_of_its_key_is() -> None:
    now = H0.start_ns + 3 * 3600 * NS
    window = LiveWindow(window_s=4 * 3600, max_points=1000, max_bytes=1 << 30)
    phantom, other, plain = B1, B2, B3
    for sent, accepted, digest in (
        (phantom, H0.start_ns + 60 * NS, "a" * 64),
        (other, H0.start_ns + 120 * NS, "b" * 64),
        (plain, H0.start_ns + 180 * NS, ""),  # held without a digest: never matched
    ):
        assert window.add(sent.manifest_id, accepted, sent.frame, now_ns=now, frame_sha256=digest)
    retracted = RetractedBatch(
        manifest_id=phantom.manifest_id,
        frame_sha256="a" * 64,
        record_count=5,
        accepted_hour=H0.iso,
        added_version=2,
    )
    snapshot = Snapshot(2, None, "2026-11-21T13:00:00Z", 1, "c", {}, ledger_retracted=(retracted,))
    held = window.batches()
    assert [b.manifest_id for b in live_part(held, set(), None)] == [
        phantom.manifest_id,
        other.manifest_id,
        plain.manifest_id,
    ]
    found = live_part(held, {other.manifest_id}, snapshot)
    assert [b.manifest_id for b in found] == [plain.manifest_id]
    # The same key recorded again with other bytes, or in another hour, is a new record.
    for digest, accepted in (
        ("c" * 64, H0.start_ns + 60 * NS),
        ("a" * 64, H0.start_ns + 3700 * NS),
    ):
        again = LiveWindow(window_s=4 * 3600, max_points=1000, max_bytes=1 << 30)
        again.add(phantom.manifest_id, accepted, phantom.frame, now_ns=now, frame_sha256=digest)
        assert len(live_part(again.batches(), set(), snapshot)) == 1
