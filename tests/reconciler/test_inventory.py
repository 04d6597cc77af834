"""Audits from a synthetic S3 Inventory report (CSV.gz and Parquet, with manifest.json)
find the same records as a listing audit."""

from __future__ import annotations

import csv
import gzip
import io
import json
import urllib.parse
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.inventory import InventoryError, InventorySource
from reconciler.audit.run import AuditProgress, run_full_audit
from store.base import ObjectStore
from store.fs import FileSystemStore
from tests.reconciler.conftest import (
    catalog_keys,
    context,
    keys_under,
    write_batches,
    write_conflict,
)

SOURCE_BUCKET = "lm-source"
SOURCE_PREFIX = "prod/"
CONFIG = f"inventories/{SOURCE_BUCKET}/daily"
CREATED_MS = 1_759_990_000_000


async def store_rows(store: ObjectStore, prefix: str = SOURCE_PREFIX) -> list[tuple[str, int, int]]:
    """(bucket key with the source prefix, size, last modified ms) of every object."""
    return [
        (prefix + info.key, info.size, info.last_modified_ns // 1_000_000)
        async for info in store.list("")
    ]


def iso_ms(ms: int) -> str:
    seconds, millis = divmod(ms, 1000)
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{millis:03d}Z"


def write_manifest(root: Path, stamp: str, file_format: str, schema: str, files: list[str]) -> None:
    folder = root / CONFIG / stamp
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "sourceBucket": SOURCE_BUCKET,
        "destinationBucket": "arn:aws:s3:::lm-inventory",
        "version": "2016-11-30",
        "creationTimestamp": str(CREATED_MS),
        "fileFormat": file_format,
        "fileSchema": schema,
        "files": [{"key": f, "size": 1, "MD5checksum": "0" * 32} for f in files],
    }
    (folder / "manifest.json").write_text(json.dumps(doc))


def write_csv_inventory(root: Path, rows: list[tuple[str, int, int]], parts: int) -> None:
    schema = "Bucket, Key, Size, LastModifiedDate, IsLatest"
    files = []
    for part in range(parts):
        text = io.StringIO()
        writer = csv.writer(text, quoting=csv.QUOTE_ALL, lineterminator="\n")
        for key, size, modified in rows[part::parts]:
            writer.writerow(
                [SOURCE_BUCKET, urllib.parse.quote_plus(key), size, iso_ms(modified), "true"]
            )
        # An old version of an accepted key, which the bucket no longer holds as such.
        writer.writerow([SOURCE_BUCKET, urllib.parse.quote_plus(rows[0][0]), 1, iso_ms(0), "false"])
        name = f"{CONFIG}/data/part-{part}.csv.gz"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(gzip.compress(text.getvalue().encode()))
        files.append(name)
    write_manifest(root, "2025-10-09T00-00Z", "CSV", schema, files)
    # An older report that lists nothing: the newest one must be chosen.
    write_manifest(root, "2025-10-08T00-00Z", "CSV", schema, [])


def write_parquet_inventory(root: Path, rows: list[tuple[str, int, int]]) -> None:
    table = pa.table(
        {
            "bucket": [SOURCE_BUCKET] * len(rows),
            "key": [key for key, _, _ in rows],
            "size": pa.array([size for _, size, _ in rows], pa.int64()),
            "last_modified_date": pa.array([m for _, _, m in rows], pa.timestamp("ms")),
        }
    )
    name = f"{CONFIG}/data/part-0.parquet"
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, root / name)
    schema = "message s3.inventory { required binary bucket (UTF8); required binary key (UTF8); }"
    write_manifest(root, "2025-10-09T00-00Z", "Parquet", schema, [name])


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
async def test_audit_from_an_inventory_finds_what_a_listing_finds(
    file_format: str, tmp_path: Path, clock: ManualClock
) -> None:
    store = FileSystemStore(tmp_path / "store", clock=clock)
    batches = await write_batches(store, agents=3, per_agent=7)
    await write_conflict(store, batches[4], clock.now_ns())
    rows = await store_rows(store)
    rows.append(("elsewhere/accepted/v1/not-ours.json", 5, 0))  # outside the store's prefix
    inventory_root = tmp_path / "inventory"
    if file_format == "csv":
        write_csv_inventory(inventory_root, rows, parts=2)
    else:
        write_parquet_inventory(inventory_root, rows)
    inventory = InventorySource.from_url(
        f"file://{inventory_root}", source_prefix=SOURCE_PREFIX, source_bucket=SOURCE_BUCKET
    )
    ctx = await context(store, clock)
    progress: list[AuditProgress] = []

    record = await run_full_audit(ctx, inventory=inventory, progress=progress.append)

    assert record.status == "completed" and record.source == "inventory"
    assert record.started_at_unix_ns == CREATED_MS * 1_000_000  # as of the report
    assert (record.manifests_seen, record.quarantines_seen, record.problems) == (21, 1, 0)
    assert progress[-1].manifests_seen == 21
    from_inventory = await catalog_keys(store)
    assert len(from_inventory) == 22 and record.cataloged == 22

    listing_store = FileSystemStore(tmp_path / "copy", clock=clock)
    await write_batches(listing_store, agents=3, per_agent=7)
    await write_conflict(listing_store, batches[4], clock.now_ns())
    listed = await run_full_audit(await context(listing_store, clock))
    assert (listed.manifests_seen, listed.quarantines_seen) == (21, 1)
    assert await catalog_keys(listing_store) == from_inventory
    await inventory.close()


async def test_inventory_yields_raw_blobs_for_the_gc(tmp_path: Path, clock: ManualClock) -> None:
    store = FileSystemStore(tmp_path / "store", clock=clock)
    batches = await write_batches(store, agents=1, per_agent=3)
    write_csv_inventory(tmp_path / "inventory", await store_rows(store), parts=1)
    inventory = InventorySource.from_url(
        f"file://{tmp_path / 'inventory'}", source_prefix=SOURCE_PREFIX
    )
    report = await inventory.report()

    blobs = [
        obj async for _row, obj in inventory.objects(report.files[0], (keys.RAW_BLOBS_PREFIX,))
    ]

    assert sorted(o.key for o in blobs) == sorted(b.manifest.raw_blob_key for b in batches)
    assert all(o.size == len(batches[0].frame) and o.last_modified_ns for o in blobs)
    assert await keys_under(store, keys.RAW_BLOBS_PREFIX) == {o.key for o in blobs}


async def test_an_inventory_of_another_bucket_is_refused(tmp_path: Path) -> None:
    write_csv_inventory(tmp_path, [("prod/accepted/v1/x.json", 1, 0)], parts=1)
    inventory = InventorySource.from_url(f"file://{tmp_path}", source_bucket="some-other-bucket")
    with pytest.raises(InventoryError, match="some-other-bucket"):
        await inventory.report()
