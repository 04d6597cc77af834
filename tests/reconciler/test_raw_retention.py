"""Raw retention (PROTOCOL §4.1, `reconciler.gc.raw_retention`): blobs of batches the rollup
ledger includes and whose accepted hour ended ``raw_days`` ago are deleted by the GC's
whole procedure; manifests stay, quarantine references keep their blobs, the audit never
reports such blobs missing and re-checks every retired hour against the ledger.

Real collectors' acceptance, the real steady pass, audit and GC (`tests.reconciler.test_gc`'s
world) and real rollup commits, on a memory store driven by a manual clock."""

from __future__ import annotations

import dataclasses
import io
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from collector.accept import Accepted, IdentityConflictFound
from config import RetentionSettings
from protocol import keys, records
from protocol.clock import ManualClock
from reconciler.audit.orphans import decode_orphans, encode_orphans
from reconciler.gc import GcPolicy
from reconciler.gc.raw_retention import RawRetentionAdvance, read_state
from reconciler.gc.run import latest_listing_audit, run_gc
from rollup.table.ledger import LedgerRow
from rollup.table.owner import OwnerLease
from store.counting import CountingStore
from store.memory import MemoryStore
from tests.reconciler.conftest import make_batch, write_batch
from tests.reconciler.test_gc import HOUR_S, World, frame_bytes, header_of, sha
from tests.rollup.dataset_builder import commit_rows

RAW_DAYS = 2 / 24  # two hours
GUARDED = GcPolicy(
    retry_horizon_s=2 * HOUR_S, mark_grace_s=600.0, max_delete_fraction=0.1, settle_s=60.0
)


async def include(world: World, *manifests: records.AcceptedManifest) -> None:
    """A rollup commit whose ledger includes ``manifests``."""
    owner = await OwnerLease.acquire(world.store, "job", 600, world.clock)
    await commit_rows(
        world.store, owner, world.clock, ledger=[LedgerRow.of_manifest(m) for m in manifests]
    )
    await owner.release()


async def retire(
    world: World, advance: RawRetentionAdvance | None = None, *, store: Any = None
) -> records.RawRetention | None:
    """One step of raw retention at the world's time and newest audit (on ``store``, a
    wrapper of the world's, when given)."""
    advance = advance or RawRetentionAdvance(raw_days=RAW_DAYS, settle_margin_s=5.0)
    audit = await latest_listing_audit(world.store)
    return await advance.run(
        store or world.store,
        now_ns=world.clock.now_ns(),
        audit_started_ns=audit.started_at_unix_ns if audit else None,
        fence=(await world.ctx()).check_fence,
    )


async def audit_now(world: World) -> records.AuditRecord:
    """A full audit one second after anything before (audits are ordered by start)."""
    world.clock.advance(1)
    return await world.audit()


async def problems_of(world: World, kind: str) -> list[str]:
    return await world.keys_under(f"{keys.RECONCILER_PROBLEMS_PREFIX}{kind}/")


async def latest_orphans(world: World) -> dict[str, tuple[int, int, bool]]:
    audit = await latest_listing_audit(world.store)
    assert audit is not None
    key = keys.audit_orphans_key(audit.started_at_unix_ns, audit.audit_id)
    return decode_orphans((await world.store.get(key))[0])


def requests_naming(store: CountingStore, digest: str) -> Counter[str]:
    """The requests on keys that hold ``digest`` (a blob hash), LISTs aside, as
    ``"GET gc/marks"``: what one blob costs."""
    return Counter(
        f"{method.upper()} {key.split('/')[0]}/{key.split('/')[2]}"
        for method, key in store.requests
        if digest in key and method != "list"
    )


async def accepted_world() -> tuple[World, list[Accepted], IdentityConflictFound]:
    """Three batches accepted in the first hour; the third also has a conflicting re-send
    (its quarantine record references the accepted blob and the submitted one)."""
    clock = ManualClock()
    world = World(GUARDED, store=CountingStore(MemoryStore(clock=clock)))
    world.clock = clock
    batches = [await world.accept(frame_bytes(100 + seq), seq=seq) for seq in (1, 2, 3)]
    other = frame_bytes(200, seq=103)
    conflict = await world.acceptor(3).accept(header_of(other), other, sha(other))
    assert isinstance(conflict, IdentityConflictFound)
    return world, batches, conflict


