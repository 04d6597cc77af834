"""Retraction on the rollup side (issue 31 item 5, PROTOCOL §3.7 "Retraction", §4, §4.1),
through the real job on the local Spark session.

- (a) a phantom catalog row naming another batch's frame is never counted: the frame's
  header is another identity, so it is left out and a problem is reported;
- (b) a phantom row with a frame of its own (blob present, manifest never created) is
  included; once a ``retracted`` row for its key is cataloged (as the lease holder writes
  it: epoch above the row's, writer ``retraction``, with its work marker), the next run
  removes it in one commit: ``points`` and ``rollup_1m`` hold exactly the real batches,
  its digest moves to ``ledger.retracted``, ``verify`` passes (the whole chain, with the
  real steady pass, audits and retraction command under one live query endpoint whose
  ``sealed_through_ns`` moves on without a restart: `tests.rollup.test_retraction_live_query`);
- (e) the key then really accepted (a row written after the retracted one) is included
  again, counted once, its digest moved back;
- (c) the same in a retired hour and in a late-excluded one (retention, PROTOCOL §4.1):
  the batch has no rows left in any table, so only its digest moves, from the retired
  hour's totals resp. from its hour's ``late_excluded`` part to ``retracted``; the real
  batches' rows stay as they are and ``verify`` passes;
- (d) a batch whose seq range overlaps an included batch of its agent and boot under
  another identity is refused (``overlapping-identity``) and its marker kept.
"""

from __future__ import annotations

import random
from dataclasses import replace

from pyspark.sql import SparkSession

from index.catalog import CatalogWriter
from index.rows import accepted_row
from protocol import keys
from protocol.clock import ManualClock, SystemClock
from protocol.records import AcceptedManifest
from protocol.setsum import Setsum
from rollup.job.run import RunSummary, run_rollup
from rollup.read.verify import verify
from rollup.table.commit import load_latest
from rollup.table.ledger import read_ledger
from rollup.table.manifest_ledger import EMPTY_LEDGER_HOUR, LedgerHour
from rollup.table.storage import StoreAccess
from store.fs import FileSystemStore
from tests.rollup.conftest import (
    DATA_START_NS,
    SentFrame,
    accept,
    assert_rollup_equal,
    committed_rollup,
    expected_index,
    expected_rollup,
    index_rows,
    make_frame,
    read_table,
    run,
    settings,
)
from tests.rollup.dataset_builder import catalog_manifests, put_work_marker, work_markers

S = 1_000_000_000
H = 3600 * S
HOUR = keys.UtcHour.from_unix_ns(DATA_START_NS)


def frame(seq: int, count: int, *, value: float, agent: str = "agent-a") -> SentFrame:
    rows = [(DATA_START_NS + (seq + i) * S, "cpu", value + i, {"host": "h"}) for i in range(count)]
    return make_frame(rows, agent_id=agent, seq_start=seq, accepted_at_ns=DATA_START_NS + seq * S)


async def retract(store: FileSystemStore, manifest: AcceptedManifest, *, epoch: int = 2) -> None:
    """The lease holder's ``retracted`` row for the key (a copy of its row, written after
    it), and the rollup work marker of its catalog file (`reconciler.cataloger`)."""
    row = replace(accepted_row(manifest), kind="retracted", source="retraction")
    writer = CatalogWriter(store=store, clock=SystemClock(), rng=random.Random(epoch), epoch=epoch)
    key = await writer.write(manifest.accepted_hour, [row], writer="retraction")
    await put_work_marker(store, key, rows=1)


async def points_of(store: FileSystemStore) -> list[tuple[str, int]]:
    table = await read_table(store, "points")
    return sorted(
        zip(table.column("agent_id").to_pylist(), table.column("seq").to_pylist(), strict=True)
    )


