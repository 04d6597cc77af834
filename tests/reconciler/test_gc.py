"""GC deletes only what is provably garbage (PROTOCOL §3.5), proven from the index (§3.7):
real collectors' acceptance, the real steady pass and full audit, on a memory store driven by
an injected clock."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import random
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from collector.accept import Accepted, BatchAcceptor, IdentityConflictFound
from config import GcSettings, ReconcilerSettings, Settings
from index.log_writer import IndexLogWriter
from index.rows import blob_row
from protocol import keys, records
from protocol.bundle import encode_bundle
from protocol.clock import ManualClock, SystemClock
from protocol.frame import decode_header
from protocol.frame_encode import encode_frame, points_table
from reconciler.audit.run import run_full_audit
from reconciler.context import Fence, ReconcilerContext, open_context
from reconciler.daemon import Reconciler
from reconciler.gc import GarbageCollector, GcPolicy, GcRefused
from reconciler.gc.log import read_gc_log
from reconciler.gc.run import latest_listing_audit
from reconciler.metrics import ReconcilerMetrics
from reconciler.steady import OrphanSuspects, SteadyScanner
from store.base import ObjectStore, SignedDelete
from store.errors import NotFound, Unavailable
from store.lease import LeaseLost
from store.memory import MemoryStore
from store.retry import Backoff
from tests.reconciler.conftest import make_settings

NS = 1_000_000_000
LEASE_TTL_S = 30.0
HOUR_S = 3600.0
POLICY = GcPolicy(
    retry_horizon_s=2 * HOUR_S, mark_grace_s=600.0, max_delete_fraction=1.0, settle_s=60.0
)
BOOT = uuid.UUID("5f0c7a3e-1d2b-4c3a-9e8f-0123456789ab")


@dataclass(frozen=True)
class Header:
    agent_id: str
    boot_id: uuid.UUID
    seq_start: int
    seq_end: int
    record_count: int


def frame_bytes(n: int, seq: int | None = None) -> bytes:
    """A valid frame of agent-a's boot ``BOOT``, one point, sequence ``seq`` (default
    ``n``); another ``n`` with the same ``seq`` is a conflicting frame of one identity.
    The GC's proof reads a blob's identity from its header (PROTOCOL §3.5 rule 7)."""
    table = points_table([1_760_000_000 * NS + n], ["cpu"], [float(n)], [None])
    return encode_frame(
        agent_id="agent-a", boot_id=BOOT, seq_start=n if seq is None else seq, points=table
    )


def header_of(body: bytes) -> Header:
    header = decode_header(body)
    return Header(header.agent_id, header.boot_id, header.seq_start, header.seq_end, 1)


def sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


class FlakyStore(MemoryStore):
    """A memory store whose requests on the keys in ``failing`` answer 503."""

    failing: set[str]

    def _check(self, op: str, key: str) -> None:
        if key in self.failing:
            raise Unavailable(op, key, "503 SlowDown (scripted)")

    async def get(self, key: str) -> tuple[bytes, str]:
        self._check("get", key)
        return await super().get(key)

    async def put(self, key: str, body: bytes, **kwargs: Any) -> str:
        self._check("put", key)
        return await super().put(key, body, **kwargs)


def gc_settings(policy: GcPolicy) -> Settings:
    return Settings(
        reconciler=ReconcilerSettings(lease_ttl_s=30.0, concurrency=4, verify_rate_per_s=1e6),
        gc=GcSettings(
            enabled=True,
            retry_horizon_s=policy.retry_horizon_s,
            mark_grace_s=policy.mark_grace_s,
            max_delete_fraction=policy.max_delete_fraction,
        ),
    )


class World:
    """Collectors (acceptors with an index log), the steady pass feeding orphan suspects,
    the real audit, and the GC under test."""

    def __init__(self, policy: GcPolicy = POLICY, *, store: ObjectStore | None = None) -> None:
        self.policy = policy
        self.clock = ManualClock()
        self.store = store or FlakyStore(clock=self.clock)
        self.store.failing = set()  # type: ignore[attr-defined]
        self.log = IndexLogWriter(
            store=self.store, clock=self.clock, rng=random.Random(5), writer_id="c"
        )
        self.suspects = OrphanSuspects()
        self.audits_run = 0
        self.events: dict[str, int] = {}
        self._ctx: ReconcilerContext | None = None

    async def ctx(self) -> ReconcilerContext:
        if self._ctx is None:
            opened = await open_context(
                self.store,
                settings=gc_settings(self.policy),
                clock=self.clock,
                rng=random.Random(1),
                metrics=ReconcilerMetrics(clock=self.clock),
            )
            self._ctx = dataclasses.replace(
                opened,
                gc_suspects=self.suspects.take_older_than,
                recently_referenced=self.suspects.recently_referenced,
            )
        return self._ctx

    async def audit(self) -> records.AuditRecord:
        self.audits_run += 1
        return await run_full_audit(await self.ctx())

    async def collector(
        self, fence: Fence | None = None, delete_store: Any = None
    ) -> GarbageCollector:
        """The GC under test, fenced by the world's lease (or ``fence``)."""
        fence = fence or (await self.ctx()).fence
        return GarbageCollector(
            store=self.store,
            clock=self.clock,
            policy=self.policy,
            latest_audit=lambda: latest_listing_audit(  # as `reconciler.gc.run` wires it
                self.store, inventory_proves=self.policy.inventory_lag_s is not None
            ),
            fence=fence.check,
            lease=fence.term,
            delete_store=delete_store,
            observe=lambda e, n: self.events.__setitem__(e, self.events.get(e, 0) + n),
            suspects=self.suspects.take_older_than,
            recently_referenced=self.suspects.recently_referenced,
        )

    async def gc(
        self, *, dry_run: bool = False, delete_store: Any = None, audit: bool = False
    ) -> Any:
        """Flush the collectors' log, run the steady pass, with ``audit`` a scheduled full
        audit (the daemon's order), then one GC run (which never starts an audit)."""
        await self.log.flush()
        await SteadyScanner(await self.ctx(), self.suspects).run_pass()
        if audit:
            await self.audit()
        audits = await self.keys_under(keys.RECONCILER_AUDITS_PREFIX)
        outcome = await (await self.collector(delete_store=delete_store)).run(dry_run=dry_run)
        assert await self.keys_under(keys.RECONCILER_AUDITS_PREFIX) == audits  # none started
        return outcome

    async def gc_log(self) -> list[records.GcLogEntry]:
        return await read_gc_log(self.store)

    async def orphan(self, body: bytes, *, logged: bool = True) -> str:
        """A blob a collector created and then crashed before the manifest."""
        digest = sha(body)
        await self.store.put(keys.raw_blob_key(digest), body)
        if logged:
            self.log.append(blob_row(digest, self.clock.now_ns()))
        return digest

    def acceptor(self, seq: int, clock: Any = None) -> BatchAcceptor:
        return BatchAcceptor(
            store=self.store,
            collector_id="collector-t",
            clock=clock or self.clock,
            rng=random.Random(seq),
            index_log=self.log,
            backoff=Backoff(attempts=200, base_s=0.001, cap_s=0.005),
        )

    async def accept(self, body: bytes, seq: int | None = None, *, clock: Any = None) -> Accepted:
        """The batch of the frame ``body`` (its header's identity; ``seq`` only seeds)."""
        header = header_of(body)
        result = await self.acceptor(header.seq_start, clock).accept(header, body, sha(body))
        assert isinstance(result, Accepted)
        return result

    async def exists(self, key: str) -> bool:
        try:
            await self.store.head(key)
        except NotFound:
            return False
        return True

    async def keys_under(self, prefix: str) -> list[str]:
        return [info.key async for info in self.store.list(prefix)]


