"""Compaction between audits never stalls the GC (PROTOCOL §3.5 rule 2, issue 31 item 1).

Compaction merges an hour's files and deletes the inputs after a grace; a GC run that
lists ``catalog-created/`` entries meets merged files and their gone inputs side by side,
in any order and in one concurrent group of reads. It reads every file it can first and
judges the gone ones after, and lists the entries again when a merge landed during its
run. Only a file gone and named by no merged file stalls it: a counted event (the
``stalled:<reason>`` observation, ``lm_reconciler_gc_stalled_total``) and the run
record's ``stalled``, which ``lm-reconciler status`` shows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from index.catalog import delete_compacted_inputs, list_hour_files
from index.catalog_merge import merge_files
from index.rows import accepted_row
from protocol import keys
from reconciler.gc.catalog_since import references_since
from reconciler.gc.run import latest_listing_audit
from reconciler.status import gather_status
from tests.reconciler.test_gc import POLICY, World, frame_bytes
from tests.reconciler.test_gc_proof import marked_orphan

CONCURRENT = dataclasses.replace(POLICY, concurrency=8)
FILES = 2 * CONCURRENT.concurrency + 3  # more than one concurrent group of reads


async def _files_of_one_hour(world: World, count: int) -> keys.UtcHour:
    ctx = await world.ctx()
    rows = [accepted_row((await world.accept(frame_bytes(100 + n))).manifest) for n in range(count)]
    for row in rows:
        await ctx.catalog_writer.write(rows[0].hour, [row], writer="steady")
    return rows[0].hour


async def _compact(world: World, hour: keys.UtcHour) -> str:
    ctx = await world.ctx()
    files = await list_hour_files(world.store, hour)
    merged = await merge_files(world.store, ctx.catalog_writer, hour, files, level=1)
    await delete_compacted_inputs(world.store, hour, store_now_ns=world.clock.now_ns(), grace_s=0)
    return merged.merged_key


async def test_a_merge_and_its_deleted_inputs_in_one_group_of_reads_do_not_stall_the_gc() -> None:
    world = World(CONCURRENT)
    digest = await marked_orphan(world, frame_bytes(11))
    hour = await _files_of_one_hour(world, FILES)
    await _compact(world, hour)
    assert len(await world.keys_under(keys.index_catalog_hour_prefix(hour))) == 1
    world.clock.advance(POLICY.mark_grace_s + 1)
    outcome = await world.gc()
    assert outcome.record.stalled is None
    assert outcome.deleted == [digest]
    assert not any(event.startswith("stalled:") for event in world.events)


async def test_a_merge_that_lands_during_the_read_is_found_by_listing_again() -> None:
    world = World()
    await marked_orphan(world, frame_bytes(12))
    hour = await _files_of_one_hour(world, 3)
    audit = await latest_listing_audit(world.store, inventory_proves=False)
    assert audit is not None and audit.catalog_created_from is not None
    position = audit.catalog_created_from
    store: Any = world.store
    real_get = store.get
    merged: list[str] = []

    async def get_merging_first(key: str) -> tuple[bytes, str]:
        # The first file read: compaction merges the hour and deletes its inputs right
        # after the run listed the entries, so every listed file is gone when read.
        if key.startswith(keys.INDEX_CATALOG_CREATED_PREFIX) and not merged:
            merged.append("")
            store.get = real_get
            merged[0] = await _compact(world, hour)
        return await real_get(key)

    store.get = get_merging_first
    since = await references_since(world.store, position, {"0" * 64}, chunk=1)
    assert merged and merged[0]
    assert since.untrusted is None, since.untrusted
    assert since.relists >= 1 and since.covered_gone == 3


async def test_a_file_gone_that_no_merged_file_names_stalls_the_gc_and_is_counted() -> None:
    world = World()
    digest = await marked_orphan(world, frame_bytes(13))
    hour = await _files_of_one_hour(world, 3)
    files = await list_hour_files(world.store, hour)
    await world.store.delete(files[1].key)  # lost: no merge names it
    world.clock.advance(POLICY.mark_grace_s + 1)
    outcome = await world.gc()
    assert outcome.deleted == [] and await world.exists(keys.raw_blob_key(digest))
    assert outcome.record.stalled == "catalog-file-vanished"
    assert world.events.get("stalled:catalog-file-vanished") == 1
    text = (await gather_status(world.store, world.clock, lookback_s=300)).render()
    assert "STALLED (catalog-file-vanished)" in text