async def test_a_phantom_row_naming_another_batchs_frame_is_never_counted(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    real = frame(0, 5, value=1.0)
    await accept(fs_store, [real])
    identity = keys.BatchIdentity("agent-x", real.manifest.identity.boot_id, 100, 104)
    phantom = real.manifest.model_copy(
        update={"agent_id": identity.agent_id, "seq_start": 100, "seq_end": 104}
    )
    assert phantom.frame_sha256 == real.sha256 and phantom.identity == identity
    await catalog_manifests(fs_store, [phantom], epoch=2)  # a row, no record behind it

    summary = await run(spark, fs_store)

    assert summary.outcome == "committed" and summary.batches == 1 and summary.points == 5
    (problem,) = summary.problems
    assert problem["kind"] == "identity-mismatch"  # never corrupt-blob: no loss to accept
    assert problem["manifest_id"] == identity.manifest_id
    assert f"the frame is batch {real.manifest_id}" in problem["detail"]
    latest = await load_latest(fs_store)
    assert latest is not None
    ledger = await read_ledger(fs_store, latest.snapshot)
    assert ledger.column("manifest_id").to_pylist() == [real.manifest_id]
    assert await points_of(fs_store) == [("agent-a", s) for s in range(5)]


async def test_a_retracted_phantom_leaves_the_tables_and_comes_back_once_really_accepted(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    real = [frame(0, 5, value=1.0), frame(10, 5, value=100.0)]
    phantom = frame(5, 5, value=1000.0)  # same minute and series as the real ones
    await accept(fs_store, real)
    await fs_store.put(phantom.manifest.raw_blob_key, phantom.frame)  # no manifest created
    await catalog_manifests(fs_store, [phantom.manifest])

    # Store time two days on: the data's day has settled, so its series_day is written.
    clock = ManualClock(DATA_START_NS + 48 * H)
    first = await run(spark, fs_store, clock=clock)
    assert first.batches == 3 and first.points == 15
    assert await index_rows(fs_store, "series_day") == await expected_index(fs_store, by_day=True)
    latest = await load_latest(fs_store)
    assert latest is not None
    ledger = await read_ledger(fs_store, latest.snapshot)
    ranges = dict(zip(ledger["manifest_id"].to_pylist(), ledger["min_ts"].to_pylist(), strict=True))
    assert ranges[phantom.manifest_id] is not None  # the ledger row records the range
    assert_rollup_equal(await committed_rollup(fs_store), expected_rollup([*real, phantom]))

    await retract(fs_store, phantom.manifest)
    second = await run(spark, fs_store, clock=clock)

    assert [r["batches"] for r in second.retracted] == [[phantom.manifest_id]]
    assert second.retracted[0]["points_removed"] == 5
    assert await points_of(fs_store) == [("agent-a", s) for s in (*range(5), *range(10, 15))]
    assert_rollup_equal(await committed_rollup(fs_store), expected_rollup(real))
    # The hour's series rows recomputed from the points left, and the day rewritten.
    assert await index_rows(fs_store, "series") == await expected_index(fs_store)
    assert await index_rows(fs_store, "series_day") == await expected_index(fs_store, by_day=True)
    latest = await load_latest(fs_store)
    assert latest is not None
    snapshot = latest.snapshot
    assert len(snapshot.data_files("series")) == len(snapshot.data_files("series_day")) == 1
    assert [b.manifest_id for b in snapshot.ledger_retracted] == [phantom.manifest_id]
    assert snapshot.ledger_hours[HOUR.iso].batches == 2
    assert snapshot.retracted_hours[HOUR.iso].batches == 1
    ledger = await read_ledger(fs_store, snapshot)
    assert sorted(ledger["manifest_id"].to_pylist()) == sorted(f.manifest_id for f in real)
    report = await verify(fs_store)
    assert report.ok, [h.describe() for h in report.hours]
    assert await work_markers(fs_store) == []
    assert (await run(spark, fs_store, clock=clock)).outcome == "up-to-date"  # nothing moves

    # (e) The store really returns the record now: a row written after the retracted one.
    await fs_store.put(phantom.manifest.manifest_key, phantom.manifest.to_json())
    await catalog_manifests(fs_store, [phantom.manifest], epoch=3)
    third = await run(spark, fs_store, clock=clock)

    assert third.batches == 1 and third.points == 5
    assert await points_of(fs_store) == [("agent-a", s) for s in range(15)]
    # Late into a written day: a new series file and a new series_day file, combined.
    assert await index_rows(fs_store, "series") == await expected_index(fs_store)
    assert await index_rows(fs_store, "series_day") == await expected_index(fs_store, by_day=True)
    assert_rollup_equal(await committed_rollup(fs_store), expected_rollup([*real, phantom]))
    latest = await load_latest(fs_store)
    assert latest is not None
    assert latest.snapshot.ledger_retracted == ()
    assert latest.snapshot.ledger_hours[HOUR.iso].batches == 3
    report = await verify(fs_store)
    assert report.ok, [h.describe() for h in report.hours]


async def test_a_batch_overlapping_an_included_identity_is_refused(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    real = frame(0, 5, value=1.0)
    await accept(fs_store, [real])
    assert (await run(spark, fs_store)).batches == 1
    overlapping = frame(3, 5, value=50.0)  # seq 3..7 against the included 0..4
    await accept(fs_store, [overlapping])

    summary = await run(spark, fs_store)

    assert summary.batches == 0
    (problem,) = summary.problems
    assert problem["kind"] == "overlapping-identity"
    assert problem["manifest_id"] == overlapping.manifest_id
    assert real.manifest_id in problem["detail"]
    assert await points_of(fs_store) == [("agent-a", s) for s in range(5)]
    assert len(await work_markers(fs_store)) == 1  # kept: the next run tries it again
    report = await verify(fs_store)
    assert not report.ok and report.waiting_total == 1


# --- (c) retired and late-excluded hours (retention, PROTOCOL §4.1) -----------------------


def frame_at(
    seq: int, count: int, *, value: float, points_h: float, accepted_h: float
) -> SentFrame:
    """A batch of ``count`` points from ``points_h`` hours after the data start, accepted
    ``accepted_h`` hours after it."""
    start = DATA_START_NS + int(points_h * H)
    rows = [(start + i * S, "cpu", value + i, {"host": "h"}) for i in range(count)]
    return make_frame(rows, seq_start=seq, accepted_at_ns=DATA_START_NS + int(accepted_h * H))


async def run_at(spark: SparkSession, store: FileSystemStore, at_h: float) -> RunSummary:
    """A run at ``at_h`` hours after the data start (store clock): ``points`` keep one
    day, ``rollup_1m`` two."""
    return await run_rollup(
        spark,
        store,
        access=StoreAccess(store.url),
        settings=settings(retention_points_days=1, retention_rollup_1m_days=2),
        clock=ManualClock(DATA_START_NS + int(at_h * H)),
    )


def totals(*frames: SentFrame) -> LedgerHour:
    """The ledger totals of ``frames`` (batches, records, setsum)."""
    hour = EMPTY_LEDGER_HOUR
    for sent in frames:
        digest = Setsum().add(sent.manifest_id, sent.sha256).hex
        hour = hour + LedgerHour(1, sent.manifest.record_count, digest)
    return hour


async def test_c_a_retracted_phantom_in_a_retired_hour(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    real = frame_at(0, 5, value=1.0, points_h=0, accepted_h=0.01)
    phantom = frame_at(5, 5, value=1000.0, points_h=0.001, accepted_h=0.02)  # same minute
    later = frame_at(20, 5, value=7.0, points_h=59, accepted_h=59)
    await accept(fs_store, [real])
    await fs_store.put(phantom.manifest.raw_blob_key, phantom.frame)  # no manifest created
    await catalog_manifests(fs_store, [phantom.manifest])
    first = await run_at(spark, fs_store, 1)
    assert first.batches == 2 and first.points == 10
    assert_rollup_equal(await committed_rollup(fs_store), expected_rollup([real, phantom]))

    # H0+60h: points keep from H0+36h, rollup_1m from H0+12h, so the accepted hour H0 is
    # retired; raw retention has deleted the blobs of its (rolled-up) batches.
    await accept(fs_store, [later])
    second = await run_at(spark, fs_store, 60)
    assert second.batches == 1
    for sent in (real, phantom):
        await fs_store.delete(sent.manifest.raw_blob_key)
    report = await verify(fs_store)
    assert report.ok
    assert {h.hour: h.describe() for h in report.hours}[HOUR.iso] == "retired (2 batches)"

    await retract(fs_store, phantom.manifest)
    third = await run_at(spark, fs_store, 60)

    (removed,) = third.retracted
    assert removed["batches"] == [phantom.manifest_id] and removed["points_removed"] == 0
    assert removed["hours_unrecomputed"] == []  # neither table holds the hour any more
    assert await points_of(fs_store) == [("agent-a", s) for s in range(20, 25)]
    assert_rollup_equal(await committed_rollup(fs_store), expected_rollup([later]))
    latest = await load_latest(fs_store)
    assert latest is not None
    snapshot = latest.snapshot
    (batch,) = snapshot.ledger_retracted
    assert (batch.manifest_id, batch.part) == (phantom.manifest_id, "included")
    assert snapshot.ledger_hours[HOUR.iso] == totals(real)  # the retired hour's totals
    assert snapshot.retracted_hours[HOUR.iso] == totals(phantom)
    ledger = await read_ledger(fs_store, snapshot)
    assert sorted(ledger["manifest_id"].to_pylist()) == sorted(
        [real.manifest_id, later.manifest_id]
    )
    report = await verify(fs_store)
    assert report.ok, [h.describe() for h in report.hours]
    described = {h.hour: h.describe() for h in report.hours}
    assert described[HOUR.iso] == "retired (1 batches); 1 retracted"
    assert await work_markers(fs_store) == []
    assert (await run_at(spark, fs_store, 60)).outcome == "up-to-date"


async def test_c_a_retracted_late_excluded_phantom(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    # An agent replaying its spool: two batches accepted in real's hour whose points fall
    # wholly before both tables' cutoffs at H0+60h (late, excluded); one is a phantom.
    real = frame_at(0, 5, value=1.0, points_h=59, accepted_h=59)  # on time
    late_real = frame_at(10, 5, value=3.0, points_h=0.5, accepted_h=59.005)
    phantom = frame_at(5, 5, value=1000.0, points_h=0.501, accepted_h=59.01)
    await accept(fs_store, [real, late_real])
    await fs_store.put(phantom.manifest.raw_blob_key, phantom.frame)  # no manifest created
    await catalog_manifests(fs_store, [phantom.manifest])
    first = await run_at(spark, fs_store, 60)
    assert first.batches == 3 and first.late_excluded == 2
    assert await points_of(fs_store) == [("agent-a", s) for s in range(5)]  # real's only
    late_hour = phantom.manifest.accepted_hour.iso
    assert late_real.manifest.accepted_hour.iso == late_hour
    latest = await load_latest(fs_store)
    assert latest is not None
    assert latest.snapshot.ledger_late[late_hour] == totals(late_real, phantom)
    assert latest.snapshot.ledger_hours[late_hour] == totals(real, late_real, phantom)

    await retract(fs_store, phantom.manifest)
    second = await run_at(spark, fs_store, 60)

    (removed,) = second.retracted
    assert removed["batches"] == [phantom.manifest_id] and removed["points_removed"] == 0
    assert await points_of(fs_store) == [("agent-a", s) for s in range(5)]
    assert_rollup_equal(await committed_rollup(fs_store), expected_rollup([real]))
    latest = await load_latest(fs_store)
    assert latest is not None
    snapshot = latest.snapshot
    (batch,) = snapshot.ledger_retracted
    assert (batch.manifest_id, batch.part) == (phantom.manifest_id, "late_excluded")
    # Its digest left the hour's late part, not the on-time one: the ledger rows do not
    # say which batches were late, the late part's setsum does.
    assert snapshot.ledger_late[late_hour] == totals(late_real)
    assert snapshot.ledger_hours[late_hour] == totals(real, late_real)
    assert snapshot.retracted_hours[late_hour] == totals(phantom)
    report = await verify(fs_store)
    assert report.ok, [h.describe() for h in report.hours]
    described = {h.hour: h.describe() for h in report.hours}
    assert described[late_hour] == (
        "complete (2 batches, 10 records; 1 late, excluded); 1 retracted"
    )
    assert await work_markers(fs_store) == []
