"""The rollup job on accepted batches in an fs store: aggregates against an independent
computation (NaN/Inf, first/last ties, late data merged into committed rows), the points
table, rollup work markers, and frames that fail their hash, decode or fetch."""

from __future__ import annotations

import hashlib
import math
import uuid

import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from protocol import keys
from protocol.clock import ManualClock
from protocol.records import ProblemRecord
from rollup.iceberg.publish import table_url
from rollup.job.run import run_rollup
from rollup.lifecycle.lost import acknowledge_lost
from rollup.read import sql
from rollup.read.verify import verify
from rollup.table.commit import load_latest
from rollup.table.ledger import read_ledger
from rollup.table.storage import StoreAccess
from store.fs import FileSystemStore
from store.open import open_store
from tests.rollup.conftest import (
    DATA_START_NS,
    accept,
    assert_rollup_equal,
    committed_rollup,
    expected_rollup,
    make_frame,
    read_table,
    run,
    settings,
)
from tests.rollup.dataset_builder import catalog_manifests, work_markers
from tests.s3_servers import RunningServer

S = 1_000_000_000
MINUTE = 60 * S
BOOT_1 = uuid.UUID("00000000-0000-4000-8000-000000000001")
BOOT_2 = uuid.UUID("00000000-0000-4000-8000-000000000002")
NAN, INF = float("nan"), float("inf")


def _mixed_frames() -> list:
    """Two agents, two boots, several series and hours; NaN/±Inf; samples of different
    batches at the same microsecond (ties broken by agent, boot, seq); a series sent
    with null labels and with an empty map (one series); a minute with no finite value."""
    cpu = {"host": "h1", "cpu": "0"}
    a = [(DATA_START_NS + i * 10 * S, "cpu", float(i), cpu) for i in range(30)]
    a += [
        (DATA_START_NS + 3 * MINUTE + 1_000, "mem", NAN, None),  # a minute of NaN/Inf only
        (DATA_START_NS + 3 * MINUTE + 2_000, "mem", INF, {}),
        (DATA_START_NS + 3 * MINUTE + 3_000, "mem", -INF, None),
        (DATA_START_NS + 59 * MINUTE + 59 * S, "cpu", 7.0, cpu),  # last second of the hour
        (DATA_START_NS + 60 * MINUTE, "cpu", 8.0, cpu),  # first of the next hour
        (DATA_START_NS + 60 * MINUTE + 999, "cpu", 9.0, cpu),  # same µs as the one before
    ]
    tied_ts = DATA_START_NS  # also in `a` (i = 0): four samples at one µs
    b = [(tied_ts, "cpu", 100.0, cpu), (tied_ts + 500, "cpu", -1.5, cpu)]
    b += [(DATA_START_NS + i * S, "req", 1.0, {"path": 'a"b\\c\n'}) for i in range(50)]
    c = [(tied_ts + 999, "cpu", 55.0, cpu), (DATA_START_NS + 2 * MINUTE, "disk", 0.25, None)]
    return [
        make_frame(a, agent_id="agent-b", boot_id=BOOT_1, seq_start=0),
        make_frame(b, agent_id="agent-a", boot_id=BOOT_2, seq_start=10),
        make_frame(c, agent_id="agent-a", boot_id=BOOT_1, seq_start=7),
    ]