async def test_orphan_is_marked_then_deleted_only_after_grace_and_a_later_audit() -> None:
    world = World()
    digest = await world.orphan(frame_bytes(1))
    world.clock.advance(3 * HOUR_S)
    first = await world.gc()
    assert first.record.marked == 1 and first.deleted == []
    assert await world.exists(keys.gc_mark_key(digest))
    world.clock.advance(POLICY.mark_grace_s - 1)
    assert (await world.gc()).deleted == []  # grace not over yet
    assert await world.exists(keys.raw_blob_key(digest))
    world.clock.advance(2)
    assert (await world.gc()).deleted == []  # the GC never starts an audit (rule 5) ...
    assert world.audits_run == 0  # (world.gc checks that no audit record appeared)
    second = await world.gc(audit=True)  # ... a candidate waits for the next scheduled one
    assert second.deleted == [digest]
    assert not await world.exists(keys.raw_blob_key(digest))
    assert not await world.exists(keys.gc_mark_key(digest))
    log_keys = await world.keys_under(keys.GC_LOG_PREFIX)
    assert len(log_keys) == 1 and log_keys[0].endswith(".parquet")  # one file per run
    [entry] = await world.gc_log()
    assert entry.frame_sha256 == digest and entry.audit_started_at_unix_ns > entry.marked_at_unix_ns
    assert world.events["deletions"] == 1


async def test_an_orphan_bundle_its_blob_row_nominates_is_marked_under_its_bundle_key() -> None:
    """A bundle only its ``blob`` log row nominates (its collector crashed before any
    manifest) is a suspect with its bundle key: marked under that key (PROTOCOL §3.10), not
    its hash's frame blob (which rule 7 would find gone and withdraw, leaving the bundle to
    a later audit's orphan file), and deleted after the next scheduled audit."""
    world = World()
    bundle = encode_bundle([frame_bytes(1), frame_bytes(2)])
    await world.store.put(bundle.key, bundle.data)
    world.log.append(blob_row(bundle.sha256, world.clock.now_ns(), bundle=True))
    world.clock.advance(3 * HOUR_S)
    assert (await world.gc()).record.marked == 1
    body, _etag = await world.store.get(keys.gc_mark_key(bundle.sha256))
    assert records.GcMark.from_json(body).raw_blob_key == bundle.key
    world.clock.advance(POLICY.mark_grace_s + 1)
    assert (await world.gc(audit=True)).deleted == [bundle.sha256]
    assert not await world.exists(bundle.key)
    assert not await world.exists(keys.gc_mark_key(bundle.sha256))


