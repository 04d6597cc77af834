"""The GC's proofs of issue 22 (PROTOCOL §3.5): rule 7's targeted proof, rule 2's read of
the catalog files created since the rule-5 audit started (``index/v1/catalog-created/``),
and the GC log written before the marks go. Each case is one the orphan file alone would
get wrong: a record created after the audit started whose log row was lost (a collector
that crashed after its create), so neither the catalog nor the steady pass knows it.

With the quarantine LIST of rule 7 left out of `reconciler.gc.proof`, the first test fails
(the blob is deleted while a quarantine record names it); with the manifest check left
out, the second does (checked by hand, see the report of issue 22).
"""

from __future__ import annotations

import uuid

from index.rows import IndexRow, accepted_row
from protocol import keys, records
from reconciler.log_retention import trim_catalog_created
from store.errors import Unavailable
from tests.reconciler.conftest import conflict_of
from tests.reconciler.test_gc import HOUR_S, POLICY, FlakyStore, World, frame_bytes, header_of, sha


async def marked_orphan(world: World, body: bytes) -> str:
    """An unlogged orphan blob, past the horizon, nominated by a scheduled audit and marked."""
    digest = await world.orphan(body, logged=False)
    world.clock.advance(3 * HOUR_S)
    outcome = await world.gc(audit=True)
    assert outcome.record.marked == 1
    return digest


async def test_a_quarantine_record_created_after_the_audit_keeps_its_blob() -> None:
    world = World()
    accepted = await world.accept(frame_bytes(1, seq=50))
    twin = frame_bytes(2, seq=50)  # a conflicting frame of the same identity, left as an orphan
    digest = await marked_orphan(world, twin)
    # A collector that read no mark (before the GC made it) quarantined the twin, then
    # crashed before its log row was flushed: no catalog row, no veto.
    conflict = conflict_of(
        accepted.manifest,
        sha(twin),
        observed_at_unix_ns=world.clock.now_ns(),
        collector_id="crashed",
    )
    await world.store.put(conflict.quarantine_key, conflict.to_json(), if_none_match=True)
    world.clock.advance(POLICY.mark_grace_s + 1)
    outcome = await world.gc()
    assert outcome.deleted == [] and await world.exists(keys.raw_blob_key(digest))
    assert not await world.exists(keys.gc_mark_key(digest))  # referenced: withdrawn


async def test_a_manifest_created_after_the_audit_keeps_its_blob() -> None:
    world = World()
    body = frame_bytes(3)
    digest = await marked_orphan(world, body)
    # The manifest of an earlier attempt landed late (its answer was lost) and the
    # collector crashed before logging it: only the manifest itself says so.
    manifest = records.AcceptedManifest.of_frame(
        body, accepted_at_unix_ns=world.clock.now_ns(), collector_id="crashed"
    )
    await world.store.put(manifest.manifest_key, manifest.to_json(), if_none_match=True)
    world.clock.advance(POLICY.mark_grace_s + 1)
    assert (await world.gc()).deleted == []
    assert await world.exists(keys.raw_blob_key(digest))
    assert not await world.exists(keys.gc_mark_key(digest))


async def test_an_unreadable_quarantine_record_fails_the_proof_and_keeps_the_mark() -> None:
    world = World()
    body = frame_bytes(4)
    digest = await marked_orphan(world, body)
    identity = keys.BatchIdentity("agent-a", header_of(body).boot_id, 4, 4)
    broken = keys.quarantine_key(identity, "ab" * 32)
    await world.store.put(broken, b"{not json")
    world.clock.advance(POLICY.mark_grace_s + 1)
    assert (await world.gc()).deleted == []
    assert await world.exists(keys.raw_blob_key(digest))
    assert await world.exists(keys.gc_mark_key(digest))  # proven again once it is fixed
    assert await world.exists(keys.problem_key("unparseable-quarantine", broken))


async def test_a_blob_that_fails_its_hash_or_crc_is_never_deleted() -> None:
    world = World()
    corrupt = bytearray(frame_bytes(5))
    corrupt[-1] ^= 0xFF  # the CRC no longer matches; the blob is named by this content
    digest = await marked_orphan(world, bytes(corrupt))
    world.clock.advance(POLICY.mark_grace_s + 1)
    assert (await world.gc()).deleted == []
    assert await world.exists(keys.raw_blob_key(digest))
    assert await world.exists(keys.problem_key("corrupt-blob", keys.raw_blob_key(digest)))
    assert not await world.exists(keys.gc_mark_key(digest))


async def test_a_catalog_file_created_since_the_audit_that_names_the_blob_keeps_it() -> None:
    world = World()
    body = frame_bytes(6)
    digest = await marked_orphan(world, body)
    # A row cataloged after the audit started (here: by hand, under another identity,
    # so that only rule 2's read of catalog-created can see it).
    other = keys.BatchIdentity("agent-b", uuid.UUID(int=9), 1, 1)
    manifest = records.AcceptedManifest(
        agent_id=other.agent_id,
        boot_id=str(other.boot_id),
        seq_start=1,
        seq_end=1,
        record_count=1,
        frame_sha256=digest,
        frame_bytes=len(body),
        raw_blob_key=keys.raw_blob_key(digest),
        accepted_at_unix_ns=world.clock.now_ns(),
        collector_id="c",
    )
    row: IndexRow = accepted_row(manifest)
    ctx = await world.ctx()
    await ctx.catalog_writer.write(row.hour, [row], writer="steady")
    world.clock.advance(POLICY.mark_grace_s + 1)
    assert (await world.gc()).deleted == []
    assert await world.exists(keys.raw_blob_key(digest))
    assert not await world.exists(keys.gc_mark_key(digest))


