"""The planner's engine: catalog hours minus the ledger, in DuckDB, out of core (PROTOCOL
§3.9).

`pending_items` copies the checked hours' catalog files (`index.catalog_local`, one body
in memory at a time) and the snapshot's ledger files of those hours into a private
directory, then in one DuckDB session under ``MergeLimits.memory_limit_mb`` (spilling):

1. checks every catalog row's kind, hash, identity, hour and (accepted rows) record count
   and raw key: the frame blob of its hash with no range, or a canonical bundle key with
   a frame's range (PROTOCOL §3.10, as `index.row_checks.raw_keys_ok`; that the range is
   an index entry is the reader's check, `index.raw_reads`); a file holding a row of
   another hour is refused, as `index.catalog.read_file` does;
2. keeps one row per (hour, key): the one that counts (PROTOCOL §3.7: the highest rank,
   `index.catalog_rank`; the copies' rank columns are filled);
3. keeps the accepted rows, builds ``manifest_id`` in SQL (the agent's hex form, as
   `protocol.keys.BatchIdentity.manifest_id`) and anti-joins the ledger's rows of the
   same hour;
4. keeps one row per ``manifest_id``: the earliest hour's, then the least key (both agent
   key forms of a batch, PROTOCOL §3). With one hour checked only rows whose agent_id is
   long enough for two key forms can collide, so the window runs over those rare rows
   only; with several hours, over the ids that occur more than once.

5. (`plan_hours`) finds the included batches whose key's counting row is ``retracted``
   (`_RETRACTED_SQL`) and refuses planned batches whose seq range overlaps another batch
   of the same agent and boot under another identity (`_OVERLAP_SQL`; the included
   batches compared are those of the checked hours' ledger files).

The rows stream out in record batches with their raw key and range, gain a bundle's
least size (`_KEPT_SQL`) and ``accepted_hour``, and are written to a local Arrow
IPC file that is memory-mapped and unlinked: the plan's items, never a Python object per
batch, never all on the driver's heap.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from index.catalog import RELIST_ATTEMPTS, list_hour_files
from index.catalog_local import MergeLimits, connect, counted_copies, row_id, sql_list
from index.catalog_rank import duckdb_write_rank
from index.catalog_tables import TWO_FORM_AGENT_BYTES
from index.rows import FRAME_LENGTHS, IndexFileError
from protocol import bundle, keys
from rollup.job.tasks import WORK_SCHEMA
from rollup.table.manifest_errors import RollupManifestError
from store.base import ObjectStore
from store.errors import NotFound

HOUR_NS = 3600 * 1_000_000_000
_BUNDLE_KEY_RE = (
    keys.RAW_BUNDLES_PREFIX
    + "[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{64}[.]"  # no backslash in the SQL literal
    + keys.RAW_BUNDLE_SUFFIX.removeprefix(".")
)
OUTPUT_BATCH_ROWS = 65_536

_CHECK_SQL = """
SELECT
    count(*) FILTER (WHERE kind NOT IN ('accepted', 'quarantine', 'retracted')
        OR NOT regexp_full_match(frame_sha256, '[0-9a-f]{{64}}') OR agent_id IS NULL
        OR boot_id IS NULL OR seq_start IS NULL OR seq_end IS NULL
        OR (kind = 'accepted' AND (record_count IS NULL OR NOT (
            (raw_offset IS NULL AND raw_length IS NULL AND raw_blob_key IS NOT DISTINCT FROM
                '{raw_prefix}' || substr(frame_sha256, 1, 2) || '/' || substr(frame_sha256, 3, 2)
                || '/' || frame_sha256 || '{raw_suffix}')
            OR (coalesce(regexp_full_match(raw_blob_key, '{bundle_re}'), false)
                AND substr(raw_blob_key, {hh1}, 2) || substr(raw_blob_key, {hh2}, 2)
                    = substr(raw_blob_key, {digest}, 4)
                AND raw_offset >= 0 AND raw_length = frame_bytes
                AND raw_length BETWEEN {min_frame} AND {max_frame}))))),
    count(*) FILTER (WHERE time_unix_ns // {hour_ns} != {hour_index}),
    min(time_unix_ns) FILTER (WHERE time_unix_ns // {hour_ns} != {hour_index})
FROM read_parquet({files})
"""
_CATALOG_VIEW = """
CREATE TEMP VIEW cat AS
SELECT key, kind, agent_id, boot_id, seq_start, seq_end, frame_sha256, record_count,
    raw_blob_key, raw_offset, raw_length, time_unix_ns // {hour_ns} AS h, first_epoch,
    first_sequence, first_position, {row_id} AS row_id
FROM read_parquet({files}, file_row_number = true)
""".replace("{row_id}", row_id())
_NEWEST_SQL = """
CREATE TEMP TABLE newest AS
SELECT h, key, arg_max(row_id, {rank}) AS pick
FROM cat GROUP BY h, key HAVING count(*) > 1
""".replace("{rank}", duckdb_write_rank())
"""(hour, key)s held more than once — in more than one file, or twice in one (two log
rows of one key in one chunk) — and the one row that counts for each (``row_id``,
`index.catalog_local.row_id`): the highest rank (`index.catalog_rank`); a tie is one row
held twice, and either copy counts. Fixed-size aggregate states, so it spills within the
memory limit (`index.catalog_local.NEWEST_PER_KEY`)."""
_DONE_SQL = """
CREATE TEMP TABLE done AS
SELECT l.manifest_id, hrs.h FROM read_parquet({files}) AS l JOIN hrs ON l.accepted_hour = hrs.iso
"""
_PENDING_VIEW = """
CREATE TEMP VIEW pending AS
SELECT a.* FROM (
    SELECT c.h, c.key, c.frame_sha256, c.record_count, c.raw_blob_key, c.raw_offset,
        c.raw_length, strlen(c.agent_id) AS agent_bytes,
        'agent=' || lower(hex(c.agent_id)) || '.boot=' || replace(c.boot_id, '-', '') || '.'
        || lpad(c.seq_start::VARCHAR, 20, '0') || '-' || lpad(c.seq_end::VARCHAR, 20, '0')
        AS mid
    FROM cat AS c LEFT JOIN newest AS n ON c.h = n.h AND c.key = n.key
    WHERE (n.key IS NULL OR c.row_id = n.pick)
        AND c.kind = 'accepted'
) AS a LEFT JOIN done AS d ON a.h = d.h AND a.mid = d.manifest_id
WHERE d.manifest_id IS NULL
"""
"""Accepted rows (one per hour and key) that the ledger's same hour does not include."""
_LOSERS_SQL = """
CREATE TEMP TABLE losers AS
SELECT h, key FROM (
    SELECT h, key, row_number() OVER (PARTITION BY mid ORDER BY h, key) AS nth
    FROM pending WHERE mid IN (SELECT mid FROM pending {where} GROUP BY mid HAVING count(*) > 1)
) WHERE nth > 1
"""
"""Every row of a ``manifest_id`` but the first (earliest hour, then least key)."""
_ITEMS_SQL = """
CREATE TEMP TABLE items AS
SELECT p.mid AS manifest_id, p.frame_sha256, p.record_count, p.h, p.raw_blob_key,
    p.raw_offset, p.raw_length
FROM pending AS p LEFT JOIN losers AS l ON p.h = l.h AND p.key = l.key
WHERE l.key IS NULL
"""
_RETRACTED_SQL = """
WITH counting AS (
    SELECT c.h, c.key, c.kind,
        'agent=' || lower(hex(c.agent_id)) || '.boot=' || replace(c.boot_id, '-', '') || '.'
        || lpad(c.seq_start::VARCHAR, 20, '0') || '-' || lpad(c.seq_end::VARCHAR, 20, '0')
        AS mid
    FROM cat AS c LEFT JOIN newest AS n ON c.h = n.h AND c.key = n.key
    WHERE n.key IS NULL OR c.row_id = n.pick
)
SELECT DISTINCT r.h, r.mid AS manifest_id
FROM counting AS r JOIN done AS d ON d.h = r.h AND d.manifest_id = r.mid
WHERE r.kind = 'retracted' AND starts_with(r.key, '{accepted_prefix}')
    AND r.mid NOT IN (SELECT mid FROM counting WHERE kind = 'accepted')
ORDER BY 1, 2
"""
"""Included batches (the ledger's same hour holds them) whose key's counting row is
``retracted`` and that no accepted row counts for under another key form: the rollup
removes them (PROTOCOL §3.7 "Retraction"). A retracted quarantine row never names an
included batch (its key is a quarantine key)."""
_OVERLAP_SQL = """
WITH batches AS (
    SELECT h, manifest_id, pending, left(manifest_id, length(manifest_id) - 42) AS source,
        substr(manifest_id, length(manifest_id) - 40, 20)::UBIGINT AS lo,
        right(manifest_id, 20)::UBIGINT AS hi
    FROM (SELECT h, manifest_id, true AS pending FROM items
          UNION ALL SELECT h, manifest_id, false FROM done)
)
SELECT DISTINCT p.h, p.manifest_id, min(o.manifest_id) AS other
FROM batches AS p JOIN batches AS o ON p.source = o.source AND p.manifest_id != o.manifest_id
    AND o.lo <= p.hi AND p.lo <= o.hi
WHERE p.pending GROUP BY p.h, p.manifest_id ORDER BY 1, 2
"""
"""Planned batches whose seq range overlaps another batch of the same agent and boot (an
included one of the checked hours, or another planned one) under another identity: the
rollup refuses them (``overlapping-identity``), so the points of one identity come from
one batch and a retraction never removes a real batch's points."""
_REFUSED_TABLE = """
CREATE TEMP TABLE refused AS SELECT * FROM arrow_refused
"""
_KEPT_SQL = """
WITH bundles AS (
    SELECT raw_blob_key, max(raw_offset + raw_length) + {entry} * count(DISTINCT raw_offset)
        + {footer} AS object_bytes
    FROM cat WHERE kind = 'accepted' AND raw_offset IS NOT NULL GROUP BY raw_blob_key
)
SELECT i.*, b.object_bytes FROM items AS i LEFT JOIN bundles AS b
    ON i.raw_offset IS NOT NULL AND b.raw_blob_key = i.raw_blob_key
WHERE NOT EXISTS (SELECT 1 FROM refused AS r WHERE r.h = i.h AND r.manifest_id = i.manifest_id)
"""
"""The items with, for a bundled one, a lower bound of its bundle's size: its frames the
checked hours' rows name (their ends, and an index entry each) and the footer. Dead bytes
and frames of other hours are not seen, so a bundle may be read whole at a little less
than half covered (`index.raw_reads.plan_reads`): a bounded cost, never a wrong read."""


REFUSED_SCHEMA = pa.schema(
    [
        pa.field("accepted_hour", pa.string()),
        pa.field("manifest_id", pa.string()),
        pa.field("other", pa.string()),
    ]
)
"""A planned batch refused as ``overlapping-identity`` and one batch it overlaps."""
RETRACTED_SCHEMA = pa.schema(
    [pa.field("accepted_hour", pa.string()), pa.field("manifest_id", pa.string())]
)
"""An included batch whose key's counting catalog row is ``retracted``."""


@dataclass(frozen=True, slots=True)
class PlannedHours:
    """What the checked hours ask of a run: ``items`` to include (`WORK_SCHEMA`), included
    batches to remove (``retracted``, `RETRACTED_SCHEMA`) and batches refused
    (``refused``, `REFUSED_SCHEMA`). The last two are rare and small."""

    items: pa.Table
    retracted: pa.Table = field(default_factory=RETRACTED_SCHEMA.empty_table)
    refused: pa.Table = field(default_factory=REFUSED_SCHEMA.empty_table)


async def pending_items(
    store: ObjectStore,
    hours: Sequence[keys.UtcHour],
    ledger_files: Sequence[str],
    limits: MergeLimits,
) -> pa.Table:
    """`plan_hours`' items."""
    return (await plan_hours(store, hours, ledger_files, limits)).items


async def plan_hours(
    store: ObjectStore,
    hours: Sequence[keys.UtcHour],
    ledger_files: Sequence[str],
    limits: MergeLimits,
) -> PlannedHours:
    """The `WORK_SCHEMA` rows of ``hours``' accepted batches that ``ledger_files`` (the
    snapshot's ledger files of those hours) do not include, one per ``manifest_id``;
    memory-mapped from a local file; and the included batches that are retracted and the
    refused ones (`PlannedHours`). A catalog file gone after the listing (compaction)
    makes it list again, a bounded number of times."""
    with tempfile.TemporaryDirectory(prefix="lm-plan-", dir=limits.spill_dir) as tmp:
        ledger_paths = []
        for i, key in enumerate(ledger_files):
            body, _etag = await store.get(key)  # NotFound propagates: the ledger is incomplete
            path = Path(tmp, f"ledger-{i:08d}.parquet")
            await asyncio.to_thread(path.write_bytes, body)
            del body
            ledger_paths.append((key, str(path)))
        for _attempt in range(RELIST_ATTEMPTS):
            listed = [(hour, await list_hour_files(store, hour)) for hour in hours]
            every_file = [info for _hour, files in listed for info in files]
            if not every_file:
                return PlannedHours(WORK_SCHEMA.empty_table())
            try:
                async with counted_copies(store, every_file, limits) as copies:
                    counted = copies.counted
                    per_hour = [
                        (hour, [counted[f.key] for f in files if f.key in counted])
                        for hour, files in listed
                    ]
                    return await asyncio.to_thread(
                        _plan_in_duckdb, per_hour, ledger_paths, limits, copies.directory
                    )
            except NotFound:
                continue
    raise IndexFileError("catalog hours kept changing while they were read; try again")


def _plan_in_duckdb(
    per_hour: list[tuple[keys.UtcHour, list[str]]],
    ledger_paths: list[tuple[str, str]],
    limits: MergeLimits,
    tmp: str,
) -> PlannedHours:
    per_hour = [(hour, paths) for hour, paths in per_hour if paths]
    if not per_hour:
        return PlannedHours(WORK_SCHEMA.empty_table())
    files = [p for _hour, paths in per_hour for p in paths]
    index_of = np.array([hour.start_ns // HOUR_NS for hour, _ in per_hour], dtype=np.int64)
    isos = pa.array([hour.iso for hour, _ in per_hour], pa.string())
    try:
        with connect(limits, tmp) as con:
            for hour, paths in per_hour:
                _check_hour(con, hour, paths)
            con.execute(_CATALOG_VIEW.format(hour_ns=HOUR_NS, files=sql_list(files)))
            con.execute(_NEWEST_SQL)
            con.register("hrs_arrow", pa.table({"h": pa.array(index_of), "iso": isos}))
            con.execute("CREATE TEMP TABLE hrs AS SELECT * FROM hrs_arrow")
            _load_ledger(con, ledger_paths)
            con.execute(_PENDING_VIEW)
            where = f"WHERE agent_bytes >= {TWO_FORM_AGENT_BYTES}" if len(per_hour) == 1 else ""
            con.execute(_LOSERS_SQL.format(where=where))
            con.execute(_ITEMS_SQL)
            retracted = con.execute(
                _RETRACTED_SQL.format(accepted_prefix=keys.ACCEPTED_PREFIX)
            ).to_arrow_table()
            refused = con.execute(_OVERLAP_SQL).to_arrow_table()
            con.register("arrow_refused", refused)
            con.execute(_REFUSED_TABLE)
            kept = _KEPT_SQL.format(entry=bundle.ENTRY_LEN, footer=bundle.FOOTER_LEN)
            reader = con.execute(kept).to_arrow_reader(OUTPUT_BATCH_ROWS)
            return PlannedHours(
                _spilled(reader, index_of, isos, limits),
                _with_hours(retracted, index_of, isos, RETRACTED_SCHEMA),
                _with_hours(refused, index_of, isos, REFUSED_SCHEMA),
            )
    except duckdb.Error as exc:
        raise IndexFileError(f"catalog hours {[h.iso for h, _ in per_hour]}: {exc}") from None


def _check_hour(con: duckdb.DuckDBPyConnection, hour: keys.UtcHour, paths: list[str]) -> None:
    index = hour.start_ns // HOUR_NS
    row = con.execute(
        _CHECK_SQL.format(
            files=sql_list(paths),
            hour_ns=HOUR_NS,
            hour_index=index,
            raw_prefix=keys.RAW_BLOBS_PREFIX,
            raw_suffix=keys.RAW_BLOB_SUFFIX,
            bundle_re=_BUNDLE_KEY_RE,
            hh1=len(keys.RAW_BUNDLES_PREFIX) + 1,
            hh2=len(keys.RAW_BUNDLES_PREFIX) + 4,
            digest=len(keys.RAW_BUNDLES_PREFIX) + 7,
            min_frame=FRAME_LENGTHS[0],
            max_frame=FRAME_LENGTHS[1],
        )
    ).fetchone()
    assert row is not None
    malformed, strays, stray_ns = row
    if strays:
        other = keys.UtcHour.from_unix_ns(int(stray_ns))
        raise IndexFileError(
            f"catalog hour {hour}: {strays} row(s) whose time belongs to hour {other}"
        )
    if malformed:
        raise IndexFileError(f"catalog hour {hour}: {malformed} malformed row(s)")


def _load_ledger(con: duckdb.DuckDBPyConnection, ledger_paths: list[tuple[str, str]]) -> None:
    if not ledger_paths:
        con.execute("CREATE TEMP TABLE done (manifest_id VARCHAR, h BIGINT)")
        return
    try:
        con.execute(_DONE_SQL.format(files=sql_list([p for _key, p in ledger_paths])))
    except duckdb.Error as exc:
        names = [key for key, _p in ledger_paths]
        raise RollupManifestError(f"ledger files {names} are unreadable: {exc}") from None


def _with_hours(
    table: pa.Table, index_of: np.ndarray, isos: pa.Array, schema: pa.Schema
) -> pa.Table:
    """``table``'s hour numbers (``h``) as ``accepted_hour``, in ``schema``."""
    hour_at = np.searchsorted(index_of, table.column("h").to_numpy())
    columns = [isos.take(pa.array(hour_at))]
    columns += [table.column(name).cast(pa.string()) for name in schema.names[1:]]
    return pa.Table.from_arrays(columns, schema=schema)


def _spilled(
    reader: pa.RecordBatchReader, index_of: np.ndarray, isos: pa.Array, limits: MergeLimits
) -> pa.Table:
    """The reader's rows as `WORK_SCHEMA`, written to a local IPC file and memory-mapped
    (the file is unlinked at once; the mapping keeps it until the table is dropped)."""
    handle, path = tempfile.mkstemp(prefix="lm-plan-items-", suffix=".arrow", dir=limits.spill_dir)
    os.close(handle)
    try:
        rows = 0
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, WORK_SCHEMA) as writer:
            for batch in reader:
                if batch.num_rows == 0:
                    continue
                rows += batch.num_rows
                hour_at = np.searchsorted(index_of, batch.column("h").to_numpy())
                writer.write_batch(
                    pa.record_batch(
                        [
                            batch.column("manifest_id").cast(pa.string()),
                            batch.column("frame_sha256").cast(pa.string()),
                            batch.column("raw_blob_key").cast(pa.string()),
                            isos.take(pa.array(hour_at)),
                            batch.column("record_count").cast(pa.int64()),
                            batch.column("raw_offset").cast(pa.int64()),
                            batch.column("raw_length").cast(pa.int64()),
                            batch.column("object_bytes").cast(pa.int64()),
                        ],
                        schema=WORK_SCHEMA,
                    )
                )
        if rows == 0:
            return WORK_SCHEMA.empty_table()
        return pa.ipc.open_file(pa.memory_map(path, "r")).read_all()
    finally:
        os.unlink(path)