async def test_referenced_blob_is_never_marked() -> None:
    world = World()
    accepted = await world.accept(frame_bytes(2), seq=1)
    world.clock.advance(3 * HOUR_S)
    await world.audit()
    for _ in range(3):
        await world.gc()
        world.clock.advance(POLICY.mark_grace_s + 1)
    assert await world.exists(accepted.manifest.raw_blob_key)
    assert await world.keys_under(keys.GC_MARKS_PREFIX) == []


async def test_blob_whose_accepted_log_row_was_lost_is_marked_but_never_deleted() -> None:
    world = World()
    accepted = await world.accept(frame_bytes(3), seq=1)
    world.log._buffer = [r for r in world.log._buffer if r.kind == "blob"]  # the crash
    world.clock.advance(3 * HOUR_S)
    marked = await world.gc()
    assert marked.record.marked == 1  # looks like an orphan: no record row named it
    world.clock.advance(POLICY.mark_grace_s + 1)
    second = await world.gc(audit=True)
    assert second.deleted == [] and second.would_delete == []
    assert await world.exists(accepted.manifest.raw_blob_key)  # the audit found the manifest
    assert await world.keys_under(keys.GC_MARKS_PREFIX) == []  # the mark was withdrawn


async def test_young_blobs_are_left_alone() -> None:
    world = World()
    digest = await world.orphan(frame_bytes(4))
    world.clock.advance(POLICY.retry_horizon_s / 2)
    await world.audit()
    assert (await world.gc()).record.candidates == 0
    assert not await world.exists(keys.gc_mark_key(digest))


async def test_quarantined_blobs_are_kept() -> None:
    world = World()
    await world.accept(frame_bytes(5, seq=9))
    other = frame_bytes(6, seq=9)
    result = await world.acceptor(9).accept(header_of(other), other, sha(other))
    assert isinstance(result, IdentityConflictFound)
    world.clock.advance(3 * HOUR_S)
    await world.audit()
    for _ in range(2):
        await world.gc()
        world.clock.advance(POLICY.mark_grace_s + 1)
    assert await world.exists(keys.raw_blob_key(sha(other)))
    assert await world.keys_under(keys.GC_MARKS_PREFIX) == []


async def test_resending_old_content_during_gc_vetoes_the_deletion() -> None:
    world = World()
    body = frame_bytes(7)
    digest = await world.orphan(body)  # a collector wrote the blob, then crashed
    world.clock.advance(3 * HOUR_S)
    await world.gc()
    assert await world.exists(keys.gc_mark_key(digest))
    accepted = await world.accept(body, seq=5)  # the agent re-sends the identical frame
    assert await world.exists(keys.gc_veto_key(digest))
    world.clock.advance(POLICY.mark_grace_s + 1)
    outcome = await world.gc()
    assert outcome.deleted == []
    assert (await world.store.get(accepted.manifest.raw_blob_key))[0] == body


async def test_a_veto_is_retired_with_its_mark_after_a_later_audit() -> None:
    world = World()
    body = frame_bytes(70)
    digest = await world.orphan(body)
    world.clock.advance(3 * HOUR_S)
    await world.gc()
    await world.accept(body, seq=70)  # veto: the blob is referenced now
    world.clock.advance(POLICY.mark_grace_s + 1)
    await world.gc(audit=True)  # an audit started after veto + grace: the veto is settled
    assert not await world.exists(keys.gc_veto_key(digest))
    assert not await world.exists(keys.gc_mark_key(digest))
    assert await world.exists(keys.raw_blob_key(digest))
    world.clock.advance(3 * HOUR_S)
    await world.audit()
    assert (await world.gc()).record.marked == 0  # referenced: never marked again


class RaceStore(MemoryStore):
    """Runs a callback at one point of the GC's deletion: right after the mark turns
    "deleting" (``after_cas``), or just before the blob itself is deleted (``before_delete``)."""

    trigger: str = ""
    callback: object = None

    async def _fire(self, point: str) -> None:
        if self.trigger == point and self.callback is not None:
            callback, self.callback = self.callback, None
            await callback()  # type: ignore[operator]

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        etag = await super().put(key, body, if_none_match=if_none_match, if_match=if_match)
        if key.startswith(keys.GC_MARKS_PREFIX) and b'"deleting"' in body:
            await self._fire("after_cas")
        return etag

    async def delete(self, key: str) -> None:
        if key.startswith(keys.RAW_BLOBS_PREFIX):
            await self._fire("before_delete")
        await super().delete(key)


@pytest.mark.parametrize(("trigger", "gc_deletes"), [("after_cas", False), ("before_delete", True)])
async def test_resend_racing_the_deletion_never_acknowledges_a_deleted_blob(
    trigger: str, gc_deletes: bool
) -> None:
    clock = ManualClock()
    store = RaceStore(clock=clock)
    world = World(store=store)
    world.clock = clock
    body = frame_bytes(8)
    digest = await world.orphan(body)
    world.clock.advance(3 * HOUR_S)
    await world.gc()
    world.clock.advance(POLICY.mark_grace_s + 1)
    pending: list[asyncio.Task[Accepted]] = []

    async def resend() -> None:
        # The collector's request arrives while the deletion is under way; let it run
        # until it blocks on the store (it waits for the mark to go).
        pending.append(asyncio.create_task(world.accept(body, seq=6, clock=SystemClock())))
        await asyncio.sleep(0.05)

    store.trigger, store.callback = trigger, resend
    outcome = await world.gc(audit=True)
    accepted = await pending[0]
    # after_cas: the veto lands before the GC's last check, so it backs off.
    # before_delete: the GC deletes, and the collector re-creates the blob before answering.
    assert outcome.deleted == ([digest] if gc_deletes else [])
    assert (await world.store.get(accepted.manifest.raw_blob_key))[0] == body
    assert await world.exists(accepted.manifest.manifest_key)
    assert await world.exists(keys.gc_veto_key(digest))


