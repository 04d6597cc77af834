"""The deterministic simulation (acceptance + audit + GC on virtual time), run by
hypothesis over many seeds and shapes, and the regression tests of the bugs it found.

The simulation found two ways a referenced raw blob could be deleted (PROTOCOL §3.5
safety); both are fixed, and each has its simulation seed and a scripted regression:

- BUG-1 (collector/blob_survival.py ``keep_existing_blob``, then in accept.py): after its
  blob PUT got 412, the collector read the GC mark once and took "no mark" as "the blob
  stays". The GC may have finished deleting the blob (and removed the mark) between the
  412 and that read. Fixed: once no mark is left, the blob is proved by a HEAD, or
  created again (If-None-Match) when the HEAD finds nothing.
- BUG-2 (reconciler/gc.py ``_delete_one`` with ``store/s3.py`` retrying deletes): a blob
  DELETE whose first attempt timed out was retried; the GC then removed the mark while
  the first attempt could still land after a collector re-created the blob. Fixed:
  ``S3Store.delete`` never repeats after a lost answer (`OutcomeUnknown`), and the GC
  leaves the mark ``deleting`` for the stale-deletion pass, which waits ``settle_s``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.simulation import SimConfig, simulate
from collector.accept import Accepted, BatchAcceptor
from collector.derived import DerivedWriter
from protocol import derived, keys, records
from protocol.clock import ManualClock
from reconciler.gc import GarbageCollector, GcPolicy
from reconciler.gc_delete import LeaseTerm
from store.base import SignedDelete
from store.errors import NotFound, OutcomeUnknown, PreconditionFailed
from store.memory import MemoryStore
from store.retry import Backoff
from tests.reconciler.test_gc import Audits, Header

worlds = st.builds(
    SimConfig,
    seed=st.integers(0, 2**32 - 1),
    collectors=st.integers(1, 4),
    agents=st.integers(1, 4),
    batches_per_agent=st.integers(1, 6),
    fault_rate=st.sampled_from([0.0, 0.04, 0.1, 0.2]),
    late_rate=st.sampled_from([0.0, 0.04, 0.1]),
    connect_timeout_s=st.sampled_from([0.3, 2.0]),
    gc_interval_s=st.sampled_from([4.0, 9.0, 15.0]),
)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(config=worlds)
def test_simulated_worlds_keep_every_invariant(config: SimConfig) -> None:
    report = simulate(config)
    assert report.ok, (config, report.violations)


def test_a_seed_replays_the_same_world() -> None:
    config = SimConfig(seed=20261121, late_rate=0.1, connect_timeout_s=2.0)
    first, again = simulate(config), simulate(config)
    assert first.stats == again.stats
    assert first.violations == again.violations
    assert first.stats != simulate(dataclasses.replace(config, seed=1)).stats


def test_the_simulation_exercises_the_gc_races() -> None:
    """Coverage, not luck: over a few seeds the GC marks, vetoes, deletes, blobs are
    re-created after deletion, and requests land after their callers gave up."""
    totals: dict[str, int] = {}
    for seed in range(12):
        for name, count in simulate(SimConfig(seed=seed, late_rate=0.1)).stats.items():
            totals[name] = totals.get(name, 0) + count
    for needed in (
        "gc_marked",
        "gc_deleted",
        "vetoes_written",
        "blobs_recreated",
        "late_landings",
        "answer_409",
        "answer_503",
    ):
        assert totals.get(needed, 0) > 0, needed


def test_bug_1_seed_from_the_simulation() -> None:
    # Before the fix: t=37.46 the collector's blob PUT gets 412 (mark "deleting"); t=37.47
    # the GC deletes the blob, t=37.61 removes the mark; t=37.62 the collector reads no
    # mark and goes on; t=37.73 the manifest is created without its blob.
    report = simulate(SimConfig(seed=826))
    assert report.ok, report.violations


def test_bug_2_seed_from_the_simulation() -> None:
    report = simulate(SimConfig(seed=76, connect_timeout_s=2.0, late_rate=0.1))
    assert report.ok, report.violations


# --- scripted regressions -----------------------------------------------------------------

BOOT = uuid.UUID("5f0c7a3e-1d2b-4c3a-9e8f-0123456789ab")
FRAME = b"LMB1 a frame that an earlier attempt left behind as an orphan blob " * 2
SHA = hashlib.sha256(FRAME).hexdigest()


def acceptor(store: object, clock: ManualClock) -> BatchAcceptor:
    return BatchAcceptor(
        store=store,  # type: ignore[arg-type]
        collector_id="collector-regression",
        clock=clock,
        rng=random.Random(1),
        derived=DerivedWriter(store=store, clock=clock, rng=random.Random(2)),  # type: ignore[arg-type]
        backoff=Backoff(attempts=20, base_s=0.001, cap_s=0.01),
    )


async def blob_exists(store: MemoryStore) -> bool:
    try:
        await store.head(keys.raw_blob_key(SHA))
    except NotFound:
        return False
    return True


class GcFinishesRightAfter412(MemoryStore):
    """The GC's deletion (blob deleted, then its mark removed) completes between the
    collector's 412 on the blob and its read of the mark."""

    fired = False

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        try:
            return await super().put(key, body, if_none_match=if_none_match, if_match=if_match)
        except PreconditionFailed:
            if key == keys.raw_blob_key(SHA) and not self.fired:
                self.fired = True
                await self.delete(keys.raw_blob_key(SHA))
                await self.delete(keys.gc_mark_key(SHA))
            raise