async def test_rolled_up_blobs_past_raw_days_are_deleted_by_the_gc_and_manifests_stay() -> None:
    world, (a, b, c), conflict = await accepted_world()
    first_hour = a.manifest.accepted_hour
    world.clock.advance(3 * HOUR_S)
    await audit_now(world)  # seals the first hour
    await include(world, a.manifest, b.manifest, c.manifest)
    state = await retire(world)
    assert state is not None and state.retired_before == first_hour.next().iso
    assert state.retired_batches == 3
    assert (await read_state(world.store))[0] == state

    await audit_now(world)  # the first audit that knows the hour is retired
    store = world.store
    assert isinstance(store, CountingStore)
    store.clear()
    flagged = {
        s for s, (_size, _lm, by_retention) in (await latest_orphans(world)).items() if by_retention
    }
    assert flagged == {a.manifest.frame_sha256, b.manifest.frame_sha256}  # c: quarantined
    marked = await world.gc()
    assert marked.record.marked == 2
    for accepted in (a, b):
        mark_key = keys.gc_mark_key(accepted.manifest.frame_sha256)
        assert (
            records.GcMark.from_json((await world.store.get(mark_key))[0]).reason == "raw-retention"
        )

    world.clock.advance(GUARDED.mark_grace_s + 1)
    deleted = await world.gc()  # 2 of 5 listed blobs: over max_delete_fraction, not guarded
    assert sorted(deleted.deleted) == sorted([a.manifest.frame_sha256, b.manifest.frame_sha256])
    assert deleted.record.deleted_raw_retention == 2
    # What retiring one blob costs beyond the runs' listings and audits, on the keys
    # that name it: 2 PUTs (mark, "deleting"), a HEAD of the blob (rule 1: the audit
    # listed before the mark), one signed DELETE of the blob and one of the mark, a HEAD of
    # the veto, and GETs of the mark (the check above reads it once; the deleting run twice,
    # in the stale-deletion pass and the proving pass, then once more before "deleting";
    # the marking run reads none of the marks it wrote). Besides: rule 7 reads
    # the blob whole twice (not counted here), and twice GETs its manifest and LISTs its
    # quarantine prefix; the run's one log file is shared by all its deletions.
    cost = requests_naming(store, a.manifest.frame_sha256)
    assert Counter({r: n for r, n in cost.items() if not r.startswith("GET raw-blobs")}) == {
        "PUT gc/marks": 2,
        "HEAD raw-blobs/sha256": 1,
        "GET gc/marks": 4,
        "HEAD gc/vetoes": 1,
        "DELETE raw-blobs/sha256": 1,
        "DELETE gc/marks": 1,
    }
    for accepted in (a, b):
        assert not await world.exists(accepted.manifest.raw_blob_key)
        assert await world.exists(accepted.manifest.manifest_key)  # manifests stay
    for kept in (c.manifest.frame_sha256, conflict.submitted_frame_sha256):
        assert await world.exists(keys.raw_blob_key(kept))
    logged = await world.gc_log()
    assert sorted(e.reason for e in logged) == ["raw-retention", "raw-retention"]

    audit = await audit_now(world)
    assert audit.status == "completed"
    assert await problems_of(world, "missing-blob") == []

    # A re-send of a retired batch is still a duplicate; the blob it wrote again is
    # retired again once older than the horizon.
    again = await world.accept(frame_bytes(101), seq=1)
    assert again.duplicate and again.manifest == a.manifest
    world.clock.advance(GUARDED.retry_horizon_s + 1)
    await audit_now(world)
    assert (await latest_orphans(world))[a.manifest.frame_sha256][2] is True
    assert await problems_of(world, "missing-blob") == []


async def test_an_hour_waits_until_the_ledger_has_all_its_batches_and_is_read_once_meanwhile() -> (
    None
):
    world, (a, b, c), _conflict = await accepted_world()
    first_hour = a.manifest.accepted_hour
    advance = RawRetentionAdvance(raw_days=RAW_DAYS, settle_margin_s=5.0)
    world.clock.advance(3 * HOUR_S)
    await include(world, a.manifest, b.manifest)
    assert await retire(world, advance) is None  # no completed audit yet: not sealed
    await audit_now(world)
    assert await retire(world, advance) is None  # c is not rolled up yet

    counting = CountingStore(world.store)
    await retire(world, advance, store=counting)
    assert counting.count("get", keys.INDEX_CATALOG_PREFIX) == 0  # nothing changed: not re-read
    assert counting.count("put") == 0

    await audit_now(world)
    assert not any(flag for *_rest, flag in (await latest_orphans(world)).values())
    await include(world, c.manifest)
    state = await retire(world, advance)
    assert state is not None and state.retired_before == first_hour.next().iso

    fresh = RawRetentionAdvance(raw_days=RAW_DAYS, settle_margin_s=5.0)
    counting.clear()
    await retire(world, fresh, store=counting)
    assert counting.count("get", keys.INDEX_CATALOG_PREFIX) == 0  # retired hours: never again
    assert counting.count("put") == 0


