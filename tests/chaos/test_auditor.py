"""The auditor catches each kind of violation it exists for (and passes a sound store)."""

from __future__ import annotations

import hashlib
import time
import uuid

from agent import BatchResult, DeliveryRecord, Outcome
from agent.truth import BatchKind, TruthRecord
from chaos.auditor import CheckResult, audit
from chaos.load import Ack, AckBook, FrameFacts
from chaos.report import AuditRound, RunReport
from chaos.rollup_check import skipped
from protocol import derived, keys, records
from protocol.clock import ManualClock
from store.memory import MemoryStore

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
        for entry in derived.manifest_backfill(manifest):
            await self.store.put(entry.key, entry.body)
        self.book.frames[manifest.frame_sha256] = FrameFacts(1, float(seq))
        if ack:
            self.ack(manifest.identity, manifest.frame_sha256)
        self.manifests.append(manifest)
        return manifest

    def ack(
        self, identity: keys.BatchIdentity, sha: str, *, sent: float = 0.0, answered: float = 0.1
    ) -> None:
        self.book.acks.append(Ack(identity, sha, sha, None, False, sent, answered))

    async def checks(
        self, windows: list[tuple[float, float]] | None = None
    ) -> dict[str, CheckResult]:
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


async def test_missing_and_dangling_derived_entries_are_violations() -> None:
    world = World()
    kept = await world.accepted(1)
    await world.accepted(2)
    by_blob = keys.accepted_by_blob_key(kept.frame_sha256, kept.identity)
    await world.store.delete(by_blob)
    stray = keys.accepted_by_time_key(
        keys.UtcHour.from_unix_ns(0), keys.BatchIdentity("x", BOOT, 1, 1)
    )
    await world.store.put(stray, b"{}")
    results = await world.checks()
    assert failed(results) == {"derived_indexes_complete"}
    assert results["derived_indexes_complete"].violation_count == 2


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
    key = keys.gc_log_key(keys.UtcHour.from_unix_ns(world.clock.now_ns()), manifest.frame_sha256)
    await world.store.put(key, entry.to_json())
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