async def test_rollup_matches_an_independent_computation(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    frames = _mixed_frames()
    await accept(fs_store, frames)

    summary = await run(spark, fs_store)

    assert summary.outcome == "committed" and summary.version == 1, summary
    assert summary.batches == 3 and summary.points == sum(f.manifest.record_count for f in frames)
    assert summary.problems == []
    got = await committed_rollup(fs_store)
    assert_rollup_equal(got, expected_rollup(frames))
    # The tie at one microsecond: agent-a < agent-b; within agent-a, boot 1 < boot 2.
    tied = got[(DATA_START_NS // 1000, 'cpu{cpu="0",host="h1"}')]
    assert tied["first"] == 55.0 and tied["first_ts"] == DATA_START_NS // 1000
    mem = got[((DATA_START_NS + 3 * MINUTE) // 1000, "mem")]
    assert mem["count"] == 3 and mem["sum"] is None and mem["min"] is None
    assert mem["labels"] is None and mem["metric"] == "mem"
    req = next(v for (_, series), v in got.items() if series.startswith("req"))
    assert dict(req["labels"]) == {"path": 'a"b\\c\n'}

    points = await read_table(fs_store, "points")
    assert points.num_rows == summary.points
    b_rows = points.filter(
        pc.and_(pc.equal(points["agent_id"], "agent-a"), pc.equal(points["boot_id"], str(BOOT_2)))
    )
    assert sorted(b_rows["seq"].to_pylist()) == list(range(10, 10 + 52))
    report = await verify(fs_store)
    assert report.ok, report


async def test_late_batches_merge_into_committed_rows(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    cpu = {"host": "h1"}
    early = make_frame(
        [(DATA_START_NS + i * S, "cpu", float(i), cpu) for i in range(0, 120, 3)],
        agent_id="agent-m",
        boot_id=BOOT_1,
    )
    await accept(fs_store, [early])
    assert (await run(spark, fs_store)).version == 1
    before = await load_latest(fs_store)
    assert before is not None
    old_rollup = {f.path for f in before.snapshot.data_files("rollup_1m")}

    # Late samples: inside committed minutes, tying committed first/last timestamps
    # (from a smaller agent id, so they win the first tie and lose the last), and in a
    # minute of their own.
    late = make_frame(
        [
            (DATA_START_NS, "cpu", -5.0, cpu),  # ties the committed first of minute 0
            (DATA_START_NS + 57 * S, "cpu", NAN, cpu),  # ties the committed last of minute 0
            (DATA_START_NS + 61 * S, "cpu", 1e9, cpu),
            (DATA_START_NS + 10 * MINUTE, "cpu", 2.0, cpu),
        ],
        agent_id="agent-a",
        boot_id=BOOT_2,
    )
    await accept(fs_store, [late])
    summary = await run(spark, fs_store)

    assert summary.outcome == "committed" and summary.version == 2, summary
    assert summary.iceberg_published == [2]  # the run publishes its commit
    assert_rollup_equal(await committed_rollup(fs_store), expected_rollup([early, late]))
    after = await load_latest(fs_store)
    assert after is not None
    assert set(after.snapshot.removed_files) == old_rollup  # superseded, not added to
    assert not old_rollup & {f.path for f in after.snapshot.data_files("rollup_1m")}
    minute0 = (await committed_rollup(fs_store))[(DATA_START_NS // 1000, 'cpu{host="h1"}')]
    assert minute0["first"] == -5.0 and minute0["last"] == 57.0
    assert (await read_table(fs_store, "points")).num_rows == 40 + 4
    assert (await verify(fs_store)).ok


async def test_rerun_changes_nothing_and_work_markers_are_consumed(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    frame = make_frame([(DATA_START_NS + i * S, "up", 1.0, None) for i in range(10)])
    await accept(fs_store, [frame])
    assert len(await work_markers(fs_store)) == 1
    first = await run(spark, fs_store)
    assert first.version == 1
    assert await work_markers(fs_store) == []
    objects = {i.key: i.etag async for i in fs_store.list(keys.ROLLUP_PREFIX)}

    # The same record cataloged again (an audit after a crash writes its own file and
    # marker): the marker says "re-check the hour", the hour has nothing new.
    await catalog_manifests(fs_store, [frame.manifest], epoch=2)
    again = await run(spark, fs_store)

    assert again.outcome == "up-to-date" and again.version is None and again.base_version == 1
    latest = await load_latest(fs_store)
    assert latest is not None and latest.snapshot.version == 1
    now = {i.key: i.etag async for i in fs_store.list(keys.ROLLUP_PREFIX)}
    owner = keys.ROLLUP_OWNER_KEY  # the lease record is renewed/released by every run
    assert {k: v for k, v in now.items() if k != owner} == {
        k: v for k, v in objects.items() if k != owner
    }
    assert await work_markers(fs_store) == []


async def test_bad_frames_are_reported_recorded_and_left_pending(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    good = make_frame([(DATA_START_NS + i * S, "ok", 2.0, None) for i in range(5)], seq_start=0)
    flipped = make_frame([(DATA_START_NS, "x", 1.0, None)], seq_start=100)
    missing = make_frame([(DATA_START_NS, "y", 1.0, None)], seq_start=200)
    garbage = b"not a frame at all"
    undecodable = make_frame([(DATA_START_NS, "z", 1.0, None)], seq_start=300)
    undecodable = type(undecodable)(
        garbage,
        undecodable.manifest.model_copy(
            update={
                "frame_sha256": hashlib.sha256(garbage).hexdigest(),
                "raw_blob_key": keys.raw_blob_key(hashlib.sha256(garbage).hexdigest()),
            }
        ),
    )
    await accept(fs_store, [good, flipped, missing, undecodable])
    corrupt = bytearray(flipped.frame)
    corrupt[-10] ^= 0xFF
    await fs_store.put(flipped.manifest.raw_blob_key, bytes(corrupt))
    await fs_store.delete(missing.manifest.raw_blob_key)

    summary = await run(spark, fs_store)

    assert summary.outcome == "committed" and summary.batches == 1 and summary.points == 5
    reported = {(p["kind"], p["manifest_id"]) for p in summary.problems}
    assert reported == {
        ("corrupt-blob", flipped.manifest_id),
        ("missing-blob", missing.manifest_id),
        ("corrupt-blob", undecodable.manifest_id),
    }
    for sent, kind in (
        (flipped, "corrupt-blob"),
        (missing, "missing-blob"),
        (undecodable, "corrupt-blob"),
    ):
        body, _ = await fs_store.get(keys.problem_key(kind, sent.manifest.raw_blob_key))
        record = ProblemRecord.from_json(body)
        assert record.subject_key == sent.manifest.raw_blob_key
        assert sent.manifest_id in record.detail
    latest = await load_latest(fs_store)
    assert latest is not None
    ledger = await read_ledger(fs_store, latest.snapshot)
    assert ledger["manifest_id"].to_pylist() == [good.manifest_id]
    report = await verify(fs_store)
    assert not report.ok and sum(h.missing or 0 for h in report.hours) == 3
    totals = await committed_rollup(fs_store)
    assert sum(v["count"] for v in totals.values()) == 5

    # Still bad on the next run: reported again, nothing committed, nothing added.
    again = await run(spark, fs_store)
    assert again.outcome == "nothing-included" and len(again.problems) == 3
    latest_again = await load_latest(fs_store)
    assert latest_again is not None and latest_again.snapshot.version == latest.snapshot.version
    assert math.isclose(sum(v["sum"] or 0 for v in totals.values()), 10.0)

    # Issue 24 item 13: acknowledged as lost, they stop holding their hour back; the next
    # run has nothing to do (its work markers go) and nothing is reported again.
    clock = ManualClock(DATA_START_NS + 3600 * S)
    for sent in (flipped, missing, undecodable):
        await acknowledge_lost(
            fs_store, sent.manifest.manifest_key, reason="no backup", by="ops", clock=clock
        )
    assert (await verify(fs_store)).ok
    settled = await run(spark, fs_store)
    assert settled.outcome == "up-to-date" and settled.problems == []
    assert await work_markers(fs_store) == []
    assert not [i async for i in fs_store.list(keys.RECONCILER_PROBLEMS_PREFIX)]


@pytest.mark.s3
async def test_the_job_reads_frames_from_and_writes_parquet_to_s3(
    spark: SparkSession, ministack_server: RunningServer, ministack_bucket: str
) -> None:
    url = f"s3://{ministack_bucket}/metrics"
    endpoint = ministack_server.endpoint_url
    store = open_store(url, endpoint_url=endpoint)
    try:
        frames = [
            make_frame([(DATA_START_NS + i * S, "s3", float(i), {"k": str(b)}) for i in range(20)],
                       seq_start=b * 20)
            for b in range(3)
        ]  # fmt: skip
        await accept(store, frames)

        summary = await run_rollup(
            spark,
            store,
            access=StoreAccess(url, endpoint_url=endpoint),
            settings=settings(),
        )

        assert summary.outcome == "committed" and summary.points == 60, summary
        assert_rollup_equal(await committed_rollup(store, endpoint), expected_rollup(frames))
        assert (await verify(store)).ok
        # The published Iceberg table, read by DuckDB through httpfs with the store's settings.
        assert summary.iceberg_published == [1]
        connection = sql.open_duckdb()
        sql.add_s3_secret(
            connection,
            sql.S3Access(ministack_bucket, "us-east-1", endpoint, sql.resolve_credentials()),
        )
        counted = connection.sql(
            f"SELECT count(*), sum(value) FROM iceberg_scan('{table_url(url, 'points')}')"
        ).fetchall()
        assert counted == [(60, float(sum(range(20)) * 3))]
    finally:
        await store.close()