async def test_young_hours_are_not_retired() -> None:
    world, (a, b, c), _conflict = await accepted_world()
    world.clock.advance(1 * HOUR_S)
    await audit_now(world)
    await include(world, a.manifest, b.manifest, c.manifest)
    assert await retire(world) is None  # the hour ended less than raw_days ago
    world.clock.advance(0.9 * HOUR_S)
    assert await retire(world) is None  # still (by a few minutes)
    world.clock.advance(0.3 * HOUR_S)
    state = await retire(world)
    assert state is not None and state.retired_before == a.manifest.accepted_hour.next().iso


async def test_a_batch_cataloged_later_into_a_retired_hour_keeps_the_hours_blobs() -> None:
    world, (a, b, c), _conflict = await accepted_world()
    first_hour = a.manifest.accepted_hour
    world.clock.advance(3 * HOUR_S)
    await audit_now(world)
    await include(world, a.manifest, b.manifest, c.manifest)
    assert await retire(world) is not None
    # A manifest stamped in the retired hour appears late, with no log row (sealing rules
    # this out; a broken clock could cause it): the audit catalogs it into that hour.
    late = make_batch(7, 1, first_hour.start_ns + 10 * keys.NS_PER_S)
    await write_batch(world.store, late)
    await audit_now(world)  # catalogs it: its own blob counts as referenced at once
    assert late.sha not in await latest_orphans(world)
    await audit_now(world)  # the hour no longer matches the ledger: none of its blobs goes
    assert not any(flag for *_rest, flag in (await latest_orphans(world)).values())
    subject = keys.index_catalog_hour_prefix(first_hour)
    assert await problems_of(world, "raw-retention-mismatch") == [
        keys.problem_key("raw-retention-mismatch", subject)
    ]
    assert (await world.gc()).record.marked == 0  # every blob of the hour is kept

    await include(world, late.manifest)  # the rollup takes it: the hour holds again
    await audit_now(world)
    flagged = {s for s, (*_rest, flag) in (await latest_orphans(world)).items() if flag}
    assert flagged == {a.manifest.frame_sha256, b.manifest.frame_sha256}  # late: still young
    assert await problems_of(world, "raw-retention-mismatch") == []


async def test_run_gc_retires_with_raw_days_and_not_without() -> None:
    world, (a, b, c), _conflict = await accepted_world()
    world.clock.advance(3 * HOUR_S)
    await audit_now(world)
    await include(world, a.manifest, b.manifest, c.manifest)
    ctx = await world.ctx()
    await run_gc(ctx, dry_run=False)
    assert (await read_state(world.store))[0] is None  # off by default
    on = dataclasses.replace(
        ctx,
        settings=ctx.settings.model_copy(
            update={"retention": RetentionSettings(raw_days=RAW_DAYS)}
        ),
    )
    await run_gc(on, dry_run=True)
    assert (await read_state(world.store))[0] is None  # a dry run writes nothing
    retired = "lm_reconciler_raw_retention_retired_batches"
    assert ctx.metrics.registry.get_sample_value(retired) == 0  # nor shows anything
    await run_gc(on, dry_run=False)
    state, _etag = await read_state(world.store)
    assert state is not None and state.retired_before == a.manifest.accepted_hour.next().iso
    # The health dashboard's raw retention panel reads the state from the gauges.
    assert ctx.metrics.registry.get_sample_value(retired) == state.retired_batches > 0
    before = "lm_reconciler_raw_retention_retired_before_timestamp_seconds"
    assert ctx.metrics.registry.get_sample_value(before) == (
        a.manifest.accepted_hour.next().start_ns / 1e9
    )


def test_an_orphan_file_without_the_retention_column_reads_as_orphans() -> None:
    digest = "ab" * 32
    assert decode_orphans(encode_orphans([(digest, 5, 7, True)])) == {digest: (5, 7, True)}
    old = pa.table(
        {
            "frame_sha256": [digest],
            "size": pa.array([5], pa.int64()),
            "last_modified_ns": pa.array([7], pa.int64()),
        }
    )
    sink = io.BytesIO()
    pq.write_table(old, sink)
    assert decode_orphans(sink.getvalue()) == {digest: (5, 7, False)}


