"""The chaos auditor joins records to raw objects by raw key (PROTOCOL §3.10): bundled
manifests are checked against their bundle's frames, a deleted or damaged bundle is a
violation for every record naming it, and a GC deletion of a named bundle is one."""

from __future__ import annotations

import hashlib

from chaos.auditor import audit, gc_coverage, store_counts
from chaos.load import FrameFacts
from protocol import keys, records
from protocol.bundle import encode_bundle
from reconciler.gc.log import encode_gc_log
from tests.chaos.test_auditor import World, failed
from tests.protocol.frame_vectors import spec_frame


def frame(seq: int) -> bytes:
    return spec_frame(payload=f"bundled payload {seq}".encode() * 4, seq_start=seq)


async def bundled(world: World, seqs: list[int]) -> tuple[str, list[records.AcceptedManifest]]:
    """Frames ``seqs`` written as one bundle, each acknowledged with a manifest naming
    its range (as a collector with group commit does)."""
    frames = [frame(seq) for seq in seqs]
    encoded = encode_bundle(frames)
    await world.store.put(encoded.key, encoded.data)
    manifests = []
    for body, entry in zip(frames, encoded.entries, strict=True):
        manifest = records.AcceptedManifest.of_frame(
            body,
            accepted_at_unix_ns=world.clock.now_ns(),
            collector_id="collector-audit",
            bundle=(encoded.key, entry.offset),
        )
        await world.store.put(manifest.manifest_key, manifest.to_json())
        world.book.frames[manifest.frame_sha256] = FrameFacts(1, 1.0)
        world.ack(manifest.identity, manifest.frame_sha256)
        world.manifests.append(manifest)
        manifests.append(manifest)
    return encoded.key, manifests


async def test_frame_blobs_and_bundles_in_one_store_pass_every_check() -> None:
    world = World()
    await world.accepted(1)
    await world.accepted(2)
    await bundled(world, [10, 11, 12])
    results = await world.checks()
    assert failed(results) == set()
    assert "3 referenced raw objects (1 bundles)" in results["no_referenced_blob_deleted"].detail
    view, _ = await audit(world.store, world.book, [])
    counts = store_counts(view)
    assert (counts["raw_blobs"], counts["raw_bundles"], counts["bundled_manifests"]) == (2, 1, 3)


async def test_a_deleted_bundle_is_a_violation_for_every_record_naming_it() -> None:
    world = World()
    await world.accepted(1)
    key, _ = await bundled(world, [10, 11])
    await world.store.delete(key)
    results = await world.checks(reconcile=False)
    assert results["acks_have_manifests"].violation_count == 2
    assert results["no_referenced_blob_deleted"].violation_count == 2
    assert all("missing" in v for v in results["no_referenced_blob_deleted"].violations)


async def test_a_range_holding_another_frame_is_bad_range_unless_the_index_has_it() -> None:
    world = World()
    key, manifests = await bundled(world, [10, 11])
    first, second = manifests
    # The first manifest's range moved onto the second frame: the bundle's index still
    # locates its frame, so the frame is there (read through index.raw_reads).
    moved = first.model_copy(update={"raw_offset": second.raw_offset})
    await world.store.put(first.manifest_key, moved.to_json())
    results = await world.checks(reconcile=False)
    assert failed(results) == {"catalog_complete"}  # not reconciled here: no catalog
    # A bundle of the second frame alone, under the first's key: no entry of its hash.
    alone = encode_bundle([frame(11)])
    await world.store.put(key, alone.data)
    results = await world.checks(reconcile=False)
    problems = results["no_referenced_blob_deleted"].violations
    assert any("bad-range" in p and first.manifest_key in p for p in problems), problems


async def test_a_gc_deletion_of_a_named_bundle_is_a_violation_by_its_key() -> None:
    world = World()
    key, _ = await bundled(world, [10, 11])
    world.clock.advance(60.0)
    entry = records.GcLogEntry(
        frame_sha256=keys.parse_raw_bundle_key(key),
        raw_blob_key=key,
        blob_last_modified_ns=0,
        marked_at_unix_ns=0,
        audit_started_at_unix_ns=0,
        deleted_at_unix_ns=world.clock.now_ns(),
        gc_run_id="0123456789abcdef",
    )
    await world.store.put(f"{keys.GC_LOG_PREFIX}test.arrow", encode_gc_log([entry]))
    results = await world.checks(reconcile=False)
    assert results["no_referenced_blob_deleted"].violation_count == 2  # one per manifest
    assert all(key in v for v in results["no_referenced_blob_deleted"].violations)


async def test_gc_coverage_goes_by_raw_key() -> None:
    world = World()
    await bundled(world, [10])
    orphan = frame(99)
    sha = hashlib.sha256(orphan).hexdigest()
    world.book.planted[sha] = 0
    view, _ = await audit(world.store, world.book, [])
    coverage = gc_coverage(view, world.book, now_ns=world.clock.now_ns() + 10**12, horizon_s=1)
    assert coverage == {"planted_orphans_past_horizon": 1, "planted_orphans_deleted": 1}


async def test_a_catalog_row_naming_another_range_than_its_record_is_a_violation() -> None:
    world = World()
    _, (first, second) = await bundled(world, [10, 11])
    await world.reconcile()
    moved = first.model_copy(update={"raw_offset": second.raw_offset})
    await world.store.put(first.manifest_key, moved.to_json())  # the catalog keeps the first
    results = await world.checks(reconcile=False)
    assert failed(results) == {"catalog_complete"}
    (problem,) = results["catalog_complete"].violations
    assert f"[{first.raw_offset}, +{first.raw_length})" in problem