async def test_deletion_guard_refuses_the_whole_run() -> None:
    world = World(GcPolicy(retry_horizon_s=2 * HOUR_S, mark_grace_s=600.0, max_delete_fraction=0.5))
    orphans = [await world.orphan(frame_bytes(10 + i)) for i in range(3)]
    await world.accept(frame_bytes(20), seq=1)
    world.clock.advance(3 * HOUR_S)
    await world.gc()
    world.clock.advance(POLICY.mark_grace_s + 1)
    with pytest.raises(GcRefused, match="would delete 3 of 4 raw blobs"):
        await world.gc(audit=True)
    for digest in orphans:
        assert await world.exists(keys.raw_blob_key(digest))
    assert await world.exists(keys.problem_key("gc-guard", keys.RAW_BLOBS_PREFIX))
    runs = await world.keys_under(keys.RECONCILER_GC_RUNS_PREFIX)
    assert "would delete 3 of 4" in (
        records.GcRunRecord.from_json((await world.store.get(runs[-1]))[0]).refused or ""
    )


async def test_dry_run_writes_nothing_and_reports() -> None:
    world = World()
    digest = await world.orphan(frame_bytes(30))
    world.clock.advance(3 * HOUR_S)
    await world.gc()
    world.clock.advance(POLICY.mark_grace_s + 1)
    await world.audit()
    before = {i.key: i.etag for i in [info async for info in world.store.list("")]}
    outcome = await (await world.collector()).run(dry_run=True)
    after = {i.key: i.etag for i in [info async for info in world.store.list("")]}
    assert before == after
    assert outcome.would_delete == [digest] and outcome.deleted == []


async def test_an_orphan_whose_log_row_was_lost_is_found_by_the_audit_listing() -> None:
    world = World()
    digest = await world.orphan(frame_bytes(40), logged=False)
    world.clock.advance(3 * HOUR_S)
    assert (await world.gc()).record.candidates == 0  # nothing names it yet
    await world.audit()  # the daemon's periodic audit lists raw-blobs/v1/
    assert (await world.gc()).record.marked == 1
    world.clock.advance(POLICY.mark_grace_s + 1)
    assert (await world.gc()).deleted == [digest]


async def test_a_gc_run_makes_no_request_per_blob_beyond_its_candidates() -> None:
    world = World()
    for seq in range(30):
        await world.accept(frame_bytes(100 + seq), seq=100 + seq)
    world.clock.advance(3 * HOUR_S)
    await world.audit()
    await world.log.flush()
    await SteadyScanner(await world.ctx(), world.suspects).run_pass()
    calls: list[str] = []
    for name in ("get", "head", "put", "delete"):
        real = getattr(world.store, name)

        async def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls.append(f"{_name} {args[0]}")
            return await _real(*args, **kw)

        setattr(world.store, name, counted)
    outcome = await (await world.collector()).run()
    assert outcome.record.candidates == 0
    assert not [c for c in calls if keys.RAW_BLOBS_PREFIX in c], calls
    assert len(calls) <= 4, calls  # the run record twice, the audit record, its orphan file


async def test_a_run_reads_none_of_the_marks_it_just_wrote() -> None:
    # A mark this run created is younger than the grace (> 0): reading it back to find
    # it not yet eligible is one GET per candidate for nothing (bench.gc counted it).
    world = World()
    digests = [await world.orphan(frame_bytes(140 + n)) for n in range(3)]
    world.clock.advance(3 * HOUR_S)
    await world.log.flush()
    await SteadyScanner(await world.ctx(), world.suspects).run_pass()
    reads: list[str] = []
    real_get = world.store.get

    async def counted_get(key: str) -> tuple[bytes, str]:
        reads.append(key)
        return await real_get(key)

    world.store.get = counted_get  # type: ignore[method-assign]
    outcome = await (await world.collector()).run()
    assert outcome.record.marked == 3
    assert [key for key in reads if key.startswith(keys.GC_MARKS_PREFIX)] == []
    world.store.get = real_get  # type: ignore[method-assign]
    world.clock.advance(POLICY.mark_grace_s + 1)
    second = await world.gc(audit=True)  # the marks of the first run are read now
    assert sorted(second.deleted) == sorted(digests)


async def test_stale_deleting_mark_is_settled_without_deleting_again() -> None:
    world = World()
    await world.ctx()  # our lease term starts now: a mark with no lease waits a settle from it
    body = frame_bytes(50)
    digest = sha(body)
    await world.store.put(keys.raw_blob_key(digest), body)  # re-created by a collector
    mark = records.GcMark(
        frame_sha256=digest,
        raw_blob_key=keys.raw_blob_key(digest),
        marked_at_unix_ns=world.clock.now_ns(),
        gc_run_id="old",
        state="deleting",
        deleting_since_unix_ns=world.clock.now_ns(),
    )
    await world.store.put(keys.gc_mark_key(digest), mark.to_json())
    world.clock.advance(POLICY.settle_s + 1)
    await world.gc()
    assert await world.exists(keys.raw_blob_key(digest))
    assert not await world.exists(keys.gc_mark_key(digest))