async def test_a_conflicting_resend_of_a_marked_retired_batch_vetoes_its_blob() -> None:
    world, (a, b, _c), _conflict = await accepted_world()
    world.clock.advance(3 * HOUR_S)
    await audit_now(world)
    await include(world, *(r.manifest for r in (a, b, _c)))
    assert await retire(world) is not None
    await audit_now(world)
    assert (await world.gc()).record.marked == 2
    # Another frame under a's identity: its quarantine record will name a's blob, which
    # raw retention has marked. The collector vetoes it before the record exists.
    other = frame_bytes(300, seq=101)
    late = await world.acceptor(1).accept(header_of(other), other, sha(other))
    assert isinstance(late, IdentityConflictFound)
    assert await world.exists(keys.gc_veto_key(a.manifest.frame_sha256))
    world.clock.advance(GUARDED.mark_grace_s + 1)
    outcome = await world.gc()
    assert outcome.deleted == [b.manifest.frame_sha256]
    assert await world.exists(a.manifest.raw_blob_key)
    await audit_now(world)  # from now on the quarantine row keeps it: never marked again
    assert a.manifest.frame_sha256 not in await latest_orphans(world)


async def test_a_conflict_after_raw_retention_deleted_the_accepted_blob_records_it_absent() -> None:
    """PROTOCOL §3.2: the collector holds off the accepted blob's deletion and HEADs it;
    gone (raw retention deleted it), the quarantine record says
    ``accepted_blob_present: false``. Nothing reports that blob missing, and a re-send
    that stores it again has it kept by the record from then on."""
    world, (a, b, c), _conflict = await accepted_world()
    world.clock.advance(3 * HOUR_S)
    await audit_now(world)
    await include(world, a.manifest, b.manifest, c.manifest)
    assert await retire(world) is not None
    await audit_now(world)
    assert (await world.gc()).record.marked == 2
    world.clock.advance(GUARDED.mark_grace_s + 1)
    assert sorted((await world.gc()).deleted) == sorted(
        [a.manifest.frame_sha256, b.manifest.frame_sha256]
    )
    other = frame_bytes(300, seq=101)  # another frame under a's identity
    late = await world.acceptor(1).accept(header_of(other), other, sha(other))
    assert isinstance(late, IdentityConflictFound)
    record = records.IdentityConflict.from_json((await world.store.get(late.quarantine_key))[0])
    assert record.accepted_blob_present is False
    assert record.accepted_frame_sha256 == a.manifest.frame_sha256
    audit = await audit_now(world)
    assert audit.status == "completed"
    assert await problems_of(world, "missing-blob") == []

    again = await world.accept(frame_bytes(101), seq=1)  # a's frame, stored again
    assert again.duplicate
    world.clock.advance(GUARDED.retry_horizon_s + 1)
    await audit_now(world)
    assert a.manifest.frame_sha256 not in await latest_orphans(world)  # the record keeps it
    assert await problems_of(world, "missing-blob") == []


async def test_deleting_the_state_stops_raw_retention_and_withdraws_its_marks() -> None:
    world, (a, b, c), _conflict = await accepted_world()
    world.clock.advance(3 * HOUR_S)
    await audit_now(world)
    await include(world, a.manifest, b.manifest, c.manifest)
    assert await retire(world) is not None
    await audit_now(world)
    assert (await world.gc()).record.marked == 2
    await world.store.delete(keys.RAW_RETENTION_KEY)  # the operator changes their mind
    world.clock.advance(GUARDED.mark_grace_s + 1)
    outcome = await world.gc()  # the proof finds the hour no longer retired: withdrawn
    assert outcome.deleted == [] and await world.keys_under(keys.GC_MARKS_PREFIX) == []
    for accepted in (a, b, c):
        assert await world.exists(accepted.manifest.raw_blob_key)


async def test_a_run_retires_at_most_its_batch_budget_and_the_next_goes_on() -> None:
    world, (a, _b, _c), _conflict = await accepted_world()
    first_hour = a.manifest.accepted_hour
    world.clock.advance(HOUR_S)  # the next hour
    later = [await world.accept(frame_bytes(400 + seq), seq=seq) for seq in (10, 11)]
    world.clock.advance(4 * HOUR_S)
    await audit_now(world)
    await include(world, *(r.manifest for r in (a, _b, _c, *later)))
    advance = RawRetentionAdvance(raw_days=RAW_DAYS, settle_margin_s=5.0, max_batches_per_run=2)
    first = await retire(world, advance)  # the first hour (3 batches) goes whole, then stop
    assert first is not None and first.retired_before == first_hour.next().iso
    assert first.retired_batches == 3
    second = await retire(world, advance)
    assert second is not None and second.retired_batches == 5
    assert (
        second.retired_before
        == keys.UtcHour.from_unix_ns(
            world.clock.now_ns() - int(RAW_DAYS * 86_400 * keys.NS_PER_S)
        ).iso
    )  # every hour up to the raw_days cutoff (the later ones hold no batch)
