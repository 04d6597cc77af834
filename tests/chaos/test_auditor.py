"""The auditor catches each kind of violation it exists for (and passes a sound store,
cataloged by the reconciler's own full audit)."""

from __future__ import annotations

import hashlib
import random
import time
import uuid

from agent import BatchResult, DeliveryRecord, Outcome
from agent.truth import BatchKind, TruthRecord
from chaos.auditor import CheckResult, audit, gc_coverage
from chaos.clock_checks import STAMP_SLACK_S, check_stamps
from chaos.load import Ack, AckBook, FrameFacts
from chaos.report import AuditRound, RunReport
from chaos.rollup_check import skipped
from config import GcSettings, ReconcilerSettings, Settings
from index.catalog import CatalogWriter
from index.rows import accepted_row
from protocol import keys, records
from protocol.clock import ManualClock
from reconciler.audit.run import run_full_audit
from reconciler.context import open_context
from reconciler.gc.log import encode_gc_log
from rollup.table.ledger import LedgerRow
from rollup.table.owner import OwnerLease
from store.base import ObjectInfo
from store.memory import MemoryStore
from tests.rollup.dataset_builder import commit_rows

BOOT = uuid.UUID("11111111-2222-4333-8444-555555555555")


def manifest_for(frame: bytes, seq: int, at_ns: int) -> records.AcceptedManifest:
    sha = hashlib.sha256(frame).hexdigest()
    return records.AcceptedManifest(
        agent_id="agent-audit",
        boot_id=str(BOOT),
        seq_start=seq,
        seq_end=seq,
        record_count=1,
        frame_sha256=sha,
        frame_bytes=len(frame),
        raw_blob_key=keys.raw_blob_key(sha),
        accepted_at_unix_ns=at_ns,
        collector_id="collector-audit",
    )


class World:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.store = MemoryStore(clock=self.clock)
        self.book = AckBook()
        self.manifests: list[records.AcceptedManifest] = []

    async def accepted(self, seq: int, *, ack: bool = True) -> records.AcceptedManifest:
        frame = f"LMB1 audited frame number {seq} ".encode() * 3
        manifest = manifest_for(frame, seq, self.clock.now_ns())
        await self.store.put(manifest.raw_blob_key, frame)
        await self.store.put(manifest.manifest_key, manifest.to_json())
        self.book.frames[manifest.frame_sha256] = FrameFacts(1, float(seq))
        if ack:
            self.ack(manifest.identity, manifest.frame_sha256)
        self.manifests.append(manifest)
        return manifest

    def ack(
        self, identity: keys.BatchIdentity, sha: str, *, sent: float = 0.0, answered: float = 0.1
    ) -> None:
        self.book.acks.append(Ack(identity, sha, sha, None, False, sent, answered))

    async def reconcile(self) -> None:
        """A completed full audit: the reconciler catalogs every record (with markers)."""
        settings = Settings(
            reconciler=ReconcilerSettings(lease_ttl_s=60.0, verify_rate_per_s=1000.0),
            gc=GcSettings(enabled=False),
        )
        ctx = await open_context(
            self.store, settings=settings, clock=self.clock, rng=random.Random(1), owner="r"
        )
        assert (await run_full_audit(ctx)).status == "completed"
        await ctx.fence.release()
        self.clock.advance(1.0)

    async def checks(
        self, windows: list[tuple[float, float]] | None = None, *, reconcile: bool = True
    ) -> dict[str, CheckResult]:
        if reconcile:
            await self.reconcile()
        _view, results = await audit(self.store, self.book, windows or [])
        return {c.name: c for c in results}


def failed(results: dict[str, CheckResult]) -> set[str]:
    return {name for name, c in results.items() if c.status == "failed"}


async def test_a_sound_store_passes_every_check() -> None:
    world = World()
    for seq in range(5):
        await world.accepted(seq)
    results = await world.checks()
    assert failed(results) == set()
    assert results["nothing_acked_during_outage"].status == "skipped"


async def test_an_acknowledgement_without_its_manifest_is_a_violation() -> None:
    world = World()
    await world.accepted(1)
    ghost = keys.BatchIdentity("agent-audit", BOOT, 99, 99)
    world.ack(ghost, "ab" * 32)
    assert failed(await world.checks()) == {"acks_have_manifests"}


async def test_two_hashes_for_one_identity_are_violations() -> None:
    world = World()
    manifest = await world.accepted(1)
    world.ack(manifest.identity, "cd" * 32)
    assert failed(await world.checks()) == {"acks_have_manifests", "one_hash_per_identity"}


