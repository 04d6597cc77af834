"""Retraction on the rollup side (issue 31 item 5, PROTOCOL §3.7 "Retraction", §4, §4.1),
through the real job on the local Spark session.

- (a) a phantom catalog row naming another batch's frame is never counted: the frame's
  header is another identity, so it is left out and a problem is reported;
- (b) a phantom row with a frame of its own (blob present, manifest never created) is
  included; once a ``retracted`` row for its key is cataloged (as the lease holder writes
  it: epoch above the row's, writer ``retraction``, with its work marker), the next run
  removes it in one commit: ``points`` and ``rollup_1m`` hold exactly the real batches,
  its digest moves to ``ledger.retracted``, ``verify`` passes;
- (e) the key then really accepted (a row written after the retracted one) is included
  again, counted once, its digest moved back;
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
from protocol.clock import SystemClock
from protocol.records import AcceptedManifest
from rollup.read.verify import verify
from rollup.table.commit import load_latest
from rollup.table.ledger import read_ledger
from store.fs import FileSystemStore
from tests.rollup.conftest import (
    DATA_START_NS,
    SentFrame,
    accept,
    assert_rollup_equal,
    committed_rollup,
    expected_rollup,
    make_frame,
    read_table,
    run,
)
from tests.rollup.dataset_builder import catalog_manifests, put_work_marker, work_markers

S = 1_000_000_000
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

    first = await run(spark, fs_store)
    assert first.batches == 3 and first.points == 15
    latest = await load_latest(fs_store)
    assert latest is not None
    ledger = await read_ledger(fs_store, latest.snapshot)
    ranges = dict(zip(ledger["manifest_id"].to_pylist(), ledger["min_ts"].to_pylist(), strict=True))
    assert ranges[phantom.manifest_id] is not None  # the ledger row records the range
    assert_rollup_equal(await committed_rollup(fs_store), expected_rollup([*real, phantom]))

    await retract(fs_store, phantom.manifest)
    second = await run(spark, fs_store)

    assert [r["batches"] for r in second.retracted] == [[phantom.manifest_id]]
    assert second.retracted[0]["points_removed"] == 5
    assert await points_of(fs_store) == [("agent-a", s) for s in (*range(5), *range(10, 15))]
    assert_rollup_equal(await committed_rollup(fs_store), expected_rollup(real))
    latest = await load_latest(fs_store)
    assert latest is not None
    snapshot = latest.snapshot
    assert [b.manifest_id for b in snapshot.ledger_retracted] == [phantom.manifest_id]
    assert snapshot.ledger_hours[HOUR.iso].batches == 2
    assert snapshot.retracted_hours[HOUR.iso].batches == 1
    ledger = await read_ledger(fs_store, snapshot)
    assert sorted(ledger["manifest_id"].to_pylist()) == sorted(f.manifest_id for f in real)
    report = await verify(fs_store)
    assert report.ok, [h.describe() for h in report.hours]
    assert await work_markers(fs_store) == []
    assert (await run(spark, fs_store)).outcome == "up-to-date"  # nothing moves again

    # (e) The store really returns the record now: a row written after the retracted one.
    await fs_store.put(phantom.manifest.manifest_key, phantom.manifest.to_json())
    await catalog_manifests(fs_store, [phantom.manifest], epoch=3)
    third = await run(spark, fs_store)

    assert third.batches == 1 and third.points == 5
    assert await points_of(fs_store) == [("agent-a", s) for s in range(15)]
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
