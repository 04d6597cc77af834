"""``sources.late_batches`` (PROTOCOL §2, `collector.query.late`): a batch accepted after
the seal can carry old points (an agent replaying its spool). The answer over the old
range includes it and counts it, while ``complete`` keeps its meaning (by acceptance
time). The designated collector's follower reads the batch from the index log and its
blob; later the snapshot includes it and its span comes from the catalog row."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from collector.query.late import LateBatches
from collector.query.sources import LogFollower
from index.log_writer import IndexLogWriter
from index.rows import accepted_row
from protocol.keys import UtcHour
from store.base import ObjectStore
from tests.collector.test_live_query import (
    ALL,
    B3,
    B4,
    H1,
    HISTORY_WAIT_S,
    NS,
    A,
    World,
    commit,
    completed_audit,
    json_rows,
    minute,
    oracle_points,
    query_ns,
    secs,
    sent,
    world,
)
from tests.rollup.dataset_builder import catalog_manifests

__all__ = ["world"]  # the fixture, imported to be used here
H2 = H1.next()


async def catalog_and_commit(world: World, batch: Any, span: tuple[int, int]) -> None:
    """``batch`` cataloged with its points' ``span`` and committed in a new snapshot."""
    await catalog_manifests(
        world.store, [batch.manifest], clock=world.clock, ts_ranges={batch.manifest_id: span}
    )
    await commit(world.store, world.clock, [batch])


async def test_a_batch_accepted_after_the_seal_with_old_points_is_counted_late(
    world: World,
) -> None:
    # H0 and H1 are sealed (a listing audit after them) and in snapshot v2.
    await completed_audit(world.store, H2.start_ns + 60 * NS)
    await commit(world.store, world.clock, [B3, B4])
    old, later = query_ns(), query_ns(**{"from": secs(H1.start_ns), "to": secs(H2.start_ns)})
    before = await world.endpoint.answer(old)
    assert before["complete"] and before["sealed_through_ns"] == H2.start_ns
    assert before["sources"]["late_batches"] == 0

    # Accepted in H2 with points in H0; the designated collector follows it from the log.
    world.clock.advance(3600)  # now H2 + 10 s
    replayed = sent([(minute(7), "cpu", 42.0, A)], seq_start=200, accepted_ns=H2.start_ns + 5 * NS)
    await world.store.put(replayed.manifest.raw_blob_key, replayed.body)
    log = IndexLogWriter(store=world.store, clock=world.clock, rng=random.Random(1), writer_id="c1")
    log.append(accepted_row(replayed.manifest, ts_range=(minute(7), minute(7))))
    await log.flush()
    follower = LogFollower(
        world.store, world.window, clock=world.clock, poll_interval_s=1, lookback_s=5,
        max_pending=100, max_raw_bytes=1 << 20,
    )  # fmt: skip
    world.endpoint.follower = follower
    await follower.poll_once()
    assert replayed.manifest_id in world.window

    answer = await world.endpoint.answer(old)
    # complete keeps its meaning: every batch accepted before sealed_through_ns is in.
    assert answer["complete"] and answer["sealed_through_ns"] == H2.start_ns
    assert answer["sources"]["following"] == "designated"
    assert answer["sources"]["late_batches"] == 1  # and its point is in the answer:
    assert answer["rows"] == json_rows(oracle_points([*ALL, replayed]))
    assert answer["sources"]["live_batches"] == 1
    assert (await world.endpoint.answer(later))["sources"]["late_batches"] == 0

    # Rolled up (ledger hour H2, not sealed): counted once, from the catalog row's span.
    await catalog_and_commit(world, replayed, (minute(7), minute(7)))
    answer = await world.endpoint.answer(old)
    assert answer["snapshot_version"] == 3 and answer["sources"]["live_rows"] == 0
    assert answer["complete"] and answer["sources"]["late_batches"] == 1
    assert answer["rows"] == json_rows(oracle_points([*ALL, replayed]))
    assert (await world.endpoint.answer(later))["sources"]["late_batches"] == 0

    # A row written before min_ts_ns/max_ts_ns existed overlaps every range.
    unknown = sent([(minute(9), "cpu", 1.0, A)], seq_start=300, accepted_ns=H2.start_ns + 6 * NS)
    await catalog_manifests(world.store, [unknown.manifest], clock=world.clock)
    await commit(world.store, world.clock, [unknown])
    assert (await world.endpoint.answer(old))["sources"]["late_batches"] == 2
    assert (await world.endpoint.answer(later))["sources"]["late_batches"] == 1


