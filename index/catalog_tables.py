"""A catalog hour as Arrow columns, never one Python object per row (PROTOCOL §3.9).

`read_hour_table` reads an hour's catalog files (only the columns asked for) and keeps, for
each key, the row that counts (PROTOCOL §3.7: the one written last, by the rank of the
file it was first written in, `index.catalog_rank`; a superseding row wins, also after
merges). `hour_totals` is an hour's
batch count and setsum of its accepted rows (PROTOCOL §4), computed in DuckDB: SHA-256 of
each ``manifest_id + "\\n" + frame_sha256`` and the sum of the digests as eight 32-bit
limbs (exact: no limb sum can overflow a HUGEINT), so the ledger check of raw retention,
`lm-rollup verify` and the planner compare hours without a Python loop over rows.

``manifest_id`` is built column-wise from the identity, its agent part computed once per
distinct agent_id (always the hex form, as `protocol.keys.BatchIdentity.manifest_id`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from protocol import keys
from protocol.setsum import MODULUS, Setsum
from store.base import ObjectInfo, ObjectStore
from store.errors import NotFound

from .catalog import RELIST_ATTEMPTS, list_hour_files
from .catalog_local import (
    NEWEST_PER_KEY,
    NO_KEY_TWICE,
    ONE_ROW_PER_KEY,
    Copies,
    MergeLimits,
    connect,
    counted_copies,
    sql_list,
    sql_string,
)
from .catalog_rank import RANK_COLUMNS, with_rank
from .catalog_rank import newest_per_key as rank_newest_per_key
from .row_checks import first_problems, well_formed
from .rows import FILE_SCHEMA, IndexFileError, iter_batches

HOUR_NS = 3600 * 1_000_000_000
T = TypeVar("T")


@dataclass
class HourTable:
    hour: keys.UtcHour
    table: pa.Table
    """One row per key (the one that counts, `index.catalog_rank`), sorted by key."""
    files: list[ObjectInfo]

    def accepted(self) -> pa.Table:
        return self.table.filter(pc.equal(self.table.column("kind"), "accepted"))


async def read_file_table(
    store: ObjectStore, key: str, columns: Sequence[str] | None = None
) -> pa.Table:
    """One catalog file, checked column-wise a batch at a time (every row well-formed and
    of the file's hour): `IndexFileError` otherwise, `NotFound` when gone. ``columns``:
    keep only these (what is held is the body and those columns, never the whole file),
    plus the rank columns, filled (`index.catalog_rank.with_rank`)."""
    hour, _epoch, _sequence = keys.parse_index_catalog_key(key)
    body, _etag = await store.get(key)
    return await asyncio.to_thread(_checked_columns, body, key, hour, columns)


def _checked_columns(
    body: bytes, key: str, hour: keys.UtcHour, columns: Sequence[str] | None
) -> pa.Table:
    """The file's ``columns`` (default: all), checked, with its rows' ranks filled in
    (`index.catalog_rank.with_rank`)."""
    wanted = list(columns) if columns is not None else FILE_SCHEMA.names
    wanted += [name for name in RANK_COLUMNS if name not in wanted]
    kept: list[pa.RecordBatch] = []
    hour_index = hour.start_ns // HOUR_NS
    position = 0
    for batch in iter_batches(body, source=key):
        table = pa.Table.from_batches([batch])
        mask = well_formed(table)
        if not pc.all(mask).as_py():
            raise IndexFileError(f"{key}: {first_problems(table, mask, 1)[0]}")
        hours = pc.unique(pc.divide(table.column("time_unix_ns"), HOUR_NS)).to_pylist()
        if hours != [hour_index]:
            raise IndexFileError(f"{key}: rows of other hours than {hour}")
        ranked = with_rank(table, key, first_position=position)
        position += table.num_rows
        kept.extend(ranked.select(wanted).to_batches())
    schema = pa.schema([FILE_SCHEMA.field(name) for name in wanted])
    return pa.Table.from_batches(kept, schema=schema)


def newest_per_key(tables: Sequence[pa.Table]) -> pa.Table:
    """The rows of ``tables`` (catalog files' rows with their ranks filled:
    `read_file_table`), one per key: the one that counts (`index.catalog_rank`), sorted
    by key."""
    if not tables:
        raise ValueError("no tables")
    return rank_newest_per_key(pa.concat_tables(tables))


async def read_hour_table(
    store: ObjectStore, hour: keys.UtcHour, columns: Sequence[str] | None = None
) -> HourTable:
    """The hour's catalog, a key counted once (the row that counts, `index.catalog_rank`).
    A file gone after
    the listing (compaction) makes it list again, a bounded number of times. ``columns``
    must include ``key``."""
    wanted = list(columns) if columns is not None else FILE_SCHEMA.names
    if "key" not in wanted:
        raise ValueError("columns must include 'key'")
    for _attempt in range(RELIST_ATTEMPTS):
        files = await list_hour_files(store, hour)
        try:
            tables = [await read_file_table(store, info.key, wanted) for info in files]
        except NotFound:
            continue
        if not tables:
            return HourTable(hour, FILE_SCHEMA.empty_table().select(wanted), files)
        return HourTable(hour, newest_per_key(tables).select(wanted), files)
    raise IndexFileError(f"catalog hour {hour} kept changing while it was read; try again")


async def read_key_rows(store: ObjectStore, hour: keys.UtcHour, wanted: Sequence[str]) -> pa.Table:
    """The rows that count (`index.catalog_rank`) of the keys ``wanted`` (few) in the
    hour's catalog, every column: each file is read once, one at a time, and only its rows
    of those keys are kept (a retraction copies a key's rows, PROTOCOL §3.7)."""
    names = pa.array(sorted(set(wanted)), pa.string())
    for _attempt in range(RELIST_ATTEMPTS):
        files = await list_hour_files(store, hour)
        try:
            tables = [
                table.filter(pc.is_in(table.column("key"), value_set=names))
                for info in files
                for table in [await read_file_table(store, info.key)]
            ]
        except NotFound:
            continue
        if not tables:
            return FILE_SCHEMA.empty_table()
        return newest_per_key(tables)
    raise IndexFileError(f"catalog hour {hour} kept changing while it was read; try again")


def manifest_ids(table: pa.Table) -> pa.Array:
    """``agent=<agent>.boot=<boot-hex>.<seq-start>-<seq-end>`` of each row
    (`protocol.keys.BatchIdentity.manifest_id`), column-wise."""
    agents = pc.dictionary_encode(table.column("agent_id").combine_chunks())
    names = agents.dictionary.to_pylist()
    segments = pa.array([keys.long_agent_segment(a) for a in names], pa.string()).take(
        agents.indices
    )
    boot_hex = pc.replace_substring(table.column("boot_id"), "-", "")
    start = pc.utf8_lpad(pc.cast(table.column("seq_start"), pa.string()), 20, "0")
    end = pc.utf8_lpad(pc.cast(table.column("seq_end"), pa.string()), 20, "0")
    return pc.binary_join_element_wise(segments, ".boot=", boot_hex, ".", start, "-", end, "")


@dataclass(frozen=True, slots=True)
class HourTotals:
    batches: int
    records: int
    setsum: Setsum


MANIFEST_ID_SQL = """'agent=' || lower(hex(r.agent_id)) || '.boot=' || replace(r.boot_id, '-', '')
    || '.' || lpad(r.seq_start::VARCHAR, 20, '0') || '-' || lpad(r.seq_end::VARCHAR, 20, '0')"""
"""A catalog row ``r``'s ``manifest_id`` in DuckDB (the SQL form of `manifest_ids`)."""
_ACCEPTED_ROWS = """
    SELECT r.key, r.record_count, r.frame_sha256, r.time_unix_ns, r.filename,
        strlen(r.agent_id) AS agent_bytes, {mid} AS mid
    FROM {one_row_per_key} AND r.kind = 'accepted'
""".replace("{mid}", MANIFEST_ID_SQL)
"""The hour's accepted rows, one per key (the row that counts), with their ``manifest_id``."""
_OTHER_FORMS_SQL = """
CREATE TEMP TABLE other_forms AS
SELECT key FROM (
    SELECT key, row_number() OVER (PARTITION BY mid ORDER BY key) AS nth
    FROM ({accepted}) WHERE agent_bytes >= {two_form_bytes}
) WHERE nth > 1
"""
"""A batch cataloged under both agent key forms (PROTOCOL §3: only agent_ids long enough
for the ``h-`` form, a mixed-version upgrade) is one batch: every key of it but the least
(the long form: ``agent=<hex>`` sorts before ``agent=h-``). A window over those
rare rows only."""
_TOTALS_SQL = """
SELECT count(*) AS batches, coalesce(sum(record_count), 0) AS records, {limbs}
FROM (
    SELECT a.record_count, sha256(a.mid || chr(10) || a.frame_sha256) AS h
    FROM ({accepted}) AS a LEFT JOIN other_forms AS o ON a.key = o.key
    WHERE o.key IS NULL
)
"""
TWO_FORM_AGENT_BYTES = (keys.SEGMENT_MAX_BYTES - len("agent=")) // 2 + 1
"""The shortest agent_id (UTF-8 bytes) whose ``agent=<hex>`` segment is too long, so its
accepted key is ``agent=h-...`` and a store may also hold the long form (PROTOCOL §3)."""
_BATCHES_SQL = """
COPY (
    SELECT a.key, a.mid AS manifest_id, a.frame_sha256, a.record_count, a.time_unix_ns,
        f.name AS catalog_file, {hour} AS accepted_hour
    FROM ({accepted}) AS a LEFT JOIN other_forms AS o ON a.key = o.key
    JOIN files AS f ON a.filename = f.path
    WHERE o.key IS NULL
) TO {out} (FORMAT parquet, COMPRESSION zstd)
"""
"""The hour's batches as `BATCH_COLUMNS` (``catalog_file``: the name of the catalog file
the counted row came from; names sort in write order across hours too)."""
BATCH_COLUMNS = (
    "key",
    "manifest_id",
    "frame_sha256",
    "record_count",
    "time_unix_ns",
    "catalog_file",
    "accepted_hour",
)
_CHECK_SQL = """
SELECT count(*) FROM read_parquet({files})
WHERE kind NOT IN ('accepted', 'quarantine', 'retracted')
   OR NOT regexp_full_match(frame_sha256, '[0-9a-f]{{64}}')
   OR time_unix_ns // {hour_ns} != {hour_index} OR agent_id IS NULL OR boot_id IS NULL
   OR seq_start IS NULL OR seq_end IS NULL
"""


def _limbs(column: str) -> str:
    return ", ".join(f"sum(('0x' || substr({column}, {1 + 8 * i}, 8))::UBIGINT)" for i in range(8))


def _setsum_of_limbs(sums: Sequence[object]) -> Setsum:
    total = sum(int(str(s or 0)) << (32 * (7 - i)) for i, s in enumerate(sums))
    return Setsum(total % MODULUS)


async def read_hour_totals(
    store: ObjectStore,
    hour: keys.UtcHour,
    limits: MergeLimits | None = None,
    *,
    batches_to: str | None = None,
) -> HourTotals:
    """`hour_totals` of the hour's catalog, out of core (`query_hour`: an hour of millions
    of batches in bounded memory). ``batches_to``: also write the hour's batches (the rows
    the totals count, `BATCH_COLUMNS`) to a local Parquet file there, for checks against
    the ledger (`index.catalog_ledger`)."""

    def totals(con: duckdb.DuckDBPyConnection, files: str, named: dict[str, str]) -> HourTotals:
        accepted = _ACCEPTED_ROWS.format(one_row_per_key=ONE_ROW_PER_KEY.format(files=files))
        con.execute(_OTHER_FORMS_SQL.format(accepted=accepted, two_form_bytes=TWO_FORM_AGENT_BYTES))
        row = con.execute(_TOTALS_SQL.format(accepted=accepted, limbs=_limbs("h"))).fetchone()
        if batches_to is not None:
            mapping = pa.table(
                {
                    "path": pa.array(list(named), pa.string()),
                    "name": pa.array([n.rsplit("/", 1)[-1] for n in named.values()]),
                }
            )
            con.register("files", mapping)
            con.execute(
                _BATCHES_SQL.format(
                    accepted=accepted, hour=sql_string(hour.iso), out=sql_string(batches_to)
                )
            )
        assert row is not None
        batches, records, *sums = row
        return HourTotals(int(batches), int(records), _setsum_of_limbs(sums))

    found = await query_hour(store, hour, limits or MergeLimits(), totals)
    if found is None:
        if batches_to is not None:
            await asyncio.to_thread(write_empty_batches, batches_to)
        return HourTotals(0, 0, Setsum())
    return found


async def query_hour(
    store: ObjectStore,
    hour: keys.UtcHour,
    limits: MergeLimits,
    run: Callable[[duckdb.DuckDBPyConnection, str, dict[str, str]], T],
) -> T | None:
    """``run(con, files, named)`` over the hour's catalog in DuckDB, out of core (None when
    the hour has no catalog file): the files are copied locally one at a time, every row
    is checked for kind, hash, identity presence and hour in SQL (the writer checked each
    in full), and ``newest`` holds the row that counts of each key held more than once
    (`index.catalog_local.NEWEST_PER_KEY`; read with ``ONE_ROW_PER_KEY.format(files=files)``;
    empty without the aggregate for one merged file, `Copies.one_merged_file`).
    ``files`` is the SQL list of the copies whose rows count, ``named`` maps each copy to
    its store key. `IndexFileError` when a file is not a catalog file of the hour (or
    DuckDB fails on it); a file gone after the listing makes it list again, a bounded
    number of times."""
    for _attempt in range(RELIST_ATTEMPTS):
        files = await list_hour_files(store, hour)
        if not files:
            return None
        try:
            async with counted_copies(store, files, limits) as copies:
                return await asyncio.to_thread(_in_duckdb, copies, hour, limits, run)
        except NotFound:
            continue
    raise IndexFileError(f"catalog hour {hour} kept changing while it was read; try again")


def write_empty_batches(path: str) -> None:
    """An empty batches file (`BATCH_COLUMNS`): an hour without catalog files."""
    schema = pa.schema(
        [
            pa.field(name, pa.int64() if name in ("record_count", "time_unix_ns") else pa.string())
            for name in BATCH_COLUMNS
        ]
    )
    pq.write_table(schema.empty_table(), path)


def _in_duckdb(
    copies: Copies,
    hour: keys.UtcHour,
    limits: MergeLimits,
    run: Callable[[duckdb.DuckDBPyConnection, str, dict[str, str]], T],
) -> T:
    files = sql_list(list(copies.counted.values()))
    named = {path: name for name, path in copies.counted.items()}
    try:
        with connect(limits, copies.directory) as con:
            bad = con.execute(
                _CHECK_SQL.format(files=files, hour_ns=HOUR_NS, hour_index=hour.start_ns // HOUR_NS)
            ).fetchone()
            if bad is not None and bad[0]:
                raise IndexFileError(f"catalog hour {hour}: {bad[0]} malformed row(s)")
            distinct = copies.one_merged_file
            con.execute((NO_KEY_TWICE if distinct else NEWEST_PER_KEY).format(files=files))
            return run(con, files, named)
    except duckdb.Error as exc:
        raise IndexFileError(f"catalog hour {hour}: {exc}") from None


def hour_totals(accepted: pa.Table) -> HourTotals:
    """Batches, records and setsum of accepted rows (identity columns, ``frame_sha256``
    and ``record_count``)."""
    if accepted.num_rows == 0:
        return HourTotals(0, 0, Setsum())
    terms = pa.table(
        {"mid": manifest_ids(accepted), "sha": accepted.column("frame_sha256").combine_chunks()}
    )
    limbs = ", ".join(f"sum(('0x' || substr(h, {1 + 8 * i}, 8))::UBIGINT)" for i in range(8))
    with duckdb.connect(config={"memory_limit": "256MB", "threads": 1}) as con:
        con.register("terms", terms)
        row = con.sql(
            f"SELECT count(*), {limbs} FROM (SELECT sha256(mid || chr(10) || sha) AS h FROM terms)"
        ).fetchone()
    assert row is not None
    count, *sums = row
    records = pc.sum(accepted.column("record_count")).as_py() or 0
    return HourTotals(int(count), int(records), _setsum_of_limbs(sums))
