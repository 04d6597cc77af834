"""Committing snapshots: the pointer CAS is the commit point, on the fs store and MiniStack."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from chaos.faulty_store import Fault, FaultyStore
from protocol.clock import ManualClock
from protocol.keys import ROLLUP_MANIFESTS_PREFIX, ROLLUP_POINTER_KEY
from rollup.lifecycle.vacuum import vacuum
from rollup.read.history import history
from rollup.table.commit import (
    STALE_ETAG,
    CommitConflict,
    LoadedSnapshot,
    VersionNotFound,
    commit,
    delete_uncommitted,
    load_latest,
    load_version,
    walk_snapshots,
)
from rollup.table.manifest import Changes, RollupInvariantError
from rollup.table.owner import OwnerLease, OwnerLost
from store.base import ObjectStore
from store.errors import NotFound, OutcomeUnknown, Unavailable
from store.fs import FileSystemStore
from store.retry import Backoff
from store.s3 import S3Store
from tests.rollup.dataset_builder import commit_rows, hour_at, make_batch, points
from tests.s3_servers import RunningServer, fresh_bucket


@pytest.fixture
def clock() -> ManualClock:
    """The process clock, shared with the store. On MiniStack store time is the server's
    (`store.time`): whatever this reads, ages and leases there follow MiniStack's clock."""
    return ManualClock(hour_at(2).start_ns)


@pytest.fixture(params=["fs", pytest.param("ministack", marks=pytest.mark.s3)])
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[ObjectStore]:
    """A fresh store: the filesystem store, or a bucket on MiniStack (atomic If-Match)."""
    store: ObjectStore
    if request.param == "fs":
        store = FileSystemStore(tmp_path / "store", clock=clock)
    else:
        server: RunningServer = request.getfixturevalue("ministack_server")
        store = S3Store(
            bucket=fresh_bucket(server),
            prefix="rollup-test",
            endpoint_url=server.endpoint_url,
            connect_timeout_s=2.0,
            read_timeout_s=30.0,
            clock=clock,
        )
    try:
        yield store
    finally:
        await store.close()


def clock_ahead(clock: ManualClock, seconds: float) -> ManualClock:
    """A caller clock ``seconds`` ahead of the process clock: it sees store time that much
    later (`store.time`), on MiniStack too, whose own clock no test can move."""
    return ManualClock(clock.now_ns() + int(seconds * 1e9))


async def keys_under(store: ObjectStore, prefix: str) -> list[str]:
    return [info.key async for info in store.list(prefix)]


async def one_commit(
    store: ObjectStore, owner: OwnerLease, clock: ManualClock, n: int
) -> LoadedSnapshot:
    batch = make_batch(hour_at(0), n)
    return await commit_rows(
        store,
        owner,
        clock,
        data=[("points", hour_at(0), points(hour_at(0), 3, seq_start=n))],
        ledger=[batch.row],
    )


async def test_first_commit_creates_the_pointer_and_later_ones_swap_it(
    backend: ObjectStore, clock: ManualClock
) -> None:
    store = FaultyStore(backend)
    owner = await OwnerLease.acquire(store, "job-1", 600, clock)
    assert await load_latest(store) is None
    creates = store.calls["put_if_none_match"]
    one = await one_commit(store, owner, clock, 0)
    # Lease, snapshot and pointer are created with If-None-Match; nothing is swapped yet.
    assert store.calls["put_if_none_match"] == creates + 2
    assert store.calls["put_if_match"] == 0
    body, _ = await store.get(ROLLUP_POINTER_KEY)
    assert json.loads(body) == {
        "schema": "lightmetrics.rollup_pointer.v1",
        "version": 1,
        "manifest_key": one.manifest_key,
    }
    two = await one_commit(store, owner, clock, 1)
    assert store.calls["put_if_match"] == 1  # the pointer swap
    assert two.snapshot.previous_manifest_key == one.manifest_key
    latest = await load_latest(store)
    assert latest == two
    assert two.snapshot.owner_epoch == owner.epoch == 1
    old = await load_version(store, 1)
    assert old.snapshot == one.snapshot and old.pointer_etag == STALE_ETAG
    assert [s.version async for s in walk_snapshots(store)] == [2, 1]
    with pytest.raises(VersionNotFound):
        await load_version(store, 3)