async def test_catalog_gaps_are_violations() -> None:
    world = World()
    first, second = await world.accepted(1), await world.accepted(2)
    await world.reconcile()
    await world.accepted(3)  # after the audit: not cataloged
    stranger = manifest_for(b"a frame nobody stored " * 3, 9, world.clock.now_ns())
    writer = CatalogWriter(store=world.store, clock=world.clock, rng=random.Random(2), epoch=99)
    await writer.write(
        keys.UtcHour.from_unix_ns(stranger.accepted_at_unix_ns),
        [accepted_row(stranger)],
        writer="steady",
    )
    hour = keys.UtcHour.from_unix_ns(world.clock.now_ns())
    await world.store.put(keys.index_catalog_key(hour, 98, 1), b"not parquet")
    for key in [i.key async for i in world.store.list(keys.ROLLUP_WORK_PREFIX)]:
        await world.store.delete(key)  # consumed, but the rollup never included them

    results = await world.checks(reconcile=False)

    assert failed(results) == {"catalog_complete"}
    examples = results["catalog_complete"].violations
    assert results["catalog_complete"].violation_count == 5, examples
    assert sum("not in the catalog" in e for e in examples) == 1
    assert sum("names no record" in e for e in examples) == 1
    assert sum("unreadable catalog file" in e for e in examples) == 1
    unmarked = [e for e in examples if "neither rolled up nor" in e]
    assert sorted(unmarked) == sorted(
        f"{m.manifest_key} is neither rolled up nor in a file a work marker names"
        for m in (first, second)
    )


async def test_markers_consumed_by_a_committed_rollup_are_not_violations() -> None:
    world = World()
    manifests = [await world.accepted(seq) for seq in range(3)]
    await world.reconcile()
    owner = await OwnerLease.acquire(world.store, "rollup", 60.0, world.clock)
    rows = [LedgerRow.of_manifest(m) for m in manifests]
    await commit_rows(world.store, owner, world.clock, ledger=rows)
    for key in [i.key async for i in world.store.list(keys.ROLLUP_WORK_PREFIX)]:
        await world.store.delete(key)  # what the rollup run does after its commit
    assert failed(await world.checks(reconcile=False)) == set()


async def test_gc_coverage_counts_unreferenced_planted_orphans_past_the_horizon() -> None:
    world = World()
    sent = await world.accepted(1)
    now = world.clock.now_ns()
    for frame in (b"old orphan, deleted", b"old orphan, still there", b"young orphan"):
        sha = hashlib.sha256(frame).hexdigest()
        world.book.planted[sha] = now - (10 if frame.startswith(b"young") else 3600) * 10**9
        if b"deleted" not in frame:
            await world.store.put(keys.raw_blob_key(sha), frame)
    world.book.planted[sent.frame_sha256] = now - 3600 * 10**9  # sent after all
    view, _ = await audit(world.store, world.book, [])
    assert gc_coverage(view, world.book, now_ns=now, horizon_s=60.0) == {
        "planted_orphans_past_horizon": 2,
        "planted_orphans_deleted": 1,
    }


async def test_a_deleted_referenced_blob_is_a_violation() -> None:
    world = World()
    manifest = await world.accepted(1)
    await world.store.delete(manifest.raw_blob_key)
    assert failed(await world.checks()) == {"acks_have_manifests", "no_referenced_blob_deleted"}


async def test_a_gc_log_entry_deleting_a_referenced_blob_is_a_violation_even_if_recreated() -> None:
    world = World()
    manifest = await world.accepted(1)
    world.clock.advance(60.0)
    entry = records.GcLogEntry(
        frame_sha256=manifest.frame_sha256,
        raw_blob_key=manifest.raw_blob_key,
        blob_last_modified_ns=0,
        marked_at_unix_ns=world.clock.now_ns(),
        audit_started_at_unix_ns=world.clock.now_ns(),
        deleted_at_unix_ns=world.clock.now_ns(),
        gc_run_id="gc-1",
    )
    key = keys.gc_log_key(world.clock.now_ns(), 1)
    await world.store.put(key, encode_gc_log([entry]))
    assert failed(await world.checks()) == {"no_referenced_blob_deleted"}


async def test_an_acknowledgement_inside_an_outage_is_a_violation() -> None:
    world = World()
    manifest = await world.accepted(1, ack=False)
    now = time.monotonic()
    world.ack(
        manifest.identity, manifest.frame_sha256, sent=now - 10.0, answered=now - 9.0
    )  # before
    world.ack(
        manifest.identity, manifest.frame_sha256, sent=now - 4.0, answered=now - 3.0
    )  # inside
    results = await world.checks([(now - 5.0, now - 1.0)])
    assert failed(results) == {"nothing_acked_during_outage"}
    assert results["nothing_acked_during_outage"].violation_count == 1


