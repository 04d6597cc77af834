"""Exactly once under failure: a crash between writing files and committing, a commit on
a stale base (another run committed first), a second owner, a lost lease. Every case
ends with totals equal to what was accepted, each batch in the ledger once."""

from __future__ import annotations

from collections import Counter

import pytest
from pyspark.sql import SparkSession

from protocol import keys
from protocol.clock import ManualClock
from rollup.job.run import RunHooks
from rollup.read.verify import verify
from rollup.table.commit import load_latest
from rollup.table.ledger import read_ledger
from rollup.table.manifest import Changes
from rollup.table.owner import OwnerLease, OwnerLost
from store.fs import FileSystemStore
from store.lease import LeaseHeld
from tests.rollup.conftest import (
    DATA_START_NS,
    SentFrame,
    accept,
    assert_rollup_equal,
    committed_rollup,
    expected_rollup,
    make_frame,
    run,
)

S = 1_000_000_000


def _frames(first_seq: int, count: int, *, agent: str = "agent-x") -> list[SentFrame]:
    return [
        make_frame(
            [
                (DATA_START_NS + (seq + i) * S, "load", float(seq + i), {"a": agent})
                for i in range(5)
            ],
            agent_id=agent,
            seq_start=seq,
        )
        for seq in range(first_seq, first_seq + 5 * count, 5)
    ]


async def _data_keys(store: FileSystemStore) -> set[str]:
    found = set()
    for prefix in (keys.ROLLUP_TABLES_PREFIX, keys.ROLLUP_LEDGER_PREFIX):
        found |= {info.key async for info in store.list(prefix)}
    return found


async def _assert_exact(store: FileSystemStore, frames: list[SentFrame]) -> None:
    assert_rollup_equal(await committed_rollup(store), expected_rollup(frames))
    latest = await load_latest(store)
    assert latest is not None
    ledger = Counter((await read_ledger(store, latest.snapshot))["manifest_id"].to_pylist())
    assert ledger == Counter(f.manifest_id for f in frames)  # each batch exactly once
    assert (await verify(store)).ok


async def test_crash_between_writing_and_committing_leaves_only_orphans(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    frames = _frames(0, 4)
    await accept(fs_store, frames)
    owner = await OwnerLease.acquire(fs_store, "crashing-job", 60.0, ManualClock())
    written: list[Changes] = []

    async def crash(attempt: int, changes: Changes) -> None:
        written.append(changes)
        raise RuntimeError("killed after the files, before the commit")

    with pytest.raises(RuntimeError, match="killed"):
        await run(spark, fs_store, owner=owner, hooks=RunHooks(before_commit=crash))

    assert await load_latest(fs_store) is None  # nothing committed
    orphans = await _data_keys(fs_store)
    (changes,) = written
    assert {f.path for f in changes.added_files} | set(changes.added_ledger_files) == orphans

    # The same job restarts (re-taking its own lease fences the crashed incarnation).
    restarted = await OwnerLease.acquire(fs_store, "crashing-job", 60.0, ManualClock())
    summary = await run(spark, fs_store, owner=restarted)
    assert summary.outcome == "committed" and summary.batches == 4
    await _assert_exact(fs_store, frames)
    latest = await load_latest(fs_store)
    assert latest is not None
    assert not orphans & latest.snapshot.reachable_keys()  # the crashed files stay orphans
    assert orphans <= await _data_keys(fs_store)  # ...until vacuum deletes them


async def test_commit_on_a_stale_base_rebases_without_double_counting(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    first = _frames(0, 3)
    late = _frames(100, 2, agent="agent-y")
    await accept(fs_store, first)
    owner = await OwnerLease.acquire(fs_store, "two-planners", 60.0, ManualClock())
    lost_files: list[Changes] = []

    async def other_run_commits_first(attempt: int, changes: Changes) -> None:
        if attempt == 0:
            lost_files.append(changes)
            # Another planner (same owner) includes the same batches and commits first;
            # then more batches arrive. Our commit is now based on a stale snapshot.
            other = await run(spark, fs_store, owner=owner)
            assert other.outcome == "committed" and other.version == 1
            await accept(fs_store, late)

    summary = await run(
        spark, fs_store, owner=owner, hooks=RunHooks(before_commit=other_run_commits_first)
    )

    assert summary.commit_conflicts == 1 and summary.attempts == 2
    assert summary.outcome == "committed" and summary.version == 2
    assert summary.batches == len(late)  # the rebased plan holds only what was left
    await _assert_exact(fs_store, first + late)
    (lost,) = lost_files
    assert not {f.path for f in lost.added_files} & await _data_keys(fs_store)  # deleted


async def test_a_run_that_loses_the_race_and_finds_nothing_left_commits_nothing(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    frames = _frames(0, 2)
    await accept(fs_store, frames)
    owner = await OwnerLease.acquire(fs_store, "racer", 60.0, ManualClock())

    async def other_commits(attempt: int, changes: Changes) -> None:
        if attempt == 0:
            await run(spark, fs_store, owner=owner)

    summary = await run(spark, fs_store, owner=owner, hooks=RunHooks(before_commit=other_commits))

    assert summary.commit_conflicts == 1 and summary.outcome == "up-to-date"
    latest = await load_latest(fs_store)
    assert latest is not None and latest.snapshot.version == 1
    await _assert_exact(fs_store, frames)


async def test_a_second_owner_stops_while_the_lease_is_held(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    await accept(fs_store, _frames(0, 1))
    await OwnerLease.acquire(fs_store, "the-owner", 60.0, ManualClock(start_ns=10**20))

    with pytest.raises(LeaseHeld):
        await run(spark, fs_store)

    assert await load_latest(fs_store) is None
    assert await _data_keys(fs_store) == set()


async def test_an_owner_taken_over_mid_run_stops_before_committing(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    frames = _frames(0, 3)
    await accept(fs_store, frames)
    clock = ManualClock()
    owner = await OwnerLease.acquire(fs_store, "paused-job", 60.0, clock)
    ours: list[Changes] = []

    async def pause_past_expiry(attempt: int, changes: Changes) -> None:
        ours.append(changes)
        clock.advance(120)  # a GC pause longer than the lease
        successor = await OwnerLease.acquire(fs_store, "successor", 60.0, clock)
        assert (await run(spark, fs_store, owner=successor)).version == 1

    with pytest.raises(OwnerLost):
        await run(spark, fs_store, owner=owner, hooks=RunHooks(before_commit=pause_past_expiry))

    latest = await load_latest(fs_store)
    assert latest is not None and latest.snapshot.version == 1 and latest.snapshot.owner_epoch == 2
    await _assert_exact(fs_store, frames)
    (changes,) = ours
    assert not {f.path for f in changes.added_files} & await _data_keys(fs_store)
