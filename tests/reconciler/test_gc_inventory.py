"""``gc.inventory_proves`` (PROTOCOL §3.5 rule 5): an audit read from an S3 Inventory report
serves as the GC's rule-5 audit only when turned on, and then only for blobs older than
the report by the retry horizon plus ``gc.inventory_lag_s``; presence is still checked by
a HEAD (a report may list an object deleted shortly before it)."""

from __future__ import annotations

import dataclasses
import gzip
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from protocol import keys
from reconciler.audit.inventory import InventorySource
from reconciler.audit.run import run_full_audit
from store.base import ObjectInfo
from tests.reconciler.test_gc import HOUR_S, POLICY, World, frame_bytes
from tests.reconciler.test_inventory import CONFIG, SOURCE_BUCKET, iso_ms

LAG_S = 4 * HOUR_S


async def inventory_audit(world: World, root: Path) -> None:
    """A CSV report of the store as it is now (creationTimestamp = now), then an audit
    read from it."""
    lines = [
        f'"{SOURCE_BUCKET}","{info.key}","{info.size}","{iso_ms(info.last_modified_ns // 10**6)}"'
        async for info in world.store.list("")
    ]
    when = datetime.fromtimestamp(world.clock.now_ns() // 10**9, tz=UTC)
    stamp = when.strftime("%Y-%m-%dT%H-%MZ")
    (root / CONFIG / stamp).mkdir(parents=True)
    (root / CONFIG / stamp / "data.csv.gz").write_bytes(gzip.compress("\n".join(lines).encode()))
    manifest = {
        "sourceBucket": SOURCE_BUCKET,
        "destinationBucket": "arn:aws:s3:::lm-inventory",
        "version": "2016-11-30",
        "creationTimestamp": str(world.clock.now_ns() // 10**6),
        "fileFormat": "CSV",
        "fileSchema": "Bucket, Key, Size, LastModifiedDate",
        "files": [{"key": f"{CONFIG}/{stamp}/data.csv.gz", "size": 1, "MD5checksum": "0" * 32}],
    }
    (root / CONFIG / stamp / "manifest.json").write_text(json.dumps(manifest))
    source = InventorySource.from_url(f"file://{root}", source_prefix="")
    try:
        record = await run_full_audit(await world.ctx(), inventory=source)
    finally:
        await source.close()
    assert record.status == "completed" and record.source == "inventory"


@pytest.mark.parametrize(
    ("inventory_proves", "age_h", "deleted"),
    [
        (False, 10, False),  # off (the default): an Inventory never proves
        (True, 5, False),  # on, but the blob is not older than horizon + lag (2 h + 4 h)
        (True, 10, True),  # on and old enough: deleted, after a HEAD (rule 1)
    ],
)
async def test_an_inventory_audit_proves_only_when_allowed_and_old_enough(
    tmp_path: Path, inventory_proves: bool, age_h: int, deleted: bool
) -> None:
    policy = dataclasses.replace(POLICY, inventory_lag_s=LAG_S if inventory_proves else None)
    world = World(policy)
    heads: list[str] = []
    head = world.store.head

    async def counted_head(key: str) -> ObjectInfo:
        heads.append(key)
        return await head(key)

    world.store.head = counted_head  # type: ignore[method-assign]
    digest = await world.orphan(frame_bytes(1))
    world.clock.advance(3 * HOUR_S)
    assert (await world.gc()).record.marked == 1
    world.clock.advance(age_h * HOUR_S - 3 * HOUR_S)
    await inventory_audit(world, tmp_path / "inventory")
    heads.clear()
    outcome = await world.gc()
    assert (outcome.deleted != []) is deleted
    assert await world.exists(keys.raw_blob_key(digest)) is not deleted
    if deleted:
        assert keys.raw_blob_key(digest) in heads  # rule 1: a HEAD after the mark
