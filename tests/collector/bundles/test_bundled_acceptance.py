"""Group commit through the acceptor (PROTOCOL §3.10 "Writing"): the gate, a quiet
collector, frames sharing a bundle, what their manifests and log rows name, and who is
not bundled."""

from __future__ import annotations

import asyncio

from collector.accept import Accepted
from collector.bundles.acceptance import InFlightBytes
from collector.bundles.bundler import BundleLimits
from collector.in_flight import InFlight
from collector.intake import HttpLimits
from collector.metrics import CollectorMetrics
from protocol import keys
from protocol.bundle import check_bundle, read_frame
from tests.collector.bundles.harness import BundleHarness, frame_sha, frames, wait_until
from tests.collector.conftest import make_frame


async def logged(harness: BundleHarness) -> list[tuple[str, str]]:
    """(kind, key) of the buffered index log rows."""
    return [(row.kind, row.key) for row in harness.index_log._buffer]


async def test_with_the_gate_off_a_batch_is_two_puts_and_a_frame_blob() -> None:
    harness = BundleHarness(enabled=False)
    for frame in frames(3):
        result = await harness.accept(frame)
        assert isinstance(result, Accepted) and result.store_ops == 2
        assert (await harness.manifest(frame)).raw_range is None
    assert harness.op_names() == ["put_raw_blob", "put_manifest"] * 3
    assert harness.raw_puts == []  # the bundler was never asked
    assert [info.key async for info in harness.memory.list(keys.RAW_BUNDLES_PREFIX)] == []


async def test_a_quiet_collector_with_the_gate_on_writes_frame_blobs_as_before() -> None:
    harness = BundleHarness()
    for frame in frames(3):
        result = await harness.accept(frame)
        assert isinstance(result, Accepted) and result.store_ops == 2
        manifest = await harness.manifest(frame)
        assert manifest.raw_blob_key == keys.raw_blob_key(frame_sha(frame))
        assert manifest.raw_range is None
    assert harness.op_names() == ["put_raw_blob", "put_manifest"] * 3
    assert harness.raw_puts == [1, 1, 1]


async def test_frames_arriving_while_the_slot_is_busy_share_one_bundle() -> None:
    harness = BundleHarness()
    first, *rest = frames(4)
    answers = await harness.held_then_bundled(first, rest)
    assert all(isinstance(a, Accepted) and not a.duplicate for a in answers)
    assert harness.raw_puts == [1, 3]
    assert harness.op_names().count("put_raw_bundle") == 1
    assert harness.op_names().count("put_manifest") == 4
    bundles = [info.key async for info in harness.memory.list(keys.RAW_BUNDLES_PREFIX)]
    assert len(bundles) == 1
    data, _ = await harness.memory.get(bundles[0])
    checked = check_bundle(data, sha256=keys.parse_raw_bundle_key(bundles[0]))
    assert [f.entry.frame_sha256 for f in checked.frames] == [frame_sha(f) for f in rest]
    for frame in rest:
        manifest = await harness.manifest(frame)
        assert manifest.raw_blob_key == bundles[0]
        assert manifest.raw_range is not None and manifest.raw_length == len(frame)
        offset, length = manifest.raw_range
        got = read_frame(
            data, offset, length, frame_sha256=manifest.frame_sha256, max_frame_bytes=1 << 20
        )
        assert bytes(got) == frame
    first_manifest = await harness.manifest(first)
    assert first_manifest.raw_blob_key == keys.raw_blob_key(frame_sha(first))
    rows = await logged(harness)
    # the bundle's blob row (key = the bundle) before any of its frames' accepted rows
    assert ("blob", bundles[0]) in rows
    bundle_row = rows.index(("blob", bundles[0]))
    for frame in rest:
        key = (await harness.manifest(frame)).manifest_key
        assert rows.index(("accepted", key)) > bundle_row
    accepted = [r for r in harness.index_log._buffer if r.kind == "accepted"]
    assert {r.raw_blob_key for r in accepted} == {bundles[0], keys.raw_blob_key(frame_sha(first))}


async def test_resends_and_frames_older_than_points_retention_are_not_bundled() -> None:
    day_s = 86_400.0
    harness = BundleHarness(points_retention_s=day_s)
    now_ns = harness.clock.now_ns()
    old = (now_ns - int(2 * day_s * 1e9), now_ns - int(1.5 * day_s * 1e9))
    first, resent, aged = frames(3)
    harness.memory.held = True
    harness.memory.hold_only = keys.raw_blob_key(frame_sha(first))
    held = asyncio.create_task(harness.accept(first))
    await wait_until(harness.bundler_busy)
    # Neither waits for the busy slot: each writes its own frame blob at once.
    assert isinstance(await harness.accept(resent, resend=True), Accepted)
    assert isinstance(await harness.accept(aged, ts_range=old), Accepted)
    harness.memory.release.set()
    assert isinstance(await held, Accepted)
    for frame in (resent, aged):
        assert (await harness.manifest(frame)).raw_range is None
    assert harness.raw_puts == [1]


async def test_a_single_frame_left_in_the_open_bundle_is_a_frame_blob() -> None:
    harness = BundleHarness(limits=BundleLimits(max_in_flight=1, send_margin_s=1.0))
    first, second = frames(2)
    answers = await harness.held_then_bundled(first, [second])
    assert all(isinstance(a, Accepted) for a in answers)
    assert harness.raw_puts == [1, 1]
    assert (await harness.manifest(second)).raw_blob_key == keys.raw_blob_key(frame_sha(second))


async def test_frames_of_other_agents_share_a_bundle_too() -> None:
    harness = BundleHarness()
    mixed = [make_frame(f"agent-{i}", seq_start=1) for i in range(3)]
    answers = await harness.held_then_bundled(frames(1)[0], mixed)
    assert all(isinstance(a, Accepted) for a in answers)
    keys_named = {(await harness.manifest(f)).raw_blob_key for f in mixed}
    assert len(keys_named) == 1 and next(iter(keys_named)).startswith(keys.RAW_BUNDLES_PREFIX)


def test_bundle_bytes_are_charged_to_the_workers_in_flight_bytes() -> None:
    metrics = CollectorMetrics()
    in_flight = InFlight(
        requests_gauge=metrics.in_flight_requests, bytes_gauge=metrics.in_flight_bytes
    )
    limits = HttpLimits(max_in_flight_bytes=1000).intake()
    assert in_flight.try_reserve(2, 100, limits, always_if_alone=False)  # two requests
    account = InFlightBytes(in_flight, limits)
    assert account.try_charge(800)
    assert not account.try_charge(200)  # past http.max_in_flight_bytes: 429
    account.release(800)
    assert in_flight.bytes == 100
