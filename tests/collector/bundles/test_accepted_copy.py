"""A conflict whose accepted frame lives in a bundle (PROTOCOL §3.10 "Records"): the
quarantine record names frame blobs only, so the accepted frame is copied to its frame
blob first; a bundle that is gone, or a range that does not hold the frame, makes the
record say ``accepted_blob_present: false``."""

from __future__ import annotations

from collector.accept import Accepted, IdentityConflictFound
from protocol import keys, records
from store.errors import NotFound
from tests.collector.bundles.harness import BundleHarness, frame_sha, frames


async def accepted_in_a_bundle(harness: BundleHarness) -> tuple[bytes, records.AcceptedManifest]:
    """A frame accepted as part of a bundle of three (after a held first frame)."""
    first, *rest = frames(4)
    answers = await harness.held_then_bundled(first, rest)
    assert all(isinstance(a, Accepted) for a in answers)
    manifest = await harness.manifest(rest[0])
    assert manifest.raw_range is not None
    return rest[0], manifest


async def conflict_on(
    harness: BundleHarness,
) -> tuple[IdentityConflictFound, records.IdentityConflict]:
    """Another frame of the identity of ``frames(4)[1]``, sent as a re-send (not bundled)."""
    other = frames(2, value=7.0)[1]
    result = await harness.accept(other, resend=True)
    assert isinstance(result, IdentityConflictFound)
    body, _ = await harness.memory.get(result.quarantine_key)
    return result, records.IdentityConflict.from_json(body)


async def test_the_accepted_frame_is_copied_to_its_frame_blob_before_the_record() -> None:
    harness = BundleHarness()
    frame, manifest = await accepted_in_a_bundle(harness)
    harness.ops.clear()
    _result, record = await conflict_on(harness)
    sha = frame_sha(frame)
    assert record.accepted_raw_blob_key == keys.raw_blob_key(sha)  # never the bundle
    assert record.accepted_frame_sha256 == sha and record.accepted_blob_present
    assert (await harness.memory.get(keys.raw_blob_key(sha)))[0] == frame
    names = harness.op_names()
    assert names.index("get_raw_range") < names.index("put_quarantine")
    # the copy takes no mark or veto on the bundle
    bundle_sha = keys.parse_raw_bundle_key(manifest.raw_blob_key)
    for key in (keys.gc_mark_key(bundle_sha), keys.gc_veto_key(bundle_sha)):
        assert not await present(harness, key)
    blob_rows = [r.key for r in harness.index_log._buffer if r.kind == "blob"]
    assert keys.raw_blob_key(sha) in blob_rows


async def test_a_copy_already_there_goes_through_the_collector_side_of_that_frame_blob() -> None:
    harness = BundleHarness()
    frame, _manifest = await accepted_in_a_bundle(harness)
    sha = frame_sha(frame)
    await harness.memory.put(keys.raw_blob_key(sha), frame)
    mark = records.GcMark(
        frame_sha256=sha, raw_blob_key=keys.raw_blob_key(sha), marked_at_unix_ns=1, gc_run_id="g"
    )
    await harness.memory.put(keys.gc_mark_key(sha), mark.to_json())
    _result, record = await conflict_on(harness)
    assert record.accepted_blob_present
    veto = records.GcVeto.from_json((await harness.memory.get(keys.gc_veto_key(sha)))[0])
    assert veto.frame_sha256 == sha


async def test_a_bundle_already_deleted_gives_accepted_blob_present_false() -> None:
    harness = BundleHarness()
    frame, manifest = await accepted_in_a_bundle(harness)
    await harness.memory.delete(manifest.raw_blob_key)
    _result, record = await conflict_on(harness)
    assert not record.accepted_blob_present
    assert record.accepted_raw_blob_key == keys.raw_blob_key(frame_sha(frame))
    assert not await present(harness, keys.raw_blob_key(frame_sha(frame)))


async def test_a_range_that_fails_its_checks_is_bad_range_and_not_present() -> None:
    harness = BundleHarness()
    frame, manifest = await accepted_in_a_bundle(harness)
    data, _ = await harness.memory.get(manifest.raw_blob_key)
    assert manifest.raw_offset is not None
    damaged = bytearray(data)
    damaged[manifest.raw_offset + 60] ^= 0xFF  # inside the frame: its CRC fails
    await harness.memory.put(manifest.raw_blob_key, bytes(damaged))
    _result, record = await conflict_on(harness)
    assert not record.accepted_blob_present
    assert not await present(harness, keys.raw_blob_key(frame_sha(frame)))


async def present(harness: BundleHarness, key: str) -> bool:
    try:
        await harness.memory.head(key)
    except NotFound:
        return False
    return True
