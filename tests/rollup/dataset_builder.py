"""Building rollup datasets in tests without Spark: Parquet written with pyarrow, accepted
batches written as the collector would and cataloged as the reconciler would (PROTOCOL
§3.7: catalog files plus their rollup work markers), commits through `rollup.table.commit`."""

from __future__ import annotations

import io
import random
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq

from index.catalog import CatalogWriter
from index.rows import accepted_row
from protocol import keys
from protocol.clock import Clock, SystemClock
from protocol.records import AcceptedManifest, RollupWorkMarker
from rollup.table.commit import LoadedSnapshot, commit, load_latest
from rollup.table.data_file import describe_file
from rollup.table.ledger import LedgerRow, write_ledger_files
from rollup.table.manifest import Changes, DataFile
from rollup.table.owner import OwnerLease
from rollup.table.schemas import POINTS_SCHEMA
from rollup.table.series import canonical_series
from store.base import ObjectStore

BASE_HOUR = keys.UtcHour(date(2026, 11, 21), 10)
BOOT = uuid.UUID("5f0c6a2e-0000-4000-8000-000000000001")


def hour_at(offset: int) -> keys.UtcHour:
    return BASE_HOUR.shifted(offset)


def hour_start(hour: keys.UtcHour) -> datetime:
    return datetime(hour.day.year, hour.day.month, hour.day.day, hour.hour, tzinfo=UTC)


def points(
    hour: keys.UtcHour,
    count: int,
    *,
    metric: str = "cpu",
    agent: str = "agent-a",
    seq_start: int = 0,
    value_start: float = 0.0,
    labels: dict[str, str] | None = None,
) -> pa.Table:
    """``count`` points one second apart from the start of ``hour``."""
    start = hour_start(hour)
    rows = {
        "ts": [start + timedelta(seconds=i) for i in range(count)],
        "metric": [metric] * count,
        "labels": [list(labels.items()) if labels else None] * count,
        "value": [value_start + i for i in range(count)],
        "series": [canonical_series(metric, labels)] * count,
        "agent_id": [agent] * count,
        "boot_id": [str(BOOT)] * count,
        "seq": [seq_start + i for i in range(count)],
    }
    return pa.table(rows, schema=POINTS_SCHEMA)


def parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


async def put_data_file(
    store: ObjectStore, table_name: str, hour: keys.UtcHour, rows: pa.Table, version: int
) -> DataFile:
    """Write ``rows`` as a new Parquet file of ``table_name``; its `DataFile` record."""
    key = keys.rollup_data_key(table_name, hour, str(uuid.uuid4()))
    body = parquet_bytes(rows)
    await store.put(key, body)
    return describe_file(table_name, key, hour, rows, size_bytes=len(body), added_version=version)


@dataclass(frozen=True)
class Batch:
    """An accepted batch: its manifest (as the collector writes it)."""

    manifest: AcceptedManifest

    @property
    def row(self) -> LedgerRow:
        return LedgerRow.of_manifest(self.manifest)


def make_batch(hour: keys.UtcHour, n: int, *, agent: str = "agent-a", records: int = 10) -> Batch:
    seq_start = n * records
    sha = uuid.uuid5(uuid.NAMESPACE_URL, f"{agent}/{n}/{hour.iso}").hex * 2
    manifest = AcceptedManifest(
        agent_id=agent,
        boot_id=str(BOOT),
        seq_start=seq_start,
        seq_end=seq_start + records - 1,
        record_count=records,
        frame_sha256=sha,
        frame_bytes=1000,
        raw_blob_key=keys.raw_blob_key(sha),
        accepted_at_unix_ns=hour.start_ns + n * 1_000_000_000,
        collector_id="collector-1",
    )
    return Batch(manifest)


async def accept(store: ObjectStore, batches: Sequence[Batch]) -> None:
    """Write each batch's accepted manifest (as the collector does) and catalog it (as the
    reconciler does)."""
    for batch in batches:
        await store.put(batch.manifest.manifest_key, batch.manifest.to_json())
    await catalog_manifests(store, [batch.manifest for batch in batches])


async def catalog_manifests(
    store: ObjectStore,
    manifests: Sequence[AcceptedManifest],
    *,
    clock: Clock | None = None,
    epoch: int = 1,
    markers: bool = True,
    ts_ranges: Mapping[str, tuple[int, int]] | None = None,
) -> list[str]:
    """Catalog ``manifests`` as `reconciler.cataloger.Cataloger.commit` does: one catalog
    file per accepted hour (`index.catalog.CatalogWriter`), then, unless ``markers`` is
    False (history the rollup already consumed), one rollup work marker per file. Returns
    the catalog file keys. ``ts_ranges``: the rows' ``min_ts_ns``/``max_ts_ns`` by
    ``manifest_id`` (null for the others, as rows written before the columns)."""
    spans = ts_ranges or {}
    clock = clock or SystemClock()
    writer = CatalogWriter(store=store, clock=clock, rng=random.Random(epoch), epoch=epoch)
    by_hour: dict[keys.UtcHour, list[AcceptedManifest]] = defaultdict(list)
    for manifest in manifests:
        by_hour[manifest.accepted_hour].append(manifest)
    written = []
    for hour, hour_manifests in sorted(by_hour.items()):
        catalog_key = await writer.write(
            hour,
            [accepted_row(m, ts_range=spans.get(m.identity.manifest_id)) for m in hour_manifests],
            writer="steady",
        )
        if markers:
            await put_work_marker(store, catalog_key, rows=len(hour_manifests), clock=clock)
        written.append(catalog_key)
    return written


async def put_work_marker(
    store: ObjectStore, catalog_key: str, *, rows: int, clock: Clock | None = None
) -> str:
    """The rollup work marker naming ``catalog_key``; returns the marker's key."""
    hour, _epoch, _sequence = keys.parse_index_catalog_key(catalog_key)
    marker = RollupWorkMarker(
        catalog_key=catalog_key,
        hour=hour.iso,
        rows=rows,
        written_at_unix_ns=(clock or SystemClock()).now_ns(),
    )
    key = keys.rollup_work_marker_key(catalog_key)
    await store.put(key, marker.to_json(), if_none_match=True)
    return key


async def work_markers(store: ObjectStore) -> list[str]:
    return [info.key async for info in store.list(keys.ROLLUP_WORK_PREFIX)]


async def commit_rows(
    store: ObjectStore,
    owner: OwnerLease,
    clock: Clock,
    *,
    data: Sequence[tuple[str, keys.UtcHour, pa.Table]] = (),
    ledger: Sequence[LedgerRow] = (),
    remove: Sequence[str] = (),
    base: LoadedSnapshot | None = None,
) -> LoadedSnapshot:
    """Write data and ledger files and commit them on top of ``base`` (default latest)."""
    base = base if base is not None else await load_latest(store)
    version = base.snapshot.version + 1 if base is not None else 1
    added = [await put_data_file(store, t, h, rows, version) for t, h, rows in data]
    ledger_part = await write_ledger_files(store, ledger) if ledger else Changes()
    changes = Changes(
        added_files=tuple(added),
        removed_files=tuple(remove),
        added_ledger_files=ledger_part.added_ledger_files,
        ledger_delta=ledger_part.ledger_delta,
    )
    return await commit(store, base=base, changes=changes, owner=owner, clock=clock)