async def test_concurrent_commits_from_one_base_have_exactly_one_winner(
    backend: ObjectStore, clock: ManualClock
) -> None:
    owner = await OwnerLease.acquire(backend, "job-1", 600, clock)
    for _ in ("the pointer's create", "the pointer's swap"):
        base = await load_latest(backend)
        attempts = [
            commit(backend, base=base, changes=Changes(), owner=owner, clock=clock)
            for _ in range(4)
        ]
        results = await asyncio.gather(*attempts, return_exceptions=True)
        winners = [r for r in results if isinstance(r, LoadedSnapshot)]
        losers = [r for r in results if isinstance(r, CommitConflict)]
        assert len(winners) == 1 and len(losers) == 3, results
        latest = await load_latest(backend)
        assert latest is not None and latest.snapshot == winners[0].snapshot
        # The losers' snapshots can never be reachable: they were deleted.
        for loser in losers:
            with pytest.raises(NotFound):
                await backend.get(loser.orphan_key)
    assert (
        await keys_under(backend, ROLLUP_MANIFESTS_PREFIX)
        == [s.manifest_key async for s in walk_snapshots(backend)][::-1]
    )


@pytest.mark.parametrize("op", ["put_if_none_match", "put_if_match"])
async def test_a_lost_pointer_answer_is_recognised_as_committed(
    backend: ObjectStore, clock: ManualClock, op: str
) -> None:
    store = FaultyStore(backend)
    owner = await OwnerLease.acquire(store, "job-1", 600, clock)
    if op == "put_if_match":
        await one_commit(store, owner, clock, 0)
    store.script(op, ROLLUP_POINTER_KEY, Fault.LOST_REPLY)
    committed = await one_commit(store, owner, clock, 1)
    assert store.injected[(op, Fault.LOST_REPLY)] == 1
    assert await load_latest(store) == committed


async def test_transient_pointer_faults_are_retried(
    backend: ObjectStore, clock: ManualClock
) -> None:
    store = FaultyStore(backend)
    owner = await OwnerLease.acquire(store, "job-1", 600, clock)
    await one_commit(store, owner, clock, 0)
    store.script(
        "put_if_match",
        ROLLUP_POINTER_KEY,
        Fault.CONFLICT,
        Fault.UNAVAILABLE,
        Fault.UNKNOWN_NOT_APPLIED,
    )
    store.script("put_if_none_match", ROLLUP_MANIFESTS_PREFIX, Fault.LOST_REPLY, Fault.UNAVAILABLE)
    committed = await one_commit(store, owner, clock, 1)
    assert await load_latest(store) == committed
    assert committed.snapshot.version == 2


async def test_exhausted_retries_report_what_is_known(
    backend: ObjectStore, clock: ManualClock
) -> None:
    store = FaultyStore(backend)
    owner = await OwnerLease.acquire(store, "job-1", 600, clock)
    base = await one_commit(store, owner, clock, 0)
    short = Backoff(attempts=2, base_s=0.0, cap_s=0.0)
    store.script("put_if_match", ROLLUP_POINTER_KEY, Fault.UNAVAILABLE, Fault.UNAVAILABLE)
    with pytest.raises(Unavailable):
        await commit(store, base=base, changes=Changes(), owner=owner, clock=clock, backoff=short)
    store.script("put_if_match", ROLLUP_POINTER_KEY, *[Fault.UNKNOWN_NOT_APPLIED] * 2)
    store.script("get", ROLLUP_POINTER_KEY, *[Fault.UNAVAILABLE] * 2)
    with pytest.raises(OutcomeUnknown):
        await commit(store, base=base, changes=Changes(), owner=owner, clock=clock, backoff=short)
    assert await load_latest(store) == base  # neither landed


class _BuildOnLostCommit(FaultyStore):
    """Applies our pointer swap, lets another commit land on top, then loses the answer."""

    other: OwnerLease | None = None
    clock: ManualClock | None = None
    armed = False

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if not (self.armed and key == ROLLUP_POINTER_KEY):
            return await self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)
        self.armed = False
        await self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)
        assert self.other is not None and self.clock is not None
        await commit(
            self.inner,
            base=await load_latest(self.inner),
            changes=Changes(),
            owner=self.other,
            clock=self.clock,
        )
        raise OutcomeUnknown("put", key, "injected: applied, built upon, answer lost")


