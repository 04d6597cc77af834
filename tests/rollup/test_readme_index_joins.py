"""The Spark form (docs/scaling.md) of the audit's joins runs as written, on local Spark, over real
catalog files and an S3-Inventory-shaped Parquet listing, and finds exactly the records
the catalog lacks, the old unreferenced blobs and the referenced hashes with no blob."""

from __future__ import annotations

import datetime
import hashlib
import re
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from index.rows import IndexRow, accepted_row, encode, quarantine_row
from protocol import keys
from protocol.records import AcceptedManifest, IdentityConflict

README = Path(__file__).resolve().parents[2] / "docs" / "scaling.md"
PREFIX = "lm/"
NOW = datetime.datetime(2026, 11, 23, 12, tzinfo=datetime.UTC)
HOUR = keys.UtcHour.from_unix_ns(int(NOW.timestamp()) * keys.NS_PER_S)


def readme_snippet() -> dict[str, Any]:
    """Execute the README's ``index_joins`` code block; its namespace."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    [code] = [block for block in blocks if "def index_joins(" in block]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


def manifest(n: int) -> AcceptedManifest:
    sha = hashlib.sha256(f"frame {n}".encode()).hexdigest()
    return AcceptedManifest(
        agent_id=f"agent-{n % 2}",
        boot_id=str(uuid.UUID(int=n + 1)),
        seq_start=n,
        seq_end=n,
        record_count=1,
        frame_sha256=sha,
        frame_bytes=100,
        raw_blob_key=keys.raw_blob_key(sha),
        accepted_at_unix_ns=HOUR.start_ns + n,
        collector_id="c",
    )


def write_catalog_file(root: Path, rows: list[IndexRow], sequence: int) -> None:
    path = root / keys.index_catalog_key(HOUR, 1, sequence)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(rows))


def write_inventory(path: Path, objects: list[tuple[str, datetime.datetime]]) -> None:
    """Rows as S3 Inventory writes them in Parquet (bucket, key, size, last_modified_date)."""
    table = pa.table(
        {
            "bucket": ["the-bucket"] * len(objects),
            "key": [PREFIX + key for key, _modified in objects],
            "size": [10] * len(objects),
            "last_modified_date": pa.array(
                [modified for _key, modified in objects], pa.timestamp("ms", tz="UTC")
            ),
        }
    )
    pq.write_table(table, path)


def test_the_readme_joins_find_what_the_catalog_lacks_and_the_orphans(
    spark: Any, tmp_path: Path
) -> None:
    index_joins = readme_snippet()["index_joins"]
    batches = [manifest(n) for n in range(6)]
    submitted = hashlib.sha256(b"conflicting frame").hexdigest()
    conflict = IdentityConflict(
        agent_id=batches[0].agent_id,
        boot_id=batches[0].boot_id,
        seq_start=batches[0].seq_start,
        seq_end=batches[0].seq_end,
        accepted_manifest_key=batches[0].manifest_key,
        accepted_raw_blob_key=batches[0].raw_blob_key,
        accepted_frame_sha256=batches[0].frame_sha256,
        submitted_raw_blob_key=keys.raw_blob_key(submitted),
        submitted_frame_sha256=submitted,
        observed_at_unix_ns=HOUR.start_ns + 10,
        collector_id="c",
    )
    old, young = NOW - datetime.timedelta(days=3), NOW - datetime.timedelta(minutes=5)
    orphan_old = hashlib.sha256(b"orphan, old").hexdigest()
    orphan_young = hashlib.sha256(b"orphan, young").hexdigest()
    objects = [(b.manifest_key, old) for b in batches] + [(conflict.quarantine_key, old)]
    objects += [(b.raw_blob_key, old) for b in batches[:5]]  # batch 5's blob is gone
    objects += [(keys.raw_blob_key(sha), old) for sha in (submitted, orphan_old)]
    objects += [(keys.raw_blob_key(orphan_young), young)]
    write_inventory(tmp_path / "inventory.parquet", objects)
    store = tmp_path / "store"
    # The catalog lost batches 1 and 4 (their log rows, say).
    write_catalog_file(
        store, [accepted_row(b) for i, b in enumerate(batches) if i not in (1, 4)], 1
    )
    write_catalog_file(store, [quarantine_row(conflict)], 2)

    def joins() -> tuple[set[str], set[str], set[str]]:
        inventory = spark.read.parquet(str(tmp_path / "inventory.parquet"))
        catalog = spark.read.parquet(str(store / keys.INDEX_CATALOG_PREFIX))
        horizon = (NOW - datetime.timedelta(days=2)).strftime("%Y-%m-%d %H:%M:%S")
        to_catalog, orphans, missing = index_joins(inventory, catalog, PREFIX, horizon)
        return (
            {r["key"] for r in to_catalog.collect()},
            {r["sha"] for r in orphans.collect()},
            {r["sha"] for r in missing.collect()},
        )

    to_catalog, _orphans, missing = joins()
    assert to_catalog == {batches[1].manifest_key, batches[4].manifest_key}
    assert missing == {batches[5].frame_sha256}

    # The reconciler catalogs what the join found; only then are the orphans final.
    write_catalog_file(store, [accepted_row(batches[1]), accepted_row(batches[4])], 3)
    to_catalog, orphans, missing = joins()
    assert to_catalog == set()
    assert orphans == {orphan_old}  # not the young one, not the quarantine's submitted blob
    assert missing == {batches[5].frame_sha256}