async def test_bug_1_blob_deleted_between_the_412_and_the_mark_read() -> None:
    clock = ManualClock()
    store = GcFinishesRightAfter412(clock=clock)
    await store.put(keys.raw_blob_key(SHA), FRAME, if_none_match=True)
    mark = records.GcMark(
        frame_sha256=SHA,
        raw_blob_key=keys.raw_blob_key(SHA),
        marked_at_unix_ns=clock.now_ns(),
        gc_run_id="gc-run",
        state="deleting",  # past the GC's last veto check
    )
    await store.put(keys.gc_mark_key(SHA), mark.to_json(), if_none_match=True)
    result = await acceptor(store, clock).accept(Header("agent-r", BOOT, 0, 0, 1), FRAME, SHA)
    assert isinstance(result, Accepted)  # acknowledged: the manifest exists ...
    assert await blob_exists(store)  # ... so its blob must too


class LostDeleteAnswer:
    """A delete store whose first signed blob DELETE loses its answer (the caller gets
    `OutcomeUnknown`, as from `S3Store.send_signed_delete`) while it is still in flight."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.in_flight: list[SignedDelete] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def send_signed_delete(self, request: SignedDelete) -> None:
        if not self.in_flight:
            self.in_flight.append(request)
            raise OutcomeUnknown(
                "delete", request.key, "read timeout; the request is still in flight"
            )
        await self.inner.send_signed_delete(request)

    async def land_late_attempts(self) -> None:
        for request in self.in_flight:
            await self.inner.send_signed_delete(request)


async def test_bug_2_a_delete_with_a_lost_answer_keeps_the_mark_until_it_settles() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    deletes = LostDeleteAnswer(store)
    audits = Audits(store, clock)
    policy = GcPolicy(
        retry_horizon_s=60.0, mark_grace_s=30.0, max_delete_fraction=1.0, settle_s=10.0
    )

    async def fence() -> None:
        return None

    def lease() -> LeaseTerm:  # kept renewed: 30 s left whenever asked
        return LeaseTerm(1, clock.now_ns() + 30 * 1_000_000_000, 0)

    gc = GarbageCollector(
        store=store,
        clock=clock,
        policy=policy,
        run_audit=audits.run,
        latest_audit=audits.newest,
        fence=fence,
        lease=lease,
        delete_store=deletes,  # type: ignore[arg-type]
    )
    await store.put(keys.raw_blob_key(SHA), FRAME, if_none_match=True)
    entry = derived.raw_blob_by_time_entry(SHA, clock.now_ns())
    await store.put(entry.key, entry.body, if_none_match=True)
    clock.advance(2 * 3600.0)
    assert (await gc.run()).record.marked == 1
    clock.advance(policy.mark_grace_s + 1)
    assert (await gc.run()).deleted == []  # the answer was lost: nothing claimed
    mark = records.GcMark.from_json((await store.get(keys.gc_mark_key(SHA)))[0])
    assert mark.state == "deleting"  # ... and collectors keep waiting for it
    await deletes.land_late_attempts()  # the first attempt lands late (before its expiry)
    clock.advance(30 + policy.settle_s + 1)  # past the lease recorded in the mark + settle
    await gc.run()  # the stale-deletion pass settles it: logged, mark removed
    with pytest.raises(NotFound):
        await store.get(keys.gc_mark_key(SHA))
    assert [info.key async for info in store.list(keys.GC_LOG_PREFIX)]
    result = await acceptor(store, clock).accept(Header("agent-r", BOOT, 0, 0, 1), FRAME, SHA)
    assert isinstance(result, Accepted) and not result.duplicate  # blob re-created (201)
    assert await blob_exists(store)  # and nothing in flight can delete it any more
