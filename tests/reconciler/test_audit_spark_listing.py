"""The audit's listing on Spark executors (`reconciler.audit.engines.spark_listing`, issue 23 item
3): the parts written by Spark tasks, each with its own store client, are the files
`list_for_audit` writes (same names, same rows) over the same store, and resume the same
way (a finished range is not listed again; an unfinished one is). A local Spark session
over a filesystem store in tmp_path (a MemoryStore is not reachable from executors)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest

from reconciler.audit.engines.spark_listing import list_on_spark
from reconciler.audit.listing import ListingParts, list_for_audit
from rollup.table.storage import StoreAccess
from store.errors import StoreConfigError
from store.fs import FileSystemStore
from store.memory import MemoryStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

BOOT = "0" * 31 + "1"
LOCAL_DIR = "reconciler/v1/audits/00000000000000000001-local/listing/"
SPARK_DIR = "reconciler/v1/audits/00000000000000000001-spark/listing/"
BIG = {"accepted": 10**9, "quarantine": 10**9, "raw-blobs": 10**9}
"""Previous counts that cut each prefix into the most ranges (Spark tasks to run)."""


async def fill(store: FileSystemStore) -> None:
    """Keys under several agents, quarantine, blobs in several folders, and stray keys."""
    for agent in range(6):
        for n in range(5):
            key = f"accepted/v1/agent=a{agent}/boot={BOOT}/{n * 10:020d}-{n * 10 + 9:020d}.json"
            await store.put(key, b"{}")
    await store.put(
        f"quarantine/v1/identity-conflict/agent=a1/boot={BOOT}/{0:020d}-{9:020d}/{'a' * 64}.json",
        b"{}",
    )
    for n in range(40):
        sha = hashlib.sha256(str(n).encode()).hexdigest()
        await store.put(f"raw-blobs/v1/sha256/{sha[:2]}/{sha[2:4]}/{sha}.lmbatch", b"x")
    for stray in ("accepted/v1/junk", "raw-blobs/v1/x", "quarantine/v1/y"):
        await store.put(stray, b"?")


def part_files(root: Path, audit_dir: str) -> dict[str, list[dict[str, object]]]:
    """Each part (name relative to the audit's folder) and its rows."""
    folder = root / audit_dir
    return {
        str(p.relative_to(folder)): pq.read_table(p).to_pylist()
        for p in sorted(folder.rglob("*.parquet"))
    }


def relative(parts: ListingParts, audit_dir: str) -> dict[str, list[str]]:
    return {k: [p.removeprefix(audit_dir) for p in v] for k, v in parts.parts.items()}


def test_spark_writes_the_parts_list_for_audit_writes(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = FileSystemStore(root)
    access = StoreAccess(store.url)

    async def scenario() -> None:
        await fill(store)
        local = await list_for_audit(store, LOCAL_DIR, concurrency=2, previous=BIG)
        sparked = await list_on_spark(spark, store, access, SPARK_DIR, concurrency=2, previous=BIG)
        assert relative(sparked, SPARK_DIR) == relative(local, LOCAL_DIR)
        assert sparked.keys_listed == local.keys_listed
        assert sum(sparked.keys_listed.values()) == 30 + 1 + 40 + 3
        assert sparked.list_requests == local.list_requests
        assert (sparked.ranges_total, sparked.ranges_resumed) == (local.ranges_total, 0)
        assert part_files(root, SPARK_DIR) == part_files(root, LOCAL_DIR)
        assert (root / SPARK_DIR / "plan.json").read_bytes() == (
            root / LOCAL_DIR / "plan.json"
        ).read_bytes()

        # Resumed: finished ranges are not listed again; an unfinished one is.
        again = await list_on_spark(spark, store, access, SPARK_DIR, concurrency=2)
        assert (again.ranges_resumed, again.list_requests) == (again.ranges_total, 0)
        assert relative(again, SPARK_DIR) == relative(local, LOCAL_DIR)
        one = sparked.parts["accepted"][0]
        (root / one).unlink()  # the range's only part: as if the task died before it
        resumed = await list_on_spark(spark, store, access, SPARK_DIR, concurrency=2)
        assert resumed.ranges_resumed == resumed.ranges_total - 1
        assert resumed.list_requests == 1
        assert part_files(root, SPARK_DIR) == part_files(root, LOCAL_DIR)

        # Sized by the store (small: one range a prefix, listed by the plan's probe): the
        # driver writes the same parts, and no range is left for a task.
        small_local, small_spark = LOCAL_DIR + "small/", SPARK_DIR + "small/"
        local = await list_for_audit(store, small_local, concurrency=2)
        sparked = await list_on_spark(spark, store, access, small_spark, concurrency=2)
        assert local.ranges_total == sparked.ranges_total == 4
        assert relative(sparked, small_spark) == relative(local, small_local)
        assert part_files(root, small_spark) == part_files(root, small_local)

    asyncio.run(scenario())


def test_a_memory_store_is_refused(spark: SparkSession) -> None:
    with pytest.raises(StoreConfigError, match="memory://"):
        asyncio.run(
            list_on_spark(spark, MemoryStore(), StoreAccess("memory://x"), SPARK_DIR, concurrency=1)
        )
