"""Full audits (PROTOCOL §3.7): the anti-join catalogs exactly what the catalog lacks (one
GET per missing record, none for known ones), the blob join writes the orphan file and
records missing blobs, an unreadable catalog file is moved aside and its records
cataloged again; audits resume after a crash with their original start, stay within the
concurrency setting, and verify blob hashes on a cursor carried from audit to audit."""

from __future__ import annotations

import asyncio

from chaos.faulty_store import Fault, FaultyStore
from protocol import keys
from protocol.clock import ManualClock
from protocol.records import AuditRecord, ProblemRecord
from reconciler.audit.blob_verify import BlobVerifier
from reconciler.audit.orphans import decode_orphans
from reconciler.audit.records import create_audit, latest_audit, latest_completed_audit
from reconciler.audit.run import VERIFY_CURSOR, AuditProgress, run_full_audit
from reconciler.problems import ProblemBook, count_problems
from reconciler.steady import SteadyScanner
from store.counting import CountingStore
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    T0_NS,
    audits_until_a_verification_round_ends,
    catalog_keys,
    context,
    finished_listing_ranges,
    keys_under,
    log_rows,
    make_settings,
    with_retry_horizon,
    write_batches,
    write_conflict,
)

S = keys.NS_PER_S


def agent_group(agent: int) -> str:
    return f"{keys.ACCEPTED_PREFIX}agent={f'agent-{agent:03d}'.encode().hex()}/"


async def test_an_audit_catalogs_exactly_what_the_log_lost(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=3, per_agent=4)
    conflict = await write_conflict(memory_store, batches[0], T0_NS + 5 * S)
    await log_rows(memory_store, clock, batches[:7])  # the rest were lost in a crash
    store = CountingStore(memory_store)
    ctx = await context(store, clock, settings=make_settings(verify_rate_per_s=1e-3))
    await SteadyScanner(ctx).run_pass()
    store.clear()

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.catalog
    assert (record.manifests_seen, record.quarantines_seen, record.cataloged) == (12, 1, 6)
    lost = {b.key for b in batches[7:]}
    assert sorted(store.keys_of("get", keys.ACCEPTED_PREFIX)) == sorted(lost)  # only those
    assert store.keys_of("get", keys.QUARANTINE_PREFIX) == [conflict.quarantine_key]
    assert (
        store.count("get", keys.INDEX_CATALOG_PREFIX) == 1
    )  # the steady pass's one file, read once
    assert await catalog_keys(memory_store) == {b.key for b in batches} | {conflict.quarantine_key}
    markers = await keys_under(memory_store, keys.ROLLUP_WORK_PREFIX)
    assert {keys.parse_rollup_work_marker_key(m) for m in markers} == await keys_under(
        memory_store, keys.INDEX_CATALOG_PREFIX
    )

    store.clear()
    clock.advance(60)
    again = await run_full_audit(ctx)
    assert again.status == "completed" and again.cataloged == 0
    assert store.keys_of("get", keys.ACCEPTED_PREFIX) == []  # known records cost nothing more
    assert store.keys_of("get", keys.QUARANTINE_PREFIX) == []


async def test_the_orphan_file_holds_unreferenced_blobs_older_than_the_horizon(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=2, per_agent=3)
    conflict = await write_conflict(memory_store, batches[1], T0_NS + 5 * S)
    old_orphan, young_orphan = "0a" * 32, "0b" * 32
    await memory_store.put(keys.raw_blob_key(old_orphan), b"a collector died after this")
    clock.advance(2 * 3600)
    await memory_store.put(keys.raw_blob_key(young_orphan), b"an agent may still retry this")
    ctx = await context(memory_store, clock, settings=with_retry_horizon(make_settings(), 3600))

    record = await run_full_audit(ctx)

    assert record.status == "completed"
    assert (record.blobs_listed, record.orphans) == (len(batches) + 1 + 2, 1)
    body, _ = await memory_store.get(
        keys.audit_orphans_key(record.started_at_unix_ns, record.audit_id)
    )
    orphans = decode_orphans(body)
    assert set(orphans) == {old_orphan}  # the quarantined blob is referenced, not an orphan
    assert conflict.submitted_frame_sha256 not in orphans
    assert orphans[old_orphan][0] == len(b"a collector died after this")


