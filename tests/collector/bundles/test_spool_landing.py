"""Spool mode lands in bundles (PROTOCOL §3.10, §3.4): one frame per identity per bundle,
manifests created one after another in acknowledgement order (the frame answered 200 is
the accepted one), each within the send window of its bundle's write, else the frame
stays spooled and restarts at step 1."""

from __future__ import annotations

import asyncio
from pathlib import Path

from collector.local_spool.lander import SpoolLander
from collector.local_spool.spool import LocalSpool
from protocol import keys, records
from protocol.frame import decode_header
from tests.collector.bundles.harness import BundleHarness, frame_sha, frames

WINDOW_S = 20.0  # gc.mark_grace_s less the settle margin: 20 frames a bundle at a 1 s budget


def spool_in(directory: Path) -> LocalSpool:
    return LocalSpool(directory, max_pending_bytes=1 << 24, retry_horizon_s=3600.0, max_landed=100)


def lander(harness: BundleHarness, spool: LocalSpool, window_s: float = WINDOW_S) -> SpoolLander:
    return SpoolLander(
        spool=spool,
        acceptor=harness.acceptor,
        store=harness.store,  # type: ignore[arg-type]
        clock=harness.clock,
        interval_s=1.0,
        send_window_s=window_s,
    )


async def spooled(spool: LocalSpool, *bodies: bytes) -> None:
    for body in bodies:
        h = decode_header(body)
        identity = keys.BatchIdentity(h.agent_id, h.boot_id, h.seq_start, h.seq_end)
        await spool.add(identity, frame_sha(body), body)


async def test_a_round_lands_its_frames_as_one_bundle_in_acknowledgement_order(
    tmp_path: Path,
) -> None:
    harness = BundleHarness(budget_s=1.0)
    spool = spool_in(tmp_path)
    bodies = frames(5)
    await spooled(spool, *bodies)
    report = await lander(harness, spool).land_once()
    assert report.landed == 5 and spool.frames == 0
    (bundle,) = [info.key async for info in harness.memory.list(keys.RAW_BUNDLES_PREFIX)]
    manifests = [await harness.manifest(body) for body in bodies]
    assert {m.raw_blob_key for m in manifests} == {bundle}
    assert [m.raw_offset for m in manifests] == sorted(m.raw_offset or 0 for m in manifests)
    names = harness.op_names()
    assert names.count("put_raw_bundle") == 1 and names.count("put_manifest") == 5
    assert harness.raw_puts == [5]


async def test_two_frames_of_one_identity_land_in_two_bundles_the_first_accepted(
    tmp_path: Path,
) -> None:
    harness = BundleHarness(budget_s=1.0)
    spool = spool_in(tmp_path)
    a, x, y, z = frames(4)
    b = frames(1, value=5.0)[0]  # the identity of `a`, other bytes: answered 409 at intake
    await spooled(spool, a, x, b, y, z)
    report = await lander(harness, spool).land_once()
    assert report.landed == 4 and report.conflicts == 1 and spool.frames == 0
    manifest = await harness.manifest(a)
    assert manifest.frame_sha256 == frame_sha(a)  # the frame acknowledged first
    quarantine = keys.quarantine_key(manifest.identity, frame_sha(b))
    record = records.IdentityConflict.from_json((await harness.memory.get(quarantine))[0])
    assert record.submitted_raw_blob_key == keys.raw_blob_key(frame_sha(b))
    assert record.accepted_raw_blob_key == keys.raw_blob_key(frame_sha(a))
    assert (await harness.manifest(y)).raw_blob_key == (await harness.manifest(z)).raw_blob_key
    assert harness.raw_puts == [2, 3]  # [a, x], then [b, y, z]


async def test_a_create_past_the_send_window_is_not_sent_and_restarts_at_step_one(
    tmp_path: Path,
) -> None:
    harness = BundleHarness(budget_s=1.0)
    spool = spool_in(tmp_path)
    first, second = frames(2)
    await spooled(spool, first, second)
    slow_key = await manifest_key_of(first)
    inner_put = harness.memory.inner.put

    async def slow_first_create(key: str, body: bytes, **conditions: object) -> str:
        if key == slow_key:
            harness.clock.advance(3.0)  # the first create ends past the 2 s window
        return await inner_put(key, body, **conditions)  # type: ignore[arg-type]

    harness.memory.inner.put = slow_first_create  # type: ignore[method-assign]
    report = await lander(harness, spool, window_s=2.0).land_once()
    assert report.landed == 1 and report.deferred == 1 and spool.frames == 1
    assert harness.op_names().count("put_manifest") == 1  # the second was never sent
    report = await lander(harness, spool, window_s=2.0).land_once()
    assert report.landed == 1 and spool.frames == 0
    manifest = await harness.manifest(second)
    assert manifest.raw_blob_key == keys.raw_blob_key(frame_sha(second))  # alone: a blob


async def test_with_the_gate_off_spooled_frames_land_as_frame_blobs(tmp_path: Path) -> None:
    harness = BundleHarness(enabled=False, budget_s=1.0)
    spool = spool_in(tmp_path)
    bodies = frames(3)
    await spooled(spool, *bodies)
    report = await lander(harness, spool).land_once()
    assert report.landed == 3
    assert harness.op_names() == ["put_raw_blob", "put_manifest"] * 3


async def manifest_key_of(body: bytes) -> str:
    h = decode_header(body)
    return keys.accepted_manifest_key(
        keys.BatchIdentity(h.agent_id, h.boot_id, h.seq_start, h.seq_end)
    )


async def test_a_quarantine_head_that_never_answers_ends_within_the_budget(
    tmp_path: Path,
) -> None:
    """The HEAD that confirms a conflict's record is bounded by the request budget: the
    conflicting frame stays spooled (deferred) and the round goes on."""
    harness = BundleHarness(budget_s=0.2)
    spool = spool_in(tmp_path)
    a, x = frames(2)
    b = frames(1, value=5.0)[0]  # the identity of `a`, other bytes
    await spooled(spool, a, x, b)

    async def never_answers(key: str) -> object:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    harness.memory.head = never_answers  # type: ignore[method-assign]
    async with asyncio.timeout(10):  # the old code hangs here
        report = await lander(harness, spool).land_once()
    assert report.landed == 2 and report.deferred == 1 and report.conflicts == 0
    assert spool.frames == 1  # `b`: its record is written, but no HEAD saw it yet
    quarantine = keys.quarantine_key((await harness.manifest(a)).identity, frame_sha(b))
    assert await harness.memory.get(quarantine)