async def test_unparseable_manifest_problem_blocks_every_deletion() -> None:
    from reconciler.gc.run import unresolved_manifest_problems

    world = World()
    digest = await world.orphan(frame_bytes(60))
    world.clock.advance(3 * HOUR_S)
    await world.gc()
    problem = records.ProblemRecord(
        kind="unparseable-manifest",
        subject_key="accepted/v1/x.json",
        detail="bad json",
        first_seen_unix_ns=1,
        last_seen_unix_ns=1,
    )
    await world.store.put(
        keys.problem_key("unparseable-manifest", "accepted/v1/x.json"), problem.to_json()
    )
    world.clock.advance(POLICY.mark_grace_s + 1)
    collector = await world.collector()
    collector._deletion_blocker = lambda: unresolved_manifest_problems(world.store)
    await world.log.flush()
    await world.audit()
    with pytest.raises(GcRefused, match="unparseable-manifest problems are recorded"):
        await collector.run()
    assert await world.exists(keys.raw_blob_key(digest))
    await world.store.delete(keys.problem_key("unparseable-manifest", "accepted/v1/x.json"))
    assert (await world.gc()).deleted == [digest]


async def test_a_failed_request_skips_one_candidate_and_the_run_goes_on() -> None:
    world = World()
    store: FlakyStore = world.store  # type: ignore[assignment]
    unlucky = await world.orphan(frame_bytes(40))
    lucky = await world.orphan(frame_bytes(41))
    world.clock.advance(3 * HOUR_S)
    await world.audit()
    store.failing = {keys.gc_mark_key(unlucky)}
    first = await world.gc()
    assert (first.record.marked, first.record.skipped_on_error) == (1, 1)
    assert await world.exists(keys.gc_mark_key(lucky))
    assert not await world.exists(keys.gc_mark_key(unlucky))  # skipped: nothing decided
    store.failing = set()
    await world.audit()  # a new audit's orphans are considered again
    assert (await world.gc()).record.marked == 1  # the next run picks it up
    world.clock.advance(POLICY.mark_grace_s + 1)
    store.failing = {keys.gc_mark_key(lucky)}  # now its deletion's mark CAS fails
    second = await world.gc()
    assert second.deleted == [unlucky] and second.record.skipped_on_error >= 1
    store.failing = set()
    assert await world.exists(keys.raw_blob_key(lucky))
    assert (await world.gc()).deleted == [lucky]


async def test_too_many_failed_requests_stop_the_run() -> None:
    policy = GcPolicy(
        retry_horizon_s=2 * HOUR_S, mark_grace_s=600.0, max_delete_fraction=1.0, max_item_errors=1
    )
    world = World(policy)
    store: FlakyStore = world.store  # type: ignore[assignment]
    digests = [await world.orphan(frame_bytes(50 + i)) for i in range(3)]
    world.clock.advance(3 * HOUR_S)
    store.failing = {keys.gc_mark_key(d) for d in digests}
    with pytest.raises(Unavailable):
        await world.gc()
    assert await world.keys_under(keys.GC_MARKS_PREFIX) == []


# --- PROTOCOL §3.5 rule 6 and the epoch rule ---------------------------------------------


