"""Rollup runs and the index's work markers (PROTOCOL §3.7, §4), with Spark: a run's
store requests do not grow with the history, and a marker is deleted only after the
committed pointer was read back, so a failure between the commit and the delete
re-plans to nothing new and counts nothing twice."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from protocol import keys
from protocol.clock import ManualClock
from rollup.job.run import RunSummary, run_rollup
from rollup.read.verify import verify
from rollup.table.commit import load_latest
from rollup.table.ledger import read_ledger
from rollup.table.owner import OwnerLease
from rollup.table.storage import StoreAccess
from store.base import ObjectStore
from store.counting import CountingStore
from store.errors import Unavailable
from store.fs import FileSystemStore
from tests.rollup.conftest import (
    DATA_START_NS,
    SentFrame,
    accept,
    assert_rollup_equal,
    committed_rollup,
    expected_rollup,
    make_frame,
    settings,
)
from tests.rollup.dataset_builder import (
    catalog_manifests,
    commit_rows,
    hour_at,
    make_batch,
    work_markers,
)

S = 1_000_000_000


async def run_on(spark: SparkSession, store: ObjectStore) -> RunSummary:
    # A lease long enough that no renewal (a matter of wall time) falls inside a run.
    return await run_rollup(
        spark,
        store,
        access=StoreAccess(store.url),
        settings=settings(owner_lease_ttl_s=3600.0),
        job_id="marker-test",
    )


def frames(count: int, *, first_seq: int, accepted_hour: keys.UtcHour) -> list[SentFrame]:
    return [
        make_frame(
            [(DATA_START_NS + (seq + i) * S, "m", float(seq + i), None) for i in range(2)],
            agent_id="agent-new",
            seq_start=seq,
            accepted_at_ns=accepted_hour.start_ns + seq * S,
        )
        for seq in range(first_seq, first_seq + 2 * count, 2)
    ]


async def rolled_up_history(store: FileSystemStore, hours: int, per_hour: int = 5) -> None:
    """``hours`` accepted hours cataloged and committed, their markers consumed."""
    clock = ManualClock(hour_at(hours + 2).start_ns)
    owner = await OwnerLease.acquire(store, "history", 600, clock)
    batches = [make_batch(hour_at(h), n) for h in range(hours) for n in range(per_hour)]
    for batch in batches:
        await store.put(batch.manifest.manifest_key, batch.manifest.to_json())
    await catalog_manifests(store, [b.manifest for b in batches], markers=False)
    await commit_rows(store, owner, clock, ledger=[b.row for b in batches])
    await owner.release()


async def test_a_run_over_new_batches_costs_the_same_on_ten_times_the_history(
    spark: SparkSession, tmp_path: Path
) -> None:
    costs = []
    for history_hours in (2, 20):
        inner = FileSystemStore(tmp_path / f"history-{history_hours}")
        await rolled_up_history(inner, history_hours)
        new = frames(100, first_seq=0, accepted_hour=hour_at(history_hours))
        await accept(inner, new)
        store = CountingStore(inner)

        summary = await run_on(spark, store)

        assert summary.outcome == "committed" and summary.batches == 100, summary
        history_prefixes = tuple(
            keys.index_catalog_hour_prefix(hour_at(h)) for h in range(history_hours)
        )
        assert not [k for _, k in store.requests if k.startswith(history_prefixes)]
        assert not [k for _, k in store.requests if k in (keys.INDEX_CATALOG_PREFIX, "")]
        assert not store.count("list", keys.ACCEPTED_PREFIX) and not store.count("get", "accepted/")
        assert await work_markers(inner) == []
        costs.append((Counter(op for op, _ in store.requests), sum(store.listed.values())))
    assert costs[0] == costs[1], costs


class ReadbackFails(CountingStore):
    """The first GET of the rollup pointer after the pointer was written fails: the
    process lost the store (or died) between its commit and the markers' deletion."""

    async def get(self, key: str) -> tuple[bytes, str]:
        if key == keys.ROLLUP_POINTER_KEY and ("put", key) in self.requests:
            if not any(op == "failed-readback" for op, _ in self.requests):
                self.requests.append(("failed-readback", key))
                raise Unavailable("get", key, "connection reset after the commit")
        return await super().get(key)


class MarkerDeletesFail(CountingStore):
    async def delete(self, key: str) -> None:
        if key.startswith(keys.ROLLUP_WORK_PREFIX):
            raise Unavailable("delete", key, "503 SlowDown")
        await super().delete(key)


async def assert_exactly_once(store: FileSystemStore, sent: list[SentFrame]) -> None:
    latest = await load_latest(store)
    assert latest is not None
    ledger = Counter((await read_ledger(store, latest.snapshot))["manifest_id"].to_pylist())
    assert ledger == Counter(f.manifest_id for f in sent)  # each batch exactly once
    assert_rollup_equal(await committed_rollup(store), expected_rollup(sent))
    assert (await verify(store)).ok and (await verify(store, from_manifests=True)).ok


async def test_markers_are_deleted_only_after_the_committed_pointer_is_read_back(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    first = frames(2, first_seq=0, accepted_hour=hour_at(0)) + frames(
        1, first_seq=100, accepted_hour=hour_at(1)
    )
    await accept(fs_store, first)
    store = CountingStore(fs_store)
    assert (await run_on(spark, store)).version == 1
    pointer_put = store.requests.index(("put", keys.ROLLUP_POINTER_KEY))
    readback = store.requests.index(("get", keys.ROLLUP_POINTER_KEY), pointer_put)
    deletes = [
        i
        for i, (op, k) in enumerate(store.requests)
        if op == "delete" and k.startswith(keys.ROLLUP_WORK_PREFIX)
    ]
    assert len(deletes) == 2 and min(deletes) > readback

    # The pointer read-back fails after the commit: the markers stay ...
    second = frames(3, first_seq=200, accepted_hour=hour_at(1))
    await accept(fs_store, second)
    with pytest.raises(Unavailable):
        await run_on(spark, ReadbackFails(fs_store))
    latest = await load_latest(fs_store)
    assert latest is not None and latest.snapshot.version == 2  # ... though it committed
    assert len(await work_markers(fs_store)) == 1
    # ... and the next run re-plans their hour to nothing new, and consumes them.
    again = await run_on(spark, fs_store)
    assert again.outcome == "up-to-date" and again.hours_checked == 1
    assert await work_markers(fs_store) == []
    await assert_exactly_once(fs_store, first + second)

    # Deleting the markers fails after the commit: harmless, the same way.
    third = frames(2, first_seq=300, accepted_hour=hour_at(2))
    await accept(fs_store, third)
    assert (await run_on(spark, MarkerDeletesFail(fs_store))).version == 3
    assert len(await work_markers(fs_store)) == 1
    assert (await run_on(spark, fs_store)).outcome == "up-to-date"
    assert await work_markers(fs_store) == []
    await assert_exactly_once(fs_store, first + second + third)