async def test_a_vanished_catalog_file_since_the_audit_stops_every_deletion() -> None:
    world = World()
    digest = await marked_orphan(world, frame_bytes(7))
    accepted = await world.accept(frame_bytes(8))
    await world.gc()  # the steady pass catalogs the new batch: a file created since the audit
    entries = await world.keys_under(keys.INDEX_CATALOG_CREATED_PREFIX)
    named = records.CatalogCreated.from_json((await world.store.get(entries[-1]))[0])
    assert named.catalog_key.startswith(keys.INDEX_CATALOG_PREFIX)
    await world.store.delete(named.catalog_key)  # gone, and no merged file names it
    world.clock.advance(POLICY.mark_grace_s + 1)
    assert (await world.gc()).deleted == []
    assert await world.exists(keys.gc_mark_key(digest))  # nothing decided: kept for later
    assert await world.exists(accepted.manifest.raw_blob_key)


async def test_every_catalog_file_has_an_entry_and_entries_go_once_no_audit_needs_them() -> None:
    world = World()
    await world.accept(frame_bytes(9))
    await world.gc()
    files = await world.keys_under(keys.INDEX_CATALOG_PREFIX)
    entries = await world.keys_under(keys.INDEX_CATALOG_CREATED_PREFIX)
    named = {
        records.CatalogCreated.from_json((await world.store.get(key))[0]).catalog_key
        for key in entries
    }
    assert files and named == set(files)
    audit = await world.audit()
    assert audit.catalog_created_from is not None
    # Entries before the audit's position are no longer needed: the lease holder's
    # housekeeping deletes them (the GC run does not).
    await world.gc()
    assert set(entries) <= set(await world.keys_under(keys.INDEX_CATALOG_CREATED_PREFIX))
    await trim_catalog_created(await world.ctx())
    left = await world.keys_under(keys.INDEX_CATALOG_CREATED_PREFIX)
    assert all(
        key >= keys.INDEX_CATALOG_CREATED_PREFIX + audit.catalog_created_from for key in left
    )
    assert not set(entries) & set(left)


async def test_the_gc_log_is_written_before_the_marks_of_its_deletions_go() -> None:
    world = World()
    digest = await marked_orphan(world, frame_bytes(10))
    world.clock.advance(POLICY.mark_grace_s + 1)
    store: FlakyStore = world.store  # type: ignore[assignment]

    async def failing_put(key: str, body: bytes, **kwargs: object) -> str:
        if key.startswith(keys.GC_LOG_PREFIX):
            raise Unavailable("put", key, "503 SlowDown (scripted)")
        return await FlakyStore.put(store, key, body, **kwargs)  # type: ignore[arg-type]

    store.put = failing_put  # type: ignore[method-assign]
    outcome = await world.gc()
    assert outcome.deleted == [digest] and not await world.exists(keys.raw_blob_key(digest))
    assert await world.keys_under(keys.GC_LOG_PREFIX) == []
    mark = records.GcMark.from_json((await world.store.get(keys.gc_mark_key(digest)))[0])
    assert mark.state == "deleting"  # unlogged: the mark stays, and says what happened
    del store.put  # type: ignore[method-assign]
    assert mark.lease_expires_at_unix_ns is not None
    world.clock.advance((mark.lease_expires_at_unix_ns - world.clock.now_ns()) / 1e9 + 61)
    await world.gc()  # the stale-deletion pass finds the blob gone: logged, then unmarked
    assert [entry.frame_sha256 for entry in await world.gc_log()] == [digest]
    assert not await world.exists(keys.gc_mark_key(digest))


async def test_files_compacted_twice_since_the_audit_do_not_stop_deletions() -> None:
    from index.catalog import delete_compacted_inputs, list_hour_files
    from index.catalog_merge import merge_files

    world = World()
    digest = await marked_orphan(world, frame_bytes(11))
    ctx = await world.ctx()
    batches = [await world.accept(frame_bytes(20 + n)) for n in range(3)]
    rows = [accepted_row(b.manifest) for b in batches]
    hour = rows[0].hour
    for row in rows[:2]:
        await ctx.catalog_writer.write(hour, [row], writer="steady")
    for extra in ([], [rows[2]]):  # merged once, then the merged file merged again
        for row in extra:
            await ctx.catalog_writer.write(hour, [row], writer="steady")
        files = await list_hour_files(world.store, hour)
        await merge_files(world.store, ctx.catalog_writer, hour, files, level=1)
        await delete_compacted_inputs(
            world.store, hour, store_now_ns=world.clock.now_ns(), grace_s=0
        )
    assert len(await world.keys_under(keys.index_catalog_hour_prefix(hour))) == 1
    world.clock.advance(POLICY.mark_grace_s + 1)
    assert (await world.gc()).deleted == [digest]  # every vanished file is covered
