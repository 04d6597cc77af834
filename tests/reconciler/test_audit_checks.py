"""The audit checks every catalog row against its listing (PROTOCOL §3.7): a row whose
ETag differs, or a key cataloged in two hours or with two hashes, is superseded from the
store's record (a ``catalog-mismatch`` while the fields differ); a cataloged key the store
does not hold is a ``phantom-row`` the GC waits for, until a retraction or a listing."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib

import pytest

from chaos.faulty_store import Fault, FaultyStore
from index import catalog
from index.rows import IndexRow, accepted_row
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.run import run_full_audit
from reconciler.context import ReconcilerContext
from reconciler.gc.run import unresolved_manifest_problems
from reconciler.problems import list_problems
from reconciler.retractions import RetractRefused, retract
from store.counting import CountingStore
from store.etag_check import normalized_etag
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    HOUR_NS,
    Batch,
    context,
    make_batch,
    make_settings,
    write_batch,
    write_batches,
)

WRONG_FRAME = b"not the frame this manifest names"
WRONG_SHA = hashlib.sha256(WRONG_FRAME).hexdigest()


async def plant(ctx: ReconcilerContext, row: IndexRow) -> str:
    """A catalog file holding ``row``, as the steady pass writes one from a log row."""
    return await ctx.catalog_writer.write(row.hour, [row], writer="steady")


def wrong_hash_row(batch: Batch, *, etag: str | None) -> IndexRow:
    """The row a buggy collector logged for a real manifest: another frame's hash."""
    row = accepted_row(batch.manifest, etag=etag)
    return dataclasses.replace(
        row,
        frame_sha256=WRONG_SHA,
        raw_blob_key=keys.raw_blob_key(WRONG_SHA),
        source="index/v1/log/buggy-segment.parquet",
    )


async def newest_rows(store: MemoryStore) -> dict[str, IndexRow]:
    """Every key's row of the newest catalog file holding it (the one that counts)."""
    newest: dict[str, tuple[tuple[int, int], IndexRow]] = {}
    async for info in catalog.list_all_files(store):
        _hour, epoch, sequence = keys.parse_index_catalog_key(info.key)
        for row in await catalog.read_file(store, info.key):
            if row.key not in newest or newest[row.key][0] < (epoch, sequence):
                newest[row.key] = ((epoch, sequence), row)
    return {key: row for key, (_rank, row) in newest.items()}


async def problem_subjects(store: MemoryStore, kind: str) -> set[str]:
    return {r.subject_key async for _k, r in list_problems(store, kind) if r is not None}


def test_the_joins_normalize_etags_as_the_store_does() -> None:
    import duckdb

    from reconciler.audit.engines.sql import normalized_etag as sql_normalized

    etags = ['"abc"', 'W/"abc"', "abc", '"abd"', None, ""]
    con = duckdb.connect()
    found = [
        con.execute(
            f"SELECT {sql_normalized('e')} FROM (SELECT ?::VARCHAR AS e)", [etag]
        ).fetchone()
        for etag in etags
    ]
    assert [row[0] if row else None for row in found] == [normalized_etag(e) for e in etags]
    assert normalized_etag('W/"abc"') == "abc"


async def test_a_cataloged_wrong_hash_is_read_and_superseded_from_the_store(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=3)
    ctx = await context(memory_store, clock)
    assert (await run_full_audit(ctx)).status == "completed"  # catalogs the true rows
    real_etag = (await memory_store.head(batches[0].key)).etag
    # 1: a wrong hash with the stored ETag, newer than the true row (two hashes);
    # 2: a wrong hash with an ETag the store never gave that key, its only other row.
    await plant(ctx, wrong_hash_row(batches[0], etag=real_etag))
    await plant(ctx, wrong_hash_row(batches[1], etag='"0123456789abcdef"'))
    before = await newest_rows(memory_store)
    assert before[batches[0].key].frame_sha256 == WRONG_SHA
    assert before[batches[1].key].frame_sha256 == WRONG_SHA
    clock.advance(3600)

    audit = await run_full_audit(ctx)

    assert audit.status == "completed"
    after = await newest_rows(memory_store)
    for batch in batches[:2]:
        row = after[batch.key]
        assert row.frame_sha256 == batch.sha and row.source == "audit"
        assert normalized_etag(row.etag) == normalized_etag(
            (await memory_store.head(batch.key)).etag
        )
    assert after[batches[2].key] == before[batches[2].key]  # untouched
    assert ctx.metrics.catalog_mismatches._value.get() == 2
    # The superseding rows were written: the mismatches are resolved, the GC may go on.
    assert await problem_subjects(memory_store, "catalog-mismatch") == set()
    assert await unresolved_manifest_problems(memory_store) is None