class StallingSigner:
    """The GC's delete store: its first ``sign_delete`` stalls (a credentials refresh, a
    pause) until ``resume`` is set. The stall falls after the deleter's last fence check."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.stalled = asyncio.Event()
        self.resume = asyncio.Event()
        self.sent: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        if not self.stalled.is_set():
            self.stalled.set()
            await self.resume.wait()
        return await self.inner.sign_delete(key, expires_in_s=expires_in_s)

    async def send_signed_delete(self, request: SignedDelete) -> None:
        self.sent.append(request.key)
        await self.inner.send_signed_delete(request)


async def test_a_stalled_former_leader_cannot_delete_a_blob_a_resend_relies_on() -> None:
    world = World()
    body = frame_bytes(70)
    digest = await world.orphan(body)
    world.clock.advance(3 * HOUR_S)
    await world.gc()  # marked
    world.clock.advance(LEASE_TTL_S + POLICY.mark_grace_s + 1)  # the world's lease lapses too
    await world.audit()  # proves it an orphan (the world's own lease, renewed)
    world.clock.advance(LEASE_TTL_S + 1)
    old_fence = await Fence.acquire(
        world.store, owner="gc-old", ttl_s=LEASE_TTL_S, clock=world.clock, rng=random.Random(1)
    )
    signer = StallingSigner(world.store)
    old = await world.collector(old_fence, signer)
    old_leader = asyncio.create_task(old.run())
    await signer.stalled.wait()  # the mark is "deleting"; the old leader hangs in signing
    mark = records.GcMark.from_json((await world.store.get(keys.gc_mark_key(digest)))[0])
    assert mark.state == "deleting" and mark.lease_epoch == old_fence.epoch

    world.clock.advance(LEASE_TTL_S + POLICY.settle_s + 10)  # a takeover, and a settle time
    new_fence = await Fence.acquire(
        world.store, owner="gc-new", ttl_s=LEASE_TTL_S, clock=world.clock, rng=random.Random(2)
    )
    assert new_fence.epoch == old_fence.epoch + 1
    await (await world.collector(new_fence)).run()  # resolves the stale mark: blob still there
    assert not await world.exists(keys.gc_mark_key(digest)) or (
        records.GcMark.from_json((await world.store.get(keys.gc_mark_key(digest)))[0]).state
        == "marked"
    )
    accepted = await world.accept(body, seq=70)  # a re-send, acknowledged against that blob

    signer.resume.set()
    with pytest.raises(LeaseLost):  # ... at its next fence check, before writing anything
        await old_leader  # wakes with a signed DELETE its recorded lease no longer covers
    assert signer.sent == []  # discarded, never sent
    assert (await world.store.get(accepted.manifest.raw_blob_key))[0] == body


async def test_a_deleting_mark_of_an_older_epoch_waits_for_that_lease_to_expire() -> None:
    world = World()
    now = world.clock.now_ns()
    bodies = [frame_bytes(80), frame_bytes(81)]
    for body in bodies:
        await world.store.put(keys.raw_blob_key(sha(body)), body)
    recorded_expiry = now + int(300 * NS)  # an older leader's long lease
    with_lease = records.GcMark(
        frame_sha256=sha(bodies[0]),
        raw_blob_key=keys.raw_blob_key(sha(bodies[0])),
        marked_at_unix_ns=now,
        gc_run_id="older",
        state="deleting",
        deleting_since_unix_ns=now,
        lease_epoch=1,
        lease_expires_at_unix_ns=recorded_expiry,
    )
    # Written before marks recorded their lease: its DELETE was unsigned.
    legacy = json.loads(with_lease.to_json())
    for field_name in ("lease_epoch", "lease_expires_at_unix_ns"):
        del legacy[field_name]
    legacy.update(frame_sha256=sha(bodies[1]), raw_blob_key=keys.raw_blob_key(sha(bodies[1])))
    await world.store.put(keys.gc_mark_key(sha(bodies[0])), with_lease.to_json())
    await world.store.put(keys.gc_mark_key(sha(bodies[1])), json.dumps(legacy).encode())
    world.clock.advance(100)
    await world.ctx()  # our term begins after the older lease

    world.clock.advance(POLICY.settle_s + 1)  # settled since "deleting_since" ...
    await world.gc()
    assert await world.exists(keys.gc_mark_key(sha(bodies[0])))  # ... not since its lease
    assert not await world.exists(keys.gc_mark_key(sha(bodies[1])))  # since our term began
    world.clock.advance((recorded_expiry - world.clock.now_ns()) / NS + POLICY.settle_s + 1)
    await world.gc()
    assert not await world.exists(keys.gc_mark_key(sha(bodies[0])))
    for body in bodies:
        assert await world.exists(keys.raw_blob_key(sha(body)))  # never deleted again


async def test_a_delete_the_store_refused_withdraws_its_mark() -> None:
    world = World()
    digest = await world.orphan(frame_bytes(90))
    world.clock.advance(3 * HOUR_S)
    await world.gc()
    world.clock.advance(POLICY.mark_grace_s + 1)

    class SlowNetwork(MemoryStore):
        async def send_signed_delete(self, request: SignedDelete) -> None:
            world.clock.advance(POLICY.delete_expiry_s + 1)  # it arrives after its expiry
            await super().send_signed_delete(request)

    slow = SlowNetwork(clock=world.clock)
    slow._objects, slow._order = world.store._objects, world.store._order  # one store
    assert (await world.gc(delete_store=slow, audit=True)).deleted == []
    assert await world.exists(keys.raw_blob_key(digest))  # refused: RequestExpired
    assert not await world.exists(keys.gc_mark_key(digest))  # collectors need not wait


# --- vetoes that have done their work ----------------------------------------------------


async def veto(world: World, digest: str) -> None:
    record = records.GcVeto(
        frame_sha256=digest, vetoed_at_unix_ns=world.clock.now_ns(), collector_id="c"
    )
    await world.store.put(keys.gc_veto_key(digest), record.to_json(), if_none_match=True)


async def test_vetoes_of_referenced_or_gone_blobs_are_removed_after_the_grace_and_an_audit() -> (
    None
):
    world = World()
    referenced = await world.accept(frame_bytes(100), seq=100)
    gone = sha(frame_bytes(101))  # vetoed, then the blob went away
    for digest in (referenced.manifest.frame_sha256, gone):
        await veto(world, digest)
    world.clock.advance(POLICY.mark_grace_s - 1)
    await world.audit()
    await world.gc()
    assert len(await world.keys_under(keys.GC_VETOES_PREFIX)) == 2  # younger than the grace
    world.clock.advance(2)
    await world.gc()
    assert len(await world.keys_under(keys.GC_VETOES_PREFIX)) == 2  # no audit after the grace
    await world.audit()
    await world.gc()
    assert await world.keys_under(keys.GC_VETOES_PREFIX) == []
    assert await world.exists(referenced.manifest.raw_blob_key)


async def test_a_vetoed_orphan_is_marked_again_after_a_later_audit_and_deleted() -> None:
    world = World()
    body = frame_bytes(110)
    digest = await world.orphan(body)
    world.clock.advance(3 * HOUR_S)
    await world.gc()  # marked
    half = POLICY.mark_grace_s / 2
    world.clock.advance(half)
    await veto(world, digest)  # a collector saw it in use ... and its request failed
    world.clock.advance(half + 1)
    await world.gc(audit=True)  # the mark is vetoed: withdrawn; the veto is young
    assert not await world.exists(keys.gc_mark_key(digest))
    world.clock.advance(half)
    await world.gc()  # the veto is older than the grace, but no audit came after it
    assert await world.exists(keys.gc_veto_key(digest))
    await world.audit()  # one that started after veto + grace: still no reference
    await world.gc()  # the veto goes, and the blob is marked from the new audit's orphans
    assert not await world.exists(keys.gc_veto_key(digest))
    await world.gc()
    assert await world.exists(keys.gc_mark_key(digest))
    world.clock.advance(POLICY.mark_grace_s + 1)
    assert (await world.gc()).deleted == [digest]


async def test_a_disabled_gc_still_resolves_stale_deleting_marks() -> None:
    world = World()
    body = frame_bytes(120)
    await world.store.put(keys.raw_blob_key(sha(body)), body)
    now = world.clock.now_ns()
    stale = records.GcMark(
        frame_sha256=sha(body),
        raw_blob_key=keys.raw_blob_key(sha(body)),
        marked_at_unix_ns=now,
        gc_run_id="crashed",
        state="deleting",
        deleting_since_unix_ns=now,
        lease_epoch=1,
        lease_expires_at_unix_ns=now + int(LEASE_TTL_S * NS),
    )
    await world.store.put(keys.gc_mark_key(sha(body)), stale.to_json())
    world.clock.advance(LEASE_TTL_S + 300)  # past its lease and any settle time
    settings = make_settings()
    assert not settings.gc.enabled
    reconciler = Reconciler(
        store=world.store, settings=settings, clock=world.clock, rng=random.Random(5)
    )
    await reconciler.run_once()
    assert not await world.exists(keys.gc_mark_key(sha(body)))  # collectors stop waiting
    assert await world.exists(keys.raw_blob_key(sha(body)))  # and nothing was deleted


async def test_an_unreadable_mark_is_reported_and_removed_after_the_settle_time() -> None:
    world = World()
    await world.ctx()  # our lease term starts now
    kept, gone = frame_bytes(130), frame_bytes(131)
    await world.store.put(keys.raw_blob_key(sha(kept)), kept)
    for digest in (sha(kept), sha(gone)):
        await world.store.put(keys.gc_mark_key(digest), b'{"schema": "lightmetrics.gc_mark.v1", ')
    await world.gc()
    problems = await world.keys_under(f"{keys.RECONCILER_PROBLEMS_PREFIX}unreadable-gc-mark/")
    assert len(problems) == 2
    assert await world.exists(keys.gc_mark_key(sha(kept)))  # a deletion may still be under way
    world.clock.advance(POLICY.settle_s - 1)
    await world.gc()
    assert await world.exists(keys.gc_mark_key(sha(kept)))
    world.clock.advance(2)
    await world.gc()
    for digest in (sha(kept), sha(gone)):
        assert not await world.exists(keys.gc_mark_key(digest))
    assert await world.keys_under(f"{keys.RECONCILER_PROBLEMS_PREFIX}unreadable-gc-mark/") == []
    assert await world.exists(keys.raw_blob_key(sha(kept)))  # never deleted on that mark
    logged = [entry.frame_sha256 for entry in await world.gc_log()]
    assert logged == [sha(gone)]  # gone under the unreadable mark: the deletion is recorded
    accepted = await world.accept(kept, seq=130)  # collectors no longer wait on it
    assert (await world.store.get(accepted.manifest.raw_blob_key))[0] == kept


# --- PROTOCOL §3.5 rule 6: the store's deadline is the literal X-Amz-Date + E ---------------


class SignerAhead(MemoryStore):
    """The GC role's store whose signatures carry a date from a clock running ahead of
    the store's (botocore signs with the local clock); the store takes a request until
    its own clock passes that literal date plus the expiry, as S3 does."""

    ahead_s = 120.0

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        signed = await super().sign_delete(key, expires_in_s=expires_in_s)
        return dataclasses.replace(
            signed, signed_at_unix_ns=signed.signed_at_unix_ns + int(self.ahead_s * NS)
        )


async def test_a_signer_clock_two_minutes_ahead_sends_no_delete_past_the_recorded_lease() -> None:
    world = World()
    digest = await world.orphan(frame_bytes(140))
    world.clock.advance(3 * HOUR_S)
    await world.gc()
    world.clock.advance(POLICY.mark_grace_s + 1)
    await world.audit()
    signer = SignerAhead(clock=world.clock)
    signer._objects, signer._order = world.store._objects, world.store._order  # one store
    sent: list[SignedDelete] = []
    real_send = signer.send_signed_delete

    async def send(request: SignedDelete) -> None:
        sent.append(request)
        await real_send(request)

    signer.send_signed_delete = send  # type: ignore[method-assign]
    outcome = await world.gc(delete_store=signer)
    # The store would have taken that DELETE until 2 min + E past the signing, long after
    # the lease (30 s) the deleting mark recorded: it is discarded unsent.
    assert sent == [] and outcome.deleted == []
    assert await world.exists(keys.raw_blob_key(digest))
    assert not await world.exists(keys.gc_mark_key(digest))  # withdrawn: nobody waits


class SlowSecondProof(FlakyStore):
    """Reading ``slow_key`` while its mark is ``deleting`` (the second proof) takes until
    ``left_s`` before the lease recorded on that mark expires, as a bundle's second proof
    of about two manifest reads per frame can (bench.gc: 20 of 1,000 bundles waited a
    whole audit cycle more)."""

    slow_key = ""
    mark_key = ""
    left_s = 2.0
    marks_at_send: list[records.GcMark]

    async def get(self, key: str) -> tuple[bytes, str]:
        if key == self.slow_key:
            with contextlib.suppress(NotFound):
                mark = records.GcMark.from_json((await super().get(self.mark_key))[0])
                if mark.state == "deleting" and mark.lease_expires_at_unix_ns is not None:
                    due_ns = mark.lease_expires_at_unix_ns - int(self.left_s * NS)
                    self._clock.advance(max(0, due_ns - self._clock.now_ns()) / NS)
        return await super().get(key)

    async def send_signed_delete(self, request: SignedDelete) -> None:
        self.marks_at_send.append(records.GcMark.from_json((await super().get(self.mark_key))[0]))
        await super().send_signed_delete(request)


async def test_a_second_proof_that_outlasts_the_recorded_lease_records_the_renewed_one() -> None:
    clock = ManualClock()
    store = SlowSecondProof(clock=clock)
    world = World(store=store)
    world.clock = clock
    digest = await world.orphan(frame_bytes(150))
    store.slow_key, store.mark_key = keys.raw_blob_key(digest), keys.gc_mark_key(digest)
    store.marks_at_send = []
    world.clock.advance(3 * HOUR_S)
    await world.gc()
    world.clock.advance(POLICY.mark_grace_s + 1)
    outcome = await world.gc(audit=True)
    # 2 s left is less than the signed DELETE needs (5 s): before the fix it was
    # discarded unsent, the mark withdrawn, and the blob kept until a later audit.
    assert outcome.deleted == [digest]
    assert not await world.exists(keys.raw_blob_key(digest))
    assert world.events["lease_rerecorded"] == 1
    [mark] = store.marks_at_send  # the mark the DELETE was sent under records a lease ...
    assert mark.state == "deleting" and mark.lease_expires_at_unix_ns is not None
    # ... that outlives the request (step 2 of reconciler.gc.delete)
    left_ns = mark.lease_expires_at_unix_ns - world.clock.now_ns()
    assert left_ns >= POLICY.lease_a_delete_needs_s * NS


async def test_a_skewed_reconciler_signs_nothing() -> None:
    from reconciler.gc.delete import DeleteOutcome, delete_within_lease

    store = MemoryStore(clock=ManualClock())
    signed: list[str] = []
    real_sign = store.sign_delete

    async def sign(key: str, *, expires_in_s: int) -> SignedDelete:
        signed.append(key)
        return await real_sign(key, expires_in_s=expires_in_s)

    store.sign_delete = sign  # type: ignore[method-assign]
    common = {
        "expires_in_s": 5,
        "lease_expires_at_unix_ns": store._clock.now_ns() + 30 * NS,
        "now_ns": store._clock.now_ns,
        "max_clock_skew_s": 1.0,
        "max_network_delay_s": 2.0,
    }
    skewed = await delete_within_lease(store, "k", skewed=lambda: True, **common)  # type: ignore[arg-type]
    assert skewed is DeleteOutcome.SKEWED and signed == []
    fine = await delete_within_lease(store, "k", skewed=lambda: False, **common)  # type: ignore[arg-type]
    assert fine is DeleteOutcome.DELETED and signed == ["k"]


async def test_a_gc_whose_clock_is_off_the_stores_deletes_nothing() -> None:
    from datetime import UTC, datetime
    from email.utils import format_datetime

    from store.time import ClockOffset, StoreClock

    world = World()
    digest = await world.orphan(frame_bytes(141))
    world.clock.advance(3 * HOUR_S)
    await world.gc()
    world.clock.advance(POLICY.mark_grace_s + 1)
    await world.audit()
    await world.log.flush()
    await SteadyScanner(await world.ctx(), world.suspects).run_pass()
    offset = ClockOffset(max_skew_s=10.0)
    now = world.clock.now_ns()
    store_date = datetime.fromtimestamp(now / NS + 120, UTC)  # the store runs 2 min ahead
    offset.observe(format_datetime(store_date, usegmt=True), sent_ns=now, answered_ns=now)
    gc = await world.collector()
    gc._work.clock = StoreClock(world.clock, offset)
    assert gc._work.clock.skewed
    outcome = await gc.run()
    assert outcome.deleted == [] and await world.exists(keys.raw_blob_key(digest))
    assert await world.exists(keys.gc_mark_key(digest))  # kept for a run with a sound clock