async def test_a_missing_blob_is_a_problem_naming_its_record_until_it_is_back(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=2, per_agent=4)
    victim = batches[6]
    await memory_store.delete(victim.manifest.raw_blob_key)
    store = CountingStore(memory_store)
    ctx = await context(store, clock, settings=make_settings(verify_rate_per_s=1e-3))

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.problems == 1
    assert store.keys_of("head") == [
        victim.manifest.raw_blob_key
    ]  # the one not listed is confirmed
    body, _ = await memory_store.get(keys.problem_key("missing-blob", victim.manifest.raw_blob_key))
    assert victim.key in ProblemRecord.from_json(body).detail

    await memory_store.put(victim.manifest.raw_blob_key, victim.frame)
    clock.advance(60)
    again = await run_full_audit(ctx)
    assert again.problems == 0 and await count_problems(memory_store) == {}


async def test_an_interrupted_audit_resumes_where_it_stopped_with_its_start(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=12, per_agent=5)
    conflict = await write_conflict(memory_store, batches[0], clock.now_ns())
    settings = make_settings(concurrency=2)
    first = await context(memory_store, clock, settings=settings)

    seen: list[AuditProgress] = []

    def stop_early(progress: AuditProgress) -> None:
        seen.append(progress)
        if progress.manifests_seen >= 20:
            first.stopping.set()

    interrupted = await run_full_audit(first, progress=stop_early, progress_interval_s=0)
    assert interrupted.status == "running" and interrupted.catalog
    # Progress by ranges (what `lm-reconciler audit` shows on a terminal).
    listed = [p for p in seen if p.ranges_total]
    assert listed and listed[-1].groups_done == listed[-1].ranges_total
    assert [p.groups_done for p in listed] == sorted(p.groups_done for p in listed)
    assert await latest_audit(memory_store) == interrupted
    finished = await finished_listing_ranges(memory_store, interrupted)
    assert finished  # its listing's ranges are kept for the resume
    cataloged_before = await catalog_keys(memory_store)
    assert 20 <= len(cataloged_before) < 61

    clock.advance(5)
    await first.fence.release()
    store = CountingStore(memory_store)
    second = await context(store, clock, owner="reconciler-b", settings=settings)
    resumed = await run_full_audit(second, progress_interval_s=0)

    assert resumed.status == "completed"
    assert resumed.audit_id == interrupted.audit_id
    assert resumed.started_at_unix_ns == interrupted.started_at_unix_ns
    assert resumed.owner_epoch == second.epoch == first.epoch + 1
    assert (resumed.manifests_seen, resumed.quarantines_seen) == (60, 1)
    assert resumed.engine == "local" and resumed.keys_listed["accepted"] == 60
    assert resumed.requests["LIST"] > interrupted.requests["LIST"] > 0  # across its runs
    assert not set(store.lists) & finished  # no finished range is listed again
    assert not set(store.keys_of("get", keys.ACCEPTED_PREFIX)) & cataloged_before
    assert await catalog_keys(memory_store) == {b.key for b in batches} | {conflict.quarantine_key}
    assert await latest_completed_audit(memory_store) == resumed