async def test_a_key_cataloged_in_two_hours_is_superseded_in_its_own_hour(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    [batch] = await write_batches(memory_store, agents=1, per_agent=1)
    ctx = await context(memory_store, clock)
    etag = (await memory_store.head(batch.key)).etag
    moved = dataclasses.replace(
        accepted_row(batch.manifest, etag=etag),
        time_unix_ns=batch.manifest.accepted_at_unix_ns - HOUR_NS,
    )
    await plant(ctx, accepted_row(batch.manifest, etag=etag))
    await plant(ctx, moved)  # newer, in the hour before
    clock.advance(3600)

    assert (await run_full_audit(ctx)).status == "completed"

    row = (await newest_rows(memory_store))[batch.key]
    assert row.time_unix_ns == batch.manifest.accepted_at_unix_ns and row.source == "audit"
    assert ctx.metrics.catalog_mismatches._value.get() == 1


async def test_a_different_etag_alone_is_superseded_and_no_mismatch(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=3)
    ctx = await context(memory_store, clock)
    real = [(await memory_store.head(b.key)).etag for b in batches]
    await plant(ctx, accepted_row(batches[0].manifest, etag='"another-etag"'))
    await plant(ctx, accepted_row(batches[1].manifest, etag=f'W/"{normalized_etag(real[1])}"'))
    await plant(ctx, accepted_row(batches[2].manifest, etag=None))  # written before the column
    await ctx.fence.release()
    counting = CountingStore(memory_store)
    ctx = await context(counting, clock)
    clock.advance(3600)

    assert (await run_full_audit(ctx)).status == "completed"

    rows = await newest_rows(memory_store)
    assert normalized_etag(rows[batches[0].key].etag) == normalized_etag(real[0])
    assert rows[batches[0].key].source == "audit"
    assert rows[batches[1].key].source is None  # a weak, quoted form of the same ETag
    assert rows[batches[2].key].etag is None  # takes the listed ETag: nothing written
    record_reads = counting.keys_of("get", keys.ACCEPTED_PREFIX)
    assert record_reads == [batches[0].key]  # only the one whose ETag differs is read
    assert ctx.metrics.catalog_mismatches._value.get() == 0
    assert await problem_subjects(memory_store, "catalog-mismatch") == set()


async def test_a_failed_superseding_write_leaves_the_mismatch_open_for_the_next_audit(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    [batch] = await write_batches(memory_store, agents=1, per_agent=1)
    planter = await context(memory_store, clock)
    await plant(planter, wrong_hash_row(batch, etag='"0123"'))
    await planter.fence.release()
    faulty = FaultyStore(memory_store)
    faulty.script("put_if_none_match", keys.INDEX_CATALOG_PREFIX, *[Fault.UNAVAILABLE] * 20)
    broken = await context(faulty, clock)
    clock.advance(3600)

    assert (await run_full_audit(broken)).status == "running"
    assert await problem_subjects(memory_store, "catalog-mismatch") == {batch.key}
    blocked = await unresolved_manifest_problems(memory_store)
    assert blocked is not None and "catalog-mismatch" in blocked
    await broken.fence.release()

    ctx = await context(memory_store, clock)
    assert (await run_full_audit(ctx)).status == "completed"
    assert await problem_subjects(memory_store, "catalog-mismatch") == set()
    assert (await newest_rows(memory_store))[batch.key].frame_sha256 == batch.sha


async def test_a_row_for_a_manifest_never_created_is_a_phantom_until_retracted(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    await write_batches(memory_store, agents=1, per_agent=2)
    never = make_batch(7, 0, clock.now_ns())  # logged, but its manifest was never created
    young = make_batch(8, 0, clock.now_ns() + 3600 * 10**9 - 10 * 10**9)
    ctx = await context(memory_store, clock)
    await plant(ctx, accepted_row(never.manifest, etag='"abc"'))
    await plant(ctx, accepted_row(young.manifest, etag='"abd"'))  # within the settle margin
    clock.advance(3600)

    audit = await run_full_audit(ctx)

    assert audit.status == "completed" and audit.phantoms_checked
    assert await problem_subjects(memory_store, "phantom-row") == {never.key}
    blocked = await unresolved_manifest_problems(memory_store)
    assert blocked is not None and "phantom-row" in blocked

    try:
        await retract(
            memory_store,
            clock,
            (await write_batches(memory_store, agents=1, per_agent=1, first_agent=3))[0].key,
            reason="x",
            by="op",
        )
        raise AssertionError("a record the store holds was retracted")
    except RetractRefused:
        pass
    record, created = await retract(
        memory_store, clock, never.key, reason="collector bug #12: no manifest", by="alice"
    )
    assert created and record.by == "alice" and record.reason.startswith("collector bug")
    assert await problem_subjects(memory_store, "phantom-row") == set()
    assert await unresolved_manifest_problems(memory_store) is None
    clock.advance(3600)
    assert (await run_full_audit(ctx)).status == "completed"  # honours the retraction ...
    # ... and the young row, past the settle margin now and still not listed, is one.
    assert await problem_subjects(memory_store, "phantom-row") == {young.key}


async def test_a_phantom_closes_when_a_later_audit_lists_the_key(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    late = make_batch(5, 0, clock.now_ns())
    ctx = await context(memory_store, clock)
    await plant(ctx, accepted_row(late.manifest))
    clock.advance(3600)
    await run_full_audit(ctx)
    assert await problem_subjects(memory_store, "phantom-row") == {late.key}

    await write_batch(memory_store, late)  # restored (say, from a backup)
    clock.advance(3600)
    assert (await run_full_audit(ctx)).status == "completed"

    assert await problem_subjects(memory_store, "phantom-row") == set()


async def test_the_gc_deletes_nothing_while_a_phantom_row_is_open_and_again_once_retracted() -> (
    None
):
    from reconciler.gc import GcRefused
    from tests.reconciler.test_gc import HOUR_S, POLICY, World, frame_bytes

    world = World()
    orphan = await world.orphan(frame_bytes(71))
    never = make_batch(9, 0, world.clock.now_ns())  # a log row's manifest, never created
    ctx = await world.ctx()
    await plant(ctx, accepted_row(never.manifest, etag='"feed"'))
    world.clock.advance(3 * HOUR_S)
    await world.gc()  # marks the orphan
    await world.audit()
    assert await problem_subjects(world.store, "phantom-row") == {never.key}
    world.clock.advance(POLICY.mark_grace_s + 1)
    collector = await world.collector()
    collector._deletion_blocker = lambda: unresolved_manifest_problems(world.store)

    with pytest.raises(GcRefused, match="phantom-row"):
        await collector.run()
    assert await world.exists(keys.raw_blob_key(orphan))

    await retract(world.store, world.clock, never.key, reason="no manifest: bug 12", by="bob")
    await world.audit()  # a later audit honours the retraction: nothing reopens
    assert await problem_subjects(world.store, "phantom-row") == set()
    collector = await world.collector()
    collector._deletion_blocker = lambda: unresolved_manifest_problems(world.store)
    assert (await collector.run()).deleted == [orphan]


async def test_compaction_deletes_no_input_a_running_audit_of_another_process_pinned(
    clock: ManualClock,
) -> None:
    from protocol.records import AuditRecord
    from reconciler.compaction import CatalogCompactor
    from reconciler.steady import SteadyScanner
    from tests.reconciler.conftest import log_rows

    store = MemoryStore(clock=clock)
    batches = await write_batches(store, agents=3, per_agent=2)
    compactor = CatalogCompactor()
    ctx = dataclasses.replace(await context(store, clock), on_catalog_written=compactor.touched)
    scanner = SteadyScanner(ctx)
    for part in (batches[:2], batches[2:4], batches[4:]):
        await log_rows(store, clock, part)
        await scanner.run_pass()
        clock.advance(10)
    hour = keys.UtcHour.from_unix_ns(batches[0].manifest.accepted_at_unix_ns)
    files = sorted(await catalog.list_hour_files(store, hour), key=lambda i: i.last_modified_ns)
    assert len(files) == 3
    # Another process's audit listed the catalog after the first two files were written.
    pinned_through = files[1].last_modified_ns
    running = AuditRecord(
        audit_id="00000000000000aa",
        started_at_unix_ns=clock.now_ns(),
        owner_epoch=0,
        catalog=True,
        pin_expires_at_unix_ns=clock.now_ns() + 4 * 3600 * 10**9,
        pinned_through_unix_ns=pinned_through,
    )
    await store.put(keys.audit_key(running.started_at_unix_ns, running.audit_id), running.to_json())
    clock.advance(3 * 3600)  # the hour settled: merged
    assert (await compactor.run(ctx)).files_merged == 3
    clock.advance(ctx.settings.reconciler.catalog_grace_s + 1)

    assert (await compactor.run(ctx)).inputs_deleted == 1  # only the one after the pin
    left = {info.key for info in await catalog.list_hour_files(store, hour)}
    assert {files[0].key, files[1].key} <= left and files[2].key not in left

    clock.advance(3600)  # the pin lapsed (never renewed): the rest go
    assert (await compactor.run(ctx)).inputs_deleted == 2


async def test_an_audit_whose_pin_lapsed_starts_again_with_a_new_start(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    from reconciler.audit.records import latest_audit

    await write_batches(memory_store, agents=4, per_agent=40)
    ctx = await context(memory_store, clock, settings=make_settings(concurrency=1))
    pin_s = ctx.settings.reconciler.audit_pin_s
    stalled = False

    def stall(_progress: object) -> None:  # the process stops for longer than the pin
        nonlocal stalled
        if not stalled:
            stalled = True
            clock.advance(pin_s + 1)

    first = await run_full_audit(ctx, progress=stall)
    assert first.status == "running"
    stored = await latest_audit(memory_store)
    assert stored is not None and stored.pin_expires_at_unix_ns is not None
    assert stored.pin_expires_at_unix_ns < clock.now_ns()  # lapsed, never renewed after

    again = await run_full_audit(ctx)

    assert again.status == "completed" and again.audit_id != first.audit_id
    assert again.started_at_unix_ns > first.started_at_unix_ns
    assert again.pin_expires_at_unix_ns is None  # released once the joins were done


async def test_a_running_audit_renews_its_pin_as_it_saves(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    from reconciler.audit.records import latest_audit

    await write_batches(memory_store, agents=4, per_agent=40)
    ctx = await context(memory_store, clock, settings=make_settings(concurrency=1))
    pin_ns = int(ctx.settings.reconciler.audit_pin_s * 1e9)
    seen: list[int] = []

    def slow(_progress: object) -> None:  # each chunk takes a third of the pin
        clock.advance(pin_ns / 3e9)

    async def watch() -> None:
        while True:
            record = await latest_audit(memory_store)
            if record is not None and record.pin_expires_at_unix_ns is not None:
                seen.append(record.pin_expires_at_unix_ns)
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    try:
        done = await run_full_audit(ctx, progress=slow)
    finally:
        watcher.cancel()
    assert done.status == "completed"  # never lapsed: renewed at every half pin
    assert len(set(seen)) > 2 and max(seen) > min(seen) + pin_ns


async def test_an_audit_reads_a_compacted_catalog_file_whose_digests_duckdb_wrote_as_blobs(
    clock: ManualClock,
) -> None:
    from reconciler.compaction import CatalogCompactor
    from reconciler.steady import SteadyScanner
    from tests.reconciler.conftest import log_rows

    store = MemoryStore(clock=clock)
    batches = await write_batches(store, agents=2, per_agent=2)
    compactor = CatalogCompactor()
    ctx = dataclasses.replace(await context(store, clock), on_catalog_written=compactor.touched)
    for part in (batches[:2], batches[2:]):
        await log_rows(store, clock, part)
        await SteadyScanner(ctx).run_pass()
    assert (await compactor.run(ctx, force=True)).files_merged == 2  # one merged file left
    clock.advance(3600)

    audit = await run_full_audit(ctx)

    assert audit.status == "completed" and audit.cataloged == 0
    assert await problem_subjects(store, "unreadable-index-file") == set()


async def test_a_log_row_with_a_wrong_hash_and_the_right_etag_is_caught_by_its_missing_blob(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    """The steady pass catalogs a collector's own create without a request; a buggy row
    with the store's ETag but another frame's hash passes the ETag comparison, and its
    hash names no blob: the audit reads the record and supersedes the row."""
    from reconciler.steady import SteadyScanner
    from tests.reconciler.conftest import log_rows

    batches = await write_batches(memory_store, agents=1, per_agent=2)
    etag = (await memory_store.head(batches[0].key)).etag
    buggy = dataclasses.replace(wrong_hash_row(batches[0], etag=etag), own_create=True, source=None)
    ctx = await context(memory_store, clock, settings=make_settings(verify_sample_rate=0.0))
    await log_rows(memory_store, clock, batches[1:], rows=[buggy])
    await SteadyScanner(ctx).run_pass()
    assert (await newest_rows(memory_store))[batches[0].key].frame_sha256 == WRONG_SHA
    clock.advance(3600)

    audit = await run_full_audit(ctx)

    assert audit.status == "completed"
    row = (await newest_rows(memory_store))[batches[0].key]
    assert (row.frame_sha256, row.source) == (batches[0].sha, "audit")
    assert ctx.metrics.catalog_mismatches._value.get() == 1
    assert await problem_subjects(memory_store, "missing-blob") == set()
    assert await problem_subjects(memory_store, "catalog-mismatch") == set()