async def test_a_lost_answer_whose_commit_was_built_upon_still_counts(
    backend: ObjectStore, clock: ManualClock
) -> None:
    store = _BuildOnLostCommit(backend)
    owner = await OwnerLease.acquire(store, "job-1", 600, clock)
    await one_commit(store, owner, clock, 0)
    store.other, store.clock, store.armed = owner, clock, True
    ours = await one_commit(store, owner, clock, 1)
    assert ours.pointer_etag == STALE_ETAG
    latest = await load_latest(store)
    assert latest is not None and latest.snapshot.version == 3
    assert latest.snapshot.previous_manifest_key == ours.manifest_key
    with pytest.raises(CommitConflict):
        await commit(store, base=ours, changes=Changes(), owner=owner, clock=clock)


class _Crash(Exception):
    pass


class _CrashBeforePointer(FaultyStore):
    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if key == ROLLUP_POINTER_KEY:
            raise _Crash("the process died before the pointer swap")
        return await self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)


async def test_a_crash_before_the_swap_leaves_only_orphans_that_vacuum_removes(
    backend: ObjectStore, clock: ManualClock
) -> None:
    owner = await OwnerLease.acquire(backend, "job-1", 600, clock)
    first = await one_commit(backend, owner, clock, 0)
    with pytest.raises(_Crash):
        await one_commit(_CrashBeforePointer(backend), owner, clock, 1)
    manifests = await keys_under(backend, ROLLUP_MANIFESTS_PREFIX)
    assert len(manifests) == 2  # the orphan snapshot exists ...
    assert await load_latest(backend) == first  # ... and is not visible
    assert [v.version for v in await history(backend)] == [1]
    await owner.release()
    clock.advance(7200)
    report = await vacuum(backend, clock=clock, min_age_s=0, retain_versions=1)
    orphan = next(k for k in manifests if k != first.manifest_key)
    assert orphan in report.deleted
    assert len(report.deleted) == 3  # the orphan snapshot, its data file and ledger file
    assert first.snapshot.reachable_keys() <= set(await keys_under(backend, "rollup/v1/"))
    owner = await OwnerLease.acquire(backend, "job-2", 600, clock)
    again = await one_commit(backend, owner, clock, 1)
    # Version 2 is vacuum's own (the pointer moves before anything is deleted).
    assert report.committed_version == 2
    assert again.snapshot.version == 3 and again.snapshot.ledger_hours[hour_at(0).iso].batches == 2


async def test_a_taken_over_owner_cannot_commit(backend: ObjectStore, clock: ManualClock) -> None:
    old_clock = clock_ahead(clock, 0)
    old = await OwnerLease.acquire(backend, "job-1", 60, old_clock)
    await one_commit(backend, old, old_clock, 0)
    new_clock = clock_ahead(clock, 61)  # the next owner sees the old lease expired
    new = await OwnerLease.acquire(backend, "job-2", 60, new_clock)
    assert new.epoch == old.epoch + 1
    latest = await one_commit(backend, new, new_clock, 1)
    assert latest.snapshot.owner_epoch == 2
    # The old owner's clock has not moved, so its lease looks valid to it; the base's
    # newer epoch fences it out anyway.
    with pytest.raises(OwnerLost, match="epoch 2"):
        await commit(backend, base=latest, changes=Changes(), owner=old, clock=old_clock)
    # Its next renewal finds the record replaced.
    old_clock.advance(31)
    with pytest.raises(OwnerLost, match="lost"):
        await old.check()
    assert await load_latest(backend) == latest


async def test_invariant_errors_write_nothing_and_uncommitted_files_can_be_deleted(
    backend: ObjectStore, clock: ManualClock
) -> None:
    owner = await OwnerLease.acquire(backend, "job-1", 600, clock)
    base = await one_commit(backend, owner, clock, 0)
    before = await keys_under(backend, "rollup/v1/")
    with pytest.raises(RollupInvariantError, match="not in base version 1"):
        await commit(
            backend,
            base=base,
            changes=Changes(removed_files=("rollup/v1/tables/points/x",)),
            owner=owner,
            clock=clock,
        )
    assert await keys_under(backend, "rollup/v1/") == before
    changes = base.snapshot  # files of a commit that we pretend lost
    lost = Changes(
        added_files=changes.data_files("points"), added_ledger_files=changes.ledger_files
    )
    assert await delete_uncommitted(backend, lost) == 2