async def test_an_audit_that_crashed_before_its_first_progress_save_is_resumed(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    """Its record is the one written when it started: that record must already say it is an
    audit of the index, or the next run would take it for a version-1 audit."""
    await write_batches(memory_store, agents=2, per_agent=2)
    faulty = FaultyStore(memory_store)
    faulty.script("put_if_match", keys.RECONCILER_AUDITS_PREFIX, *[Fault.UNAVAILABLE] * 100)
    crashed = await context(faulty, clock)
    crashed.stopping.set()  # stops before its walk; every later save of its record fails
    first = await run_full_audit(crashed, progress_interval_s=0)
    assert first.status == "running"
    stored = await latest_audit(memory_store)
    assert stored is not None and stored.manifests_seen == 0  # only the created record
    await crashed.fence.release()
    clock.advance(5)

    successor = await context(memory_store, clock, owner="reconciler-b", seed=2)
    resumed = await run_full_audit(successor)

    assert resumed.status == "completed" and resumed.audit_id == first.audit_id


async def test_a_failed_catalog_write_leaves_the_audit_running_and_the_rerun_completes_it(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=3, per_agent=4)
    faulty = FaultyStore(memory_store)
    # Outlasts the catalog writer's bounded retries (one writer at a time: concurrency 1).
    faulty.script("put_if_none_match", keys.INDEX_CATALOG_PREFIX, *[Fault.UNAVAILABLE] * 5)
    ctx = await context(faulty, clock, settings=make_settings(concurrency=1))

    failed = await run_full_audit(ctx, progress_interval_s=0)

    assert failed.status == "running"
    assert ctx.metrics.store_failures.labels("catalog_write")._value.get() == 1
    assert await latest_completed_audit(memory_store) is None
    assert await catalog_keys(memory_store) < {b.key for b in batches}

    again = await run_full_audit(ctx, progress_interval_s=0)
    assert again.status == "completed" and again.audit_id == failed.audit_id
    assert await catalog_keys(memory_store) == {b.key for b in batches}


async def test_store_calls_in_flight_stay_within_the_concurrency_setting(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    await write_batches(memory_store, agents=8, per_agent=20)
    store = CountingStore(memory_store, overlap=True)
    ctx = await context(store, clock, settings=make_settings(concurrency=3))

    record = await run_full_audit(ctx, progress_interval_s=1e9)

    assert record.status == "completed" and record.manifests_seen == 160
    assert 1 < store.max_in_flight <= 3


async def test_an_unreadable_catalog_file_is_moved_aside_and_its_records_cataloged_again(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=2, per_agent=3)
    store = CountingStore(memory_store)
    ctx = await context(store, clock)
    await log_rows(memory_store, clock, batches[:3], writer_id="c1")
    await SteadyScanner(ctx).run_pass()
    await log_rows(memory_store, clock, batches[3:], writer_id="c2")
    await SteadyScanner(ctx).run_pass()
    broken, kept = sorted(await keys_under(memory_store, keys.INDEX_CATALOG_PREFIX))
    await memory_store.put(broken, b"PAR1 garbage where a catalog file was")
    store.clear()

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.cataloged == 3
    assert sorted(store.keys_of("get", keys.ACCEPTED_PREFIX)) == sorted(b.key for b in batches[:3])
    aside = keys.INDEX_UNREADABLE_PREFIX + broken.removeprefix("index/v1/")
    assert await memory_store.get(aside) and broken not in await keys_under(memory_store)
    assert kept in await keys_under(memory_store, keys.INDEX_CATALOG_PREFIX)
    body, _ = await memory_store.get(keys.problem_key("unreadable-index-file", broken))
    assert ProblemRecord.from_json(body).subject_key == broken
    assert await catalog_keys(memory_store) == {b.key for b in batches}


async def test_an_unparseable_manifest_is_a_problem_until_it_reads_well(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=2, per_agent=2)
    await memory_store.put(batches[0].key, b'{"schema": "lightmetrics.accepted_batch.v1", "agent_')
    # A well-formed manifest stored under another batch's key names the wrong identity.
    await memory_store.put(batches[1].key, batches[2].manifest.to_json())
    ctx = await context(memory_store, clock)

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.problems == 2
    assert await count_problems(memory_store) == {"unparseable-manifest": 2}
    assert await catalog_keys(memory_store) == {b.key for b in batches[2:]}

    for batch in batches[:2]:
        await memory_store.put(batch.key, batch.manifest.to_json())
    clock.advance(60)
    fixed = await run_full_audit(ctx)
    assert fixed.cataloged == 2 and await count_problems(memory_store) == {}
    assert await catalog_keys(memory_store) == {b.key for b in batches}


async def test_an_audit_left_running_by_a_version_1_reconciler_is_not_resumed(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    """Its finished groups were never cataloged: resuming it would skip their records."""
    batches = await write_batches(memory_store, agents=3, per_agent=2)
    ctx = await context(memory_store, clock)
    v1 = AuditRecord(
        audit_id="00000000000000aa",
        started_at_unix_ns=clock.now_ns() - 60 * S,
        owner_epoch=0,
        cursors={"accepted/v1/": agent_group(2), keys.QUARANTINE_PREFIX: "done"},
        manifests_seen=6,
    )
    await create_audit(ctx, v1)

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.audit_id != v1.audit_id
    assert record.cataloged == 6
    assert await catalog_keys(memory_store) == {b.key for b in batches}


async def test_groups_larger_than_a_page_are_listed_by_their_worker(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    """One agent with more manifests than discovery hands over, among small ones."""
    await write_batches(memory_store, agents=1, per_agent=1030)
    await write_batches(memory_store, agents=2, per_agent=3, first_agent=1)
    ctx = await context(memory_store, clock, settings=make_settings(verify_rate_per_s=1e-3))

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.manifests_seen == 1036
    assert record.cataloged == 1036 and len(await catalog_keys(memory_store)) == 1036


# --- verification --------------------------------------------------------------------


async def test_the_verifier_records_corrupt_blobs_and_resumes_from_its_cursor(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=2, per_agent=10)
    by_key = sorted(batches, key=lambda b: b.manifest.raw_blob_key)
    corrupt_early, corrupt_late = by_key[2], by_key[15]
    for batch in (corrupt_early, corrupt_late):
        await memory_store.put(batch.manifest.raw_blob_key, bytes(reversed(batch.frame)))
    ctx = await context(memory_store, clock)
    problems = ProblemBook(ctx)
    await problems.load()
    referenced = {corrupt_late.sha}
    cursor = by_key[9].manifest.raw_blob_key

    verifier = BlobVerifier(
        ctx,
        problems,
        cursor=cursor,
        limit=asyncio.Semaphore(2),
        is_referenced=lambda sha: sha in referenced,
    )
    await verifier.run()

    assert verifier.verified == 10 and verifier.problems == 1  # only keys after the cursor
    assert verifier.round_complete and verifier.cursor == ""
    late_key = corrupt_late.manifest.raw_blob_key
    assert await count_problems(memory_store) == {"corrupt-blob": 1}
    body, _ = await memory_store.get(keys.problem_key("corrupt-blob", late_key))
    detail = ProblemRecord.from_json(body).detail
    assert "hashes to" in detail and "referenced by the catalog" in detail

    await memory_store.put(late_key, corrupt_late.frame)  # repaired by hand
    again = BlobVerifier(
        ctx, problems, cursor="", limit=asyncio.Semaphore(2), is_referenced=lambda _sha: False
    )
    await again.run()
    assert again.verified == 20 and again.problems == 1
    assert await count_problems(memory_store) == {"corrupt-blob": 1}  # early one; late resolved
    early_key = corrupt_early.manifest.raw_blob_key
    body, _ = await memory_store.get(keys.problem_key("corrupt-blob", early_key))
    assert "no catalog row references it" in ProblemRecord.from_json(body).detail


async def test_an_audit_finds_a_corrupt_blob_within_a_round_and_says_it_is_referenced(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=3, per_agent=6)
    victim = batches[7]
    await memory_store.put(victim.manifest.raw_blob_key, bytes(reversed(victim.frame)))
    store = CountingStore(memory_store)
    ctx = await context(store, clock)
    # A previous audit stopped verifying just after the first blob.
    first_blob = min(b.manifest.raw_blob_key for b in batches)
    previous = (await run_full_audit(ctx)).model_copy(
        update={
            "audit_id": "0" * 16,
            "started_at_unix_ns": clock.now_ns() + 1,
            "cursors": {VERIFY_CURSOR: first_blob},
        }
    )
    await create_audit(ctx, previous)
    store.clear()
    clock.advance(60)

    records = await audits_until_a_verification_round_ends(ctx, clock)

    assert all(VERIFY_CURSOR in r.cursors for r in records)
    verify_lists = [after for prefix, after in store.lists if prefix == keys.RAW_BLOBS_PREFIX]
    verify_lists = [after for after in verify_lists if after is not None]
    assert verify_lists[0] == first_blob  # the first audit resumed where the last one stopped
    # Each audit's verification starts where the previous one's stopped.
    assert verify_lists[1 : len(records)] == [r.cursors[VERIFY_CURSOR] for r in records[:-1]]
    assert await count_problems(memory_store) == {"corrupt-blob": 1}
    body, _ = await memory_store.get(keys.problem_key("corrupt-blob", victim.manifest.raw_blob_key))
    assert "referenced by the catalog" in ProblemRecord.from_json(body).detail
    assert (await latest_audit(memory_store)) == records[-1]


async def test_every_audit_moves_verification_on_even_when_its_walk_is_instant(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=5)
    ctx = await context(memory_store, clock, settings=make_settings(verify_rate_per_s=1e-3))

    records = await audits_until_a_verification_round_ends(ctx, clock)

    assert len(records) <= len(batches) + 1
    cursors = [r.cursors[VERIFY_CURSOR] for r in records]
    assert cursors[:-1] == sorted(cursors[:-1]) and all(cursors[:-1]) and cursors[-1] == ""


async def test_a_blob_acknowledged_lost_is_not_reported_missing_again(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    """Issue 24 item 13: once ``lm-rollup acknowledge-lost`` recorded the batch as lost
    in the rollup ledger (with who and why), the audit stops recording its blob as a
    ``missing-blob`` problem (which would keep ``status --check`` unhealthy for ever)."""
    from rollup.lifecycle.lost import acknowledge_lost

    batches = await write_batches(memory_store, agents=2, per_agent=2)
    victim = batches[1]
    await memory_store.delete(victim.manifest.raw_blob_key)
    ctx = await context(memory_store, clock, settings=make_settings(verify_rate_per_s=1e-3))
    assert (await run_full_audit(ctx)).problems == 1

    await acknowledge_lost(memory_store, victim.key, reason="the disk died", by="ops", clock=clock)
    assert await count_problems(memory_store) == {}  # its record went with it

    clock.advance(60)
    again = await run_full_audit(ctx)
    assert again.status == "completed" and again.problems == 0
    assert await count_problems(memory_store) == {}