async def test_hours_not_read_count_every_batch(world: World) -> None:
    """Nothing sealed: every committed batch was accepted at or after the seal. With no
    hour read, the ledger's batches all count (never fewer); once read, by span."""
    old = query_ns()
    late = LateBatches(world.endpoint.snapshots, max_hours_read=0)
    snapshot = await world.endpoint.snapshots.latest()
    assert await late.committed(snapshot, sealed_through_ns=0, range_ns=old.points_range_ns) == 2
    reading = LateBatches(world.endpoint.snapshots, wait_s=HISTORY_WAIT_S)
    far = (minute(60 * 24), minute(60 * 25))
    # The fixture's catalog rows have null spans: they overlap even a far range.
    assert await reading.committed(snapshot, sealed_through_ns=0, range_ns=far) == 2
    assert await reading.committed(snapshot, sealed_through_ns=H1.start_ns, range_ns=far) == 0
    # A seal inside H0: H0's batches may have been accepted after it.
    inside = H1.start_ns - 1
    assert await reading.committed(snapshot, sealed_through_ns=inside, range_ns=far) == 2


async def test_an_answer_does_not_wait_for_spans_it_has_not_read(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An hour's spans are read in the background (a busy hour takes seconds): until they
    are, the hour counts every batch (never fewer), and each is read once."""
    import collector.query.late as late_module

    world.clock.advance(3600)
    replayed = sent([(minute(7), "cpu", 42.0, A)], seq_start=200, accepted_ns=H2.start_ns + 5 * NS)
    await catalog_and_commit(world, replayed, (minute(7), minute(7)))
    snapshot = await world.endpoint.snapshots.latest()
    gate, reads, real = asyncio.Event(), [], late_module.read_hour_spans

    async def gated(store: ObjectStore, hour: UtcHour, included: Any) -> Any:
        reads.append(hour.iso)
        await gate.wait()
        return await real(store, hour, included)

    monkeypatch.setattr(late_module, "read_hour_spans", gated)
    late = LateBatches(world.endpoint.snapshots, wait_s=0.05)
    far = (minute(60 * 24), minute(60 * 25))  # the replayed batch's point is not in it

    async def count() -> int:
        found = late.committed(snapshot, sealed_through_ns=H2.start_ns, range_ns=far)
        return await asyncio.wait_for(found, 30)

    assert await count() == 1  # not read yet: its one batch may overlap
    gate.set()
    for _ in range(600):  # answers until the read the gate let through is done
        if await count() == 0:
            break
    assert await count() == 0 and reads == [H2.iso]
    await late.close()


async def test_a_failed_span_read_reaches_an_answer_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure other than the store's (here the disk) is not lost in the background: the
    answer waiting for the read gets it (a 503 at the endpoint), and the next reads again."""
    import collector.query.late as late_module

    snapshot = await world.endpoint.snapshots.latest()
    failures, real = [OSError(28, "No space left on device")], late_module.read_hour_spans

    async def failing_once(store: ObjectStore, hour: UtcHour, included: Any) -> Any:
        if failures:
            raise failures.pop()
        return await real(store, hour, included)

    monkeypatch.setattr(late_module, "read_hour_spans", failing_once)
    late = LateBatches(world.endpoint.snapshots, wait_s=HISTORY_WAIT_S)
    far = (minute(60 * 24), minute(60 * 25))
    with pytest.raises(OSError, match="No space left"):
        await late.committed(snapshot, sealed_through_ns=0, range_ns=far)
    # The fixture's rows have null spans: read, they overlap even a far range.
    assert await late.committed(snapshot, sealed_through_ns=0, range_ns=far) == 2
    await late.close()
