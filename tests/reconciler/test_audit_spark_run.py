"""``lm-reconciler audit --engine spark``'s work (`reconciler.audit.engines.spark_run.spark_audit`,
issue 23 item 3): as the lease holder it records the audit's start, Spark lists the ranges
and runs the joins, and the lease holder acts on the results and completes the audit. Over
two copies of one world (`tests.reconciler.audit_world`), the Spark engine and the local
one catalog the same rows, write the same orphan file and record the same problems,
whether the records are listed or nominated by an S3 Inventory report (issue 23 item 4:
"read by either engine"), some of whose records lack a LastModified (old in both engines,
issue 31 item 4). Local Spark session, filesystem stores."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.engines.spark_run import (
    ROWS_PER_SHUFFLE_PARTITION,
    SHUFFLE_PARTITIONS,
    shuffle_partitions,
    size_shuffle,
    spark_audit,
)
from reconciler.audit.inventory import InventorySource
from reconciler.audit.records import latest_audit
from reconciler.audit.run import run_full_audit
from reconciler.context import ReconcilerContext
from store.fs import FileSystemStore
from tests.reconciler.audit_world import (
    World,
    audit_outcome,
    build_world,
    inventory_rows,
    undated_records,
    without_file_name,
)
from tests.reconciler.conftest import T0_NS, context, keys_under, make_settings
from tests.reconciler.test_inventory import (
    SOURCE_BUCKET,
    SOURCE_PREFIX,
    write_parquet_inventory,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DAYS = 30


async def world_on_disk(
    root: Path, clock: ManualClock
) -> tuple[FileSystemStore, ReconcilerContext, World]:
    store = FileSystemStore(root, clock=clock)
    settings = make_settings()
    settings = settings.model_copy(
        update={"store": settings.store.model_copy(update={"url": store.url})}
    )
    ctx = await context(store, clock, settings=settings)
    return store, ctx, await build_world(store, ctx)


@pytest.mark.parametrize("source", ["listing", "inventory"])
def test_the_spark_engine_completes_the_audit_as_the_local_engine_does(
    spark: SparkSession, tmp_path: Path, source: str
) -> None:
    clock = ManualClock(T0_NS + 3600 * keys.NS_PER_S)

    async def scenario() -> None:
        local_store, local_ctx, world = await world_on_disk(tmp_path / "local", clock)
        spark_store, spark_ctx, _same = await world_on_disk(tmp_path / "spark", clock)
        inventory = None
        if source == "inventory":  # one report: both stores hold the same keys and sizes
            # Some records without a LastModified: old in both engines (issue 31 item 4).
            rows = await inventory_rows(spark_store, world, SOURCE_PREFIX)
            assert sum(m is None for _k, _s, m in rows) == len(undated_records(world)) == 5
            write_parquet_inventory(tmp_path / "inventory", rows)  # type: ignore[arg-type]
            inventory = InventorySource.from_url(
                f"file://{tmp_path / 'inventory'}",
                source_prefix=SOURCE_PREFIX,
                source_bucket=SOURCE_BUCKET,
            )
        clock.advance(DAYS * 24 * 3600)  # every blob older than the retry horizon

        local = await run_full_audit(local_ctx, inventory=inventory)
        record = await spark_audit(spark_ctx, spark, inventory=inventory)

        assert local.status == record.status == "completed"
        assert (local.engine, record.engine) == ("local", "spark")
        assert local.source == record.source == source
        assert record.pin_expires_at_unix_ns is None
        # A listing shows phantoms; an inventory may lack recent objects: none checked.
        assert record.phantoms_checked == (source == "listing")
        want = await audit_outcome(local_store, local)
        got = await audit_outcome(spark_store, record)
        assert got == want
        # What both found: the records cataloged (the unreadable file's 4 others again, the
        # 3 never logged, the quarantine record), the wrong hash (then the only readable
        # row of its key: its blob is missing, its record names another) superseded, the
        # phantom, the missing blob, the orphan, the unreadable file moved aside.
        # A listing audit also writes the retracted phantom's retracted row (issue 31).
        assert got["counts"] == (8, 1, 8 + 1 + (source == "listing"))
        rows = got["rows"]
        assert set(rows) == {b.key for b in world.batches} | {
            world.quarantine_key,
            world.phantom.key,
            world.retracted.key,
        }
        assert rows[world.retracted.key][0] == ("retracted" if source == "listing" else "accepted")
        assert rows[world.wrong_hash.key][1] == world.wrong_hash.sha
        assert rows[world.wrong_hash.key][5] == "audit"
        problems = [
            ("missing-blob", keys.raw_blob_key(world.blob_gone.sha)),
            ("missing-blob", keys.raw_blob_key(world.phantom.sha)),
            ("missing-blob", keys.raw_blob_key(world.retracted.sha)),
            ("unreadable-index-file", without_file_name(world.broken_file)),
        ]
        if source == "listing":
            problems.append(("phantom-row", world.phantom.key))
        assert got["problems"] == sorted(problems)
        assert got["orphans"] == {world.orphan_sha: (len(b"a blob no record names"), False)}
        assert len(got["aside"]) == 1
        assert spark_ctx.metrics.catalog_mismatches._value.get() == 1
        assert local_ctx.metrics.catalog_mismatches._value.get() == 1
        # What it cost, for `status` and the metrics (issue 23 item 5).
        stored = await latest_audit(spark_store)
        assert stored is not None and stored.audit_id == record.audit_id
        assert stored.engine == "spark" and stored.keys_listed["accepted"] == 8
        assert stored.requests["LIST"] > 0 and stored.requests["GET"] > 0
        assert stored.keys_listed["raw-blobs"] == 9  # listed, whatever the source
        # The joins shuffled into one partition per core (local[2]): a few dozen keys.
        assert spark.conf.get(SHUFFLE_PARTITIONS) == "2"
        # The rows it wrote itself went to the executors through the store.
        folder = keys.audit_folder(record.started_at_unix_ns, record.audit_id)
        assert await keys_under(spark_store, f"{folder}spark-results/added/")
        if inventory is not None:
            await inventory.close()

    asyncio.run(scenario())


def test_the_shuffle_is_sized_from_the_listing_unless_the_operator_sized_it() -> None:
    """One partition per `ROWS_PER_SHUFFLE_PARTITION` listed keys, at least one per core;
    an operator's ``spark.sql.shuffle.partitions`` stands as it is."""
    per = ROWS_PER_SHUFFLE_PARTITION
    assert shuffle_partitions(0, 8) == shuffle_partitions(per, 8) == 8
    assert shuffle_partitions(0, 0) == 1
    assert shuffle_partitions(100 * per, 8) == 100
    assert shuffle_partitions(100 * per + 1, 8) == 101
    assert shuffle_partitions(1_000_000_000, 64) == 4_000

    class Conf:
        def __init__(self, configured: bool) -> None:
            self.configured = configured
            self.set_to: dict[str, str] = {}

        def contains(self, key: str) -> bool:
            return self.configured and key == SHUFFLE_PARTITIONS

        def set(self, key: str, value: str) -> None:
            self.set_to[key] = value

    class Session:  # the two things `size_shuffle` asks of a SparkSession
        def __init__(self, configured: bool) -> None:
            self.conf = Conf(configured)
            self.sparkContext = self
            self.defaultParallelism = 4

        def getConf(self) -> Conf:
            return self.conf

    unset, operators = Session(configured=False), Session(configured=True)
    assert size_shuffle(unset, 10 * per) == 10  # type: ignore[arg-type]
    assert unset.conf.set_to == {SHUFFLE_PARTITIONS: "10"}
    assert size_shuffle(operators, 10 * per) is None  # type: ignore[arg-type]
    assert operators.conf.set_to == {}
