"""``lm-reconciler audit --engine spark``'s work (`reconciler.audit.spark_run.spark_audit`,
issue 23 item 3): as the lease holder it records the audit's start, Spark lists the ranges
and runs the joins, and the result files equal the local engine's over the same store and
catalog; the audit stays running (acting on the results is not wired to this engine yet),
and a second run resumes it without listing again. Local Spark session, filesystem store."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from index import catalog
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.duckdb_joins import AuditJoins, JoinLimits, fetch_catalog
from reconciler.audit.listing import list_for_audit
from reconciler.audit.records import latest_audit
from reconciler.audit.spark_run import NOT_WIRED, spark_audit
from store.fs import FileSystemStore
from tests.reconciler.conftest import context, make_settings
from tests.reconciler.test_audit_joins import T0, mkey, put_catalog, row, sha

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

WRITTEN = T0 + 3600 * keys.NS_PER_S
DAYS = 30
NOW = WRITTEN + DAYS * 24 * 3600 * keys.NS_PER_S


async def fill(store: FileSystemStore) -> list[str]:
    """Records 0..11 and their blobs (not 7's), a stray blob; a catalog of 0..9 (1 with
    two hashes in two files) and 20 (cataloged, never stored): every kind of result."""
    for n in range(12):
        await store.put(mkey(n), b"{}")
        if n != 7:
            await store.put(keys.raw_blob_key(sha(n)), b"x")
    await store.put(keys.raw_blob_key(sha(500)), b"x")
    await put_catalog(store, 0, 1, 1, [row(n) for n in range(10)])  # type: ignore[arg-type]
    await put_catalog(store, 0, 1, 2, [row(1, frame=sha(101)), row(20)])  # type: ignore[arg-type]
    return [info.key async for info in catalog.list_all_files(store)]


def rows_of(path: str) -> list[dict[str, object]]:
    return pq.read_table(path).to_pylist()


def test_the_spark_engine_matches_the_local_one_and_leaves_the_audit_running(
    audit_spark: SparkSession, tmp_path: Path
) -> None:
    clock = ManualClock(WRITTEN)
    store = FileSystemStore(tmp_path / "store", clock=clock)
    settings = make_settings()
    settings = settings.model_copy(
        update={"store": settings.store.model_copy(update={"url": store.url})}
    )

    async def scenario() -> None:
        names = await fill(store)
        clock.advance(DAYS * 24 * 3600)  # the blobs are older than the retry horizon
        ctx = await context(store, clock, settings=settings)
        outcome = await spark_audit(ctx, audit_spark, out_dir=tmp_path / "spark")
        record = outcome.record
        assert not outcome.resumed and not outcome.completed
        assert outcome.summary()["message"] == NOT_WIRED
        stored = await latest_audit(store)
        assert stored is not None and stored.audit_id == record.audit_id
        assert stored.status == "running" and stored.pin_expires_at_unix_ns is not None
        # What the audit cost so far, for `status` and the metrics (issue 23 item 5).
        assert stored.engine == "spark" and stored.ran_from_unix_ns is not None
        assert stored.keys_listed == {k: int(n) for k, n in outcome.listing.keys_listed.items()}
        assert stored.keys_listed["accepted"] > 0
        assert stored.requests["LIST"] == outcome.listing.list_requests > 0
        audit_dir = keys.audit_listing_prefix(record.started_at_unix_ns, record.audit_id)
        assert all(p.startswith(audit_dir) for ps in outcome.listing.parts.values() for p in ps)

        # The local engine over the same store and pinned files, with the same limits.
        local = await list_for_audit(store, "elsewhere/listing/", concurrency=16)
        copies, _ = await fetch_catalog(store, names, str(tmp_path / "copies"))
        root = tmp_path / "store"
        paths = {k: [str(root / p) for p in v] for k, v in local.parts.items()}
        margin = int(settings.settle_margin_s() * keys.NS_PER_S)
        limits = JoinLimits(
            born_before_ns=record.started_at_unix_ns + margin,
            phantom_before_ns=record.started_at_unix_ns - margin,
            orphan_before_ns=NOW - int(settings.gc.retry_horizon_s * 1e9),
        )
        with AuditJoins(paths, copies, str(tmp_path / "duck"), memory_limit_mb=64) as duck:  # type: ignore[arg-type]
            want = duck.run(limits)
        got = outcome.results
        assert rows_of(got.records) == sorted(rows_of(want.records), key=lambda r: str(r["key"]))
        key = lambda r: str(r["frame_sha256"])  # noqa: E731
        assert rows_of(got.blobs) == sorted(rows_of(want.blobs), key=key)
        assert rows_of(got.referencing) == sorted(rows_of(want.referencing), key=key)
        assert (
            got.reasons
            == want.reasons
            == {
                "record etag": 9,  # the filesystem's ETags are not the planted ones
                "record conflict": 1,
                "record missing": 2,
                "record phantom": 1,
                "blob orphan": 3,  # 500, and 10 and 11 (records not cataloged yet)
                "blob missing": 3,  # 7, 20 and 101
            }
        )

        again = await spark_audit(ctx, audit_spark, out_dir=tmp_path / "spark2")
        assert again.resumed and again.record.audit_id == record.audit_id
        assert again.listing.ranges_resumed == again.listing.ranges_total
        assert again.listing.list_requests == 0

    asyncio.run(scenario())
