"""Where `lm-rollup verify` takes the accepted batches from (`rollup.read.verify`): the catalog
(`catalog_hours`: each hour's totals and its batches out of core, `read_hour_totals`) or
``accepted/v1/`` itself (`manifest_batches`: one GET per manifest, bounded concurrency,
the batches written to a local file a chunk at a time). Either way the batches land in
local `BATCH_COLUMNS` Parquet files that `rollup.read.verify_ledger` compares with the ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from index.catalog import list_all_files
from index.catalog_local import MergeLimits
from index.catalog_tables import read_hour_totals
from protocol import keys
from protocol.records import AcceptedManifest, RecordError
from protocol.setsum import Setsum
from rollup.table.manifest import LedgerHour
from store.base import ObjectStore
from store.errors import NotFound


@dataclass(slots=True)
class _HourTotals:
    batches: int = 0
    records: int = 0
    setsum: Setsum = field(default_factory=Setsum)

    def frozen(self) -> LedgerHour:
        return LedgerHour(self.batches, self.records, self.setsum.hex)


AcceptedRow = tuple[str, str, str, int, str]
"""``(accepted hour, manifest_id, frame_sha256, record_count, key)`` of one accepted batch."""


async def catalog_hours(
    store: ObjectStore,
    first: keys.UtcHour | None,
    last: keys.UtcHour | None,
    work: str,
    limits: MergeLimits,
) -> tuple[dict[str, LedgerHour], dict[str, str]]:
    """Per catalog hour in range: its totals, and its batches as a local `BATCH_COLUMNS`
    file in ``work`` (one listing, then each hour out of core: `read_hour_totals`)."""
    hours: set[keys.UtcHour] = set()
    async for info in list_all_files(store):
        hour, _epoch, _sequence = keys.parse_index_catalog_key(info.key)
        if in_range(hour.iso, first, last):
            hours.add(hour)
    totals: dict[str, LedgerHour] = {}
    files: dict[str, str] = {}
    for hour in sorted(hours):
        path = str(Path(work, f"catalog-{hour.iso}.parquet"))
        counted = await read_hour_totals(store, hour, limits, batches_to=path)
        if counted.batches:
            totals[hour.iso] = LedgerHour(counted.batches, counted.records, counted.setsum.hex)
        files[hour.iso] = path
    return totals, files


async def _from_manifests(
    store: ObjectStore, concurrency: int, hours: set[str] | None, bad: list[str]
) -> AsyncIterator[AcceptedRow]:
    """Every accepted manifest under ``accepted/v1/``, read one by one (bounded
    concurrency): independent of the index, the authority itself. A batch stored under
    both agent key forms (PROTOCOL §3) counts once, as the catalog counts it
    (`index.catalog_tables.read_hour_totals`): the first listed, the long form (only ids of
    agents long enough to have two forms are remembered)."""
    limit = asyncio.Semaphore(concurrency)
    two_forms: set[str] = set()

    async def one(key: str) -> tuple[AcceptedRow, bool] | None:
        """The row, and whether its agent has two key forms."""
        async with limit:
            try:
                body, _ = await store.get(key)
                manifest = AcceptedManifest.from_json(body, reads_bundles=True)
            except (NotFound, RecordError):
                bad.append(key)
                return None
        legacy = keys.legacy_accepted_manifest_key(manifest.identity)
        if key not in (manifest.manifest_key, legacy):
            bad.append(key)
            return None
        hour = manifest.accepted_hour.iso
        row = (
            hour,
            manifest.identity.manifest_id,
            manifest.frame_sha256,
            manifest.record_count,
            key,
        )
        return row, legacy is not None

    chunk: list[str] = []

    async def flush() -> list[AcceptedRow]:
        rows: list[AcceptedRow] = []
        for found in await asyncio.gather(*(one(k) for k in chunk)):  # in listing order
            if found is None:
                continue
            row, two_form = found
            if two_form:
                if row[1] in two_forms:
                    continue  # its other key form was listed first
                two_forms.add(row[1])
            rows.append(row)
        chunk.clear()
        return [r for r in rows if hours is None or r[0] in hours]

    async for info in store.list(keys.ACCEPTED_PREFIX):
        chunk.append(info.key)
        if len(chunk) >= 1000:
            for row in await flush():
                yield row
    for row in await flush():
        yield row


def in_range(hour: str, first: keys.UtcHour | None, last: keys.UtcHour | None) -> bool:
    parsed = keys.UtcHour.parse_iso(hour)
    return (first is None or parsed >= first) and (last is None or parsed <= last)


async def manifest_batches(
    store: ObjectStore,
    concurrency: int,
    first: keys.UtcHour | None,
    last: keys.UtcHour | None,
    bad: list[str],
    path: str,
) -> dict[str, LedgerHour]:
    """Per hour in range: the totals of the batches read from ``accepted/v1/``; every such
    batch is written to ``path`` (`BATCH_COLUMNS`, a chunk at a time)."""
    totals: dict[str, _HourTotals] = {}
    chunk: list[AcceptedRow] = []
    writer = pq.ParquetWriter(path, _MANIFEST_BATCHES)
    try:
        async for row in _from_manifests(store, concurrency, None, bad):
            hour, manifest_id, sha, records, _key = row
            if not in_range(hour, first, last):
                continue
            hour_totals = totals.setdefault(hour, _HourTotals())
            hour_totals.batches += 1
            hour_totals.records += records
            hour_totals.setsum = hour_totals.setsum.add(manifest_id, sha)
            chunk.append(row)
            if len(chunk) >= 10_000:
                writer.write_table(_manifest_table(chunk))
                chunk.clear()
        writer.write_table(_manifest_table(chunk))
    finally:
        writer.close()
    return {hour: t.frozen() for hour, t in totals.items()}


_MANIFEST_BATCHES = pa.schema(
    [
        ("key", pa.string()),
        ("manifest_id", pa.string()),
        ("frame_sha256", pa.string()),
        ("record_count", pa.int64()),
        ("time_unix_ns", pa.int64()),
        ("catalog_file", pa.string()),
        ("accepted_hour", pa.string()),
    ]
)


def _manifest_table(rows: list[AcceptedRow]) -> pa.Table:
    return pa.table(
        {
            "key": [r[4] for r in rows],
            "manifest_id": [r[1] for r in rows],
            "frame_sha256": [r[2] for r in rows],
            "record_count": [r[3] for r in rows],
            "time_unix_ns": [0] * len(rows),  # not compared: the ledger holds no time
            "catalog_file": [""] * len(rows),
            "accepted_hour": [r[0] for r in rows],
        },
        schema=_MANIFEST_BATCHES,
    )
