"""Ledger files (PROTOCOL §4): which accepted batches a snapshot includes.

A ledger file is Parquet with `schemas.LEDGER_SCHEMA`, one row per included batch
(``manifest_id, frame_sha256, record_count, accepted_hour, min_ts, max_ts``: the last two
the batch's point range, null in files written before them), stored at
``rollup/v1/ledger/date=YYYY-MM-DD/hour=HH/<uuid>.parquet`` where the partition is the
rows' ``accepted_hour`` (decision: one accepted hour per ledger file, so readers of an
hour open only that hour's files). A snapshot's ``ledger.files`` lists every ledger file
it includes; every accepted batch appears exactly once across them, and ``ledger.hours``
holds each hour's totals (`ledger_totals` computes them from rows).

Reading goes through the `ObjectStore` (ledger files are small, and this works on every
store, memory included). Missing or unreadable files raise: a snapshot whose ledger cannot
be read cannot prove anything, and callers must not treat it as empty.
"""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from index.catalog_tables import read_hour_totals
from protocol import keys
from protocol.records import AcceptedManifest
from protocol.setsum import Setsum
from rollup.table.manifest import Changes, LedgerHour, RollupManifestError, Snapshot
from rollup.table.manifest_ledger import ledger_file_hour
from rollup.table.schemas import LEDGER_OPTIONAL, LEDGER_SCHEMA, TS_TYPE
from store.base import ObjectStore


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One included batch."""

    manifest_id: str
    frame_sha256: str
    record_count: int
    accepted_hour: str  # "YYYY-MM-DDTHH"
    min_ts: int | None = None
    """The batch's first point time, µs since the epoch (None: a row written before)."""
    max_ts: int | None = None

    @classmethod
    def of_manifest(cls, manifest: AcceptedManifest) -> LedgerRow:
        """The row that includes ``manifest``'s batch."""
        return cls(
            manifest.identity.manifest_id,
            manifest.frame_sha256,
            manifest.record_count,
            manifest.accepted_hour.iso,
        )


def ledger_table(rows: Iterable[LedgerRow]) -> pa.Table:
    """Rows as a table with exactly `LEDGER_SCHEMA`."""
    listed = list(rows)
    return pa.table(
        {
            "manifest_id": pa.array([r.manifest_id for r in listed], pa.string()),
            "frame_sha256": pa.array([r.frame_sha256 for r in listed], pa.string()),
            "record_count": pa.array([r.record_count for r in listed], pa.int64()),
            "accepted_hour": pa.array([r.accepted_hour for r in listed], pa.string()),
            "min_ts": pa.array([r.min_ts for r in listed], pa.int64()).cast(TS_TYPE),
            "max_ts": pa.array([r.max_ts for r in listed], pa.int64()).cast(TS_TYPE),
        },
        schema=LEDGER_SCHEMA,
    )


def conform_ledger(table: pa.Table) -> pa.Table:
    """A ledger file's rows as `LEDGER_SCHEMA`: the columns of a file written before
    `LEDGER_OPTIONAL` existed are added as nulls. `KeyError`/`ArrowException` when it is
    not a ledger file."""
    for name in LEDGER_OPTIONAL:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, TS_TYPE))
    return table.select(LEDGER_SCHEMA.names).cast(LEDGER_SCHEMA)


def ledger_rows(table: pa.Table) -> list[LedgerRow]:
    """The rows of a ledger table, in order."""
    table = conform_ledger(table)
    return [
        LedgerRow(m, s, c, h, low, high)
        for m, s, c, h, low, high in zip(
            table.column("manifest_id").to_pylist(),
            table.column("frame_sha256").to_pylist(),
            table.column("record_count").to_pylist(),
            table.column("accepted_hour").to_pylist(),
            table.column("min_ts").cast(pa.int64()).to_pylist(),
            table.column("max_ts").cast(pa.int64()).to_pylist(),
            strict=True,
        )
    ]


def ledger_totals(table: pa.Table) -> dict[str, LedgerHour]:
    """Per accepted hour: batches, records and setsum of the rows (a `Changes.ledger_delta`
    when the rows are a commit's newly included batches)."""
    batches: dict[str, int] = {}
    records: dict[str, int] = {}
    sums: dict[str, Setsum] = {}
    for row in ledger_rows(table):
        hour = row.accepted_hour
        batches[hour] = batches.get(hour, 0) + 1
        records[hour] = records.get(hour, 0) + row.record_count
        sums[hour] = sums.get(hour, Setsum()).add(row.manifest_id, row.frame_sha256)
    return {h: LedgerHour(batches[h], records[h], sums[h].hex) for h in sorted(batches)}