def test_skipped_checks_are_not_passed_and_a_report_fails_on_any_violation() -> None:
    report = RunReport("race", 1, 10.0, "/tmp/x")
    report.rounds.append(
        AuditRound(
            0,
            1.0,
            [CheckResult("acks_have_manifests"), *skipped("skipped: rollup not available")],
            {},
        )
    )
    assert report.ok and report.exit_code == 0
    totals = report.check_totals()
    assert totals["rollup_setsums"]["skipped"] == 1 and totals["rollup_setsums"]["passed"] == 0
    assert "skipped: rollup not available" in report.render()
    bad = CheckResult("one_hash_per_identity")
    bad.fail("two hashes")
    report.rounds.append(AuditRound(1, 2.0, [bad], {}))
    assert not report.ok and report.exit_code == 1 and report.violations == 1
    assert "VIOLATION round 1 one_hash_per_identity: two hashes" in report.render()


def delivery(kind: BatchKind, outcome: Outcome, sha: str, seq: int = 1) -> DeliveryRecord:
    identity = keys.BatchIdentity("agent-audit", BOOT, seq, seq)
    truth = TruthRecord(kind, identity, sha, 1, 1.0)
    status = {Outcome.CONFLICT: 409, Outcome.DEFERRED: 503}.get(outcome, 200)
    result = BatchResult(identity, sha, outcome, 1, status, {}, None, "http://c", None, 0.1)
    return DeliveryRecord("entry", truth, result, 1, 1)


def test_a_recovered_injected_conflict_answered_409_is_expected() -> None:
    book = AckBook()
    book.record(delivery(BatchKind.CONFLICT, Outcome.DEFERRED, "c" * 64))  # still spooled
    book.record(delivery(BatchKind.RECOVERED, Outcome.CONFLICT, "c" * 64))  # the next run
    assert book.take_unexpected() == []
    book.record(delivery(BatchKind.RECOVERED, Outcome.CONFLICT, "d" * 64, seq=2))
    book.record(delivery(BatchKind.RECOVERED, Outcome.ACCEPTED, "c" * 64))
    problems = book.take_unexpected()
    assert len(problems) == 2
    assert "parked as an identity conflict" in problems[0]
    assert "accepted although its identity was already taken" in problems[1]
    assert book.take_unexpected() == []  # each is reported to one audit round only


def test_a_logged_deletion_that_broke_rule_3_or_5_is_a_violation() -> None:
    from chaos.auditor import gc_log_violations

    ns = keys.NS_PER_S
    sound = records.GcLogEntry(
        frame_sha256="ab" * 32,
        raw_blob_key=keys.raw_blob_key("ab" * 32),
        blob_last_modified_ns=100 * ns,
        marked_at_unix_ns=200 * ns,
        audit_started_at_unix_ns=111 * ns,
        deleted_at_unix_ns=210 * ns,
        gc_run_id="gc-1",
    )
    assert gc_log_violations([sound], horizon_s=10.0, grace_s=10.0) == []
    early = sound.model_copy(update={"deleted_at_unix_ns": 209 * ns})
    young = sound.model_copy(update={"audit_started_at_unix_ns": 110 * ns})
    assert [len(gc_log_violations([e], horizon_s=10.0, grace_s=10.0)) for e in (early, young)] == [
        1,
        1,
    ]


def test_a_manifest_stamped_off_the_stores_clock_is_a_violation() -> None:
    """``accepted_at_in_store_time``: from grace + skew + slack before its LastModified to
    skew + slack after, and not a nanosecond beyond either bound."""
    stored_ns = 1_800_000_000 * keys.NS_PER_S
    skew_s, grace_s = 2.0, 6.0
    early_s, late_s = grace_s + skew_s + STAMP_SLACK_S, skew_s + STAMP_SLACK_S

    def stamped(offset_ns: int) -> CheckResult:
        manifest = manifest_for(b"LMB1 stamped frame " * 4, 1, stored_ns + offset_ns)
        info = ObjectInfo(manifest.manifest_key, 100, "etag", stored_ns)
        return check_stamps([(manifest, info)], max_clock_skew_s=skew_s, grace_s=grace_s)

    for inside_s in (-early_s, -1.0, 0.0, late_s):
        assert stamped(int(inside_s * keys.NS_PER_S)).status == "passed", inside_s
    for outside_ns in (-int(early_s * keys.NS_PER_S) - 1, int(late_s * keys.NS_PER_S) + 1):
        assert stamped(outside_ns).status == "failed", outside_ns
    hours_behind = stamped(-5400 * keys.NS_PER_S)
    assert hours_behind.violation_count == 1
    assert "-5400.0s off its LastModified" in hours_behind.violations[0]