async def read_catalog_totals(store: ObjectStore, hour: keys.UtcHour) -> LedgerHour:
    """A catalog hour's batches (one per manifest_id: a batch under both agent key forms
    counts once) as the ledger hour that includes exactly them (batches, records, setsum:
    equal totals mean the ledger has every batch of the hour), out of core: DuckDB over local copies of its files
    (`index.catalog_tables.read_hour_totals`), so an hour of millions of batches is never
    a list of Python rows, nor all in memory (PROTOCOL §3.9)."""
    totals = await read_hour_totals(store, hour)
    return LedgerHour(totals.batches, totals.records, totals.setsum.hex)


async def write_ledger_files(
    store: ObjectStore,
    rows: Sequence[LedgerRow],
    *,
    new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    if_none_match: bool = False,
) -> Changes:
    """One new ledger file per accepted hour of ``rows`` (named by ``new_id``; a plain PUT
    of a fresh name, as the job writes them, or If-None-Match), and the `Changes` that
    commit them: what a commit that includes ``rows`` adds, for writers outside the Spark
    job (tests, the simulation, benchmarks)."""
    by_hour: dict[str, list[LedgerRow]] = {}
    for row in rows:
        by_hour.setdefault(row.accepted_hour, []).append(row)
    files = []
    for hour, hour_rows in sorted(by_hour.items()):
        key = keys.rollup_ledger_key(keys.UtcHour.parse_iso(hour), new_id())
        await store.put(key, encode_ledger(ledger_table(hour_rows)), if_none_match=if_none_match)
        files.append(key)
    return Changes(added_ledger_files=tuple(files), ledger_delta=ledger_totals(ledger_table(rows)))


def encode_ledger(table: pa.Table, *, compression: str = "zstd") -> bytes:
    """Parquet bytes of a ledger table (checked against `LEDGER_SCHEMA`)."""
    if not table.schema.equals(LEDGER_SCHEMA):
        raise ValueError(f"ledger table schema {table.schema} is not LEDGER_SCHEMA")
    sink = io.BytesIO()
    pq.write_table(table, sink, compression=compression)
    return sink.getvalue()


def decode_ledger(body: bytes, *, key: str = "<ledger>") -> pa.Table:
    """A ledger file's rows; `RollupManifestError` if it is not a ledger file."""
    try:
        return conform_ledger(pq.read_table(pa.BufferReader(body)))
    except (pa.ArrowException, KeyError, ValueError) as exc:
        raise RollupManifestError(f"ledger file {key!r} is unreadable: {exc}") from None


async def read_ledger(
    store: ObjectStore,
    snapshot: Snapshot,
    hours: set[str] | None = None,
    *,
    concurrency: int = 16,
) -> pa.Table:
    """Rows of the snapshot's ledger files, limited to ``hours`` (None: all hours).

    Only files whose partition is one of ``hours`` are read (a key without a parseable
    partition is read anyway). Raises `NotFound` (and other store errors) if a listed
    file cannot be fetched, `RollupManifestError` if one is not a ledger file.
    """
    wanted = [
        key
        for key in snapshot.ledger_files
        if hours is None or (hour := ledger_file_hour(key)) is None or hour in hours
    ]
    limit = asyncio.Semaphore(concurrency)

    async def fetch(key: str) -> pa.Table:
        async with limit:
            body, _ = await store.get(key)
        return decode_ledger(body, key=key)

    tables = await asyncio.gather(*(fetch(key) for key in wanted))
    table = pa.concat_tables(tables) if tables else LEDGER_SCHEMA.empty_table()
    if hours is not None:
        table = table.filter(
            pc.is_in(table.column("accepted_hour"), pa.array(sorted(hours), pa.string()))
        )
    return table


async def included_manifest_ids(
    store: ObjectStore, snapshot: Snapshot, hours: set[str]
) -> dict[str, set[str]]:
    """Per hour in ``hours``: the manifest_ids the snapshot's ledger includes (every hour
    asked for is a key, empty when nothing is included). Errors as `read_ledger`."""
    table = await read_ledger(store, snapshot, hours)
    included: dict[str, set[str]] = {hour: set() for hour in hours}
    for row in ledger_rows(table):
        included[row.accepted_hour].add(row.manifest_id)
    return included
