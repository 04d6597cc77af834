"""The full audit's joins out of core, in DuckDB (`reconciler.audit.sql` holds the SQL).

Inputs are local files: the audit's listing parts (`reconciler.audit.listing`'s schema:
``key``, ``etag``, ``size``, ``last_modified``) and copies of the catalog files the audit
pinned (`fetch_catalog`: a pinned file that is gone is `PinnedFileMissing`, never "no
rows"; one that is not an index file is returned as unreadable, for the caller to move
aside and report as today). Only the columns the joins need are read.

`AuditJoins` opens DuckDB with ``memory_limit`` (``reconciler.audit_memory_limit_mb``),
``temp_directory`` in the spill directory (it spills there beyond the limit),
``preserve_insertion_order = false`` and bounded threads, and writes each result as a
Parquet file in the spill directory, which callers read in bounded batches
(`iter_batches`): nothing is returned as one Python object per row.

Results (`JoinResults`): ``records.parquet`` (records to read, and phantom candidates:
see `reconciler.audit.sql.RECORD_JOIN`), ``blobs.parquet`` (orphans and missing-blob
candidates, `reconciler.audit.sql.BLOB_JOIN`), ``referencing.parquet`` (a record that
references each missing-blob candidate), and the counts of what was listed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from index.catalog_local import sql_list, sql_string, write_normalized
from index.rows import IndexFileError
from protocol import keys
from reconciler.audit import sql as audit_sql
from store.base import ObjectStore
from store.errors import NotFound

ListingKind = Literal["accepted", "quarantine", "raw-blobs"]
LISTING_KINDS: tuple[ListingKind, ...] = ("accepted", "quarantine", "raw-blobs")
CATALOG_COLUMNS = ["key", "kind", "etag", "frame_sha256", "accepted_frame_sha256", "time_unix_ns"]
ROWS_PER_FILE_RANK = 1 << 32
"""``row_rank`` = file rank x this + the row's position in its file (files hold far fewer)."""
BATCH_ROWS = 4096
"""Rows per batch when results are read back (`iter_batches`)."""


class PinnedFileMissing(RuntimeError):
    """A catalog file the audit pinned is gone: compaction broke the pin, or the store
    lost it. The audit stops incomplete (its joins would count the file's rows missing)."""


@dataclass(frozen=True, slots=True)
class CatalogCopy:
    """A local copy of one pinned catalog file; ``rank``: its place in write order."""

    name: str
    path: str
    hour: keys.UtcHour
    rank: int


async def fetch_catalog(
    store: ObjectStore, names: Sequence[str], directory: str, *, concurrency: int = 8
) -> tuple[list[CatalogCopy], list[tuple[str, str]]]:
    """Local copies of the catalog files ``names`` (each with every column: one written
    before a column existed gets it as nulls), ranked by name (epoch, then sequence; ties
    in the given order), and the names that are not index files, each with why
    (unreadable). ``concurrency`` GETs at a time (one body each in memory). Raises
    `PinnedFileMissing`."""
    os.makedirs(directory, exist_ok=True)
    parsed = sorted(
        ((keys.parse_index_catalog_key(name), name) for name in names),
        key=lambda item: (item[0][1], item[0][2]),
    )
    copies: dict[int, CatalogCopy] = {}
    unreadable: dict[int, tuple[str, str]] = {}
    slots = asyncio.Semaphore(max(1, concurrency))

    async def one(rank: int, hour: keys.UtcHour, name: str) -> None:
        async with slots:
            try:
                body, _etag = await store.get(name)
            except NotFound:
                raise PinnedFileMissing(f"pinned catalog file {name!r} is gone") from None
            path = os.path.join(directory, f"{rank:08d}.parquet")
            try:
                await asyncio.to_thread(write_normalized, Path(path), body, name)
                await asyncio.to_thread(pq.read_metadata, path)
            except (IndexFileError, pa.ArrowException, OSError) as exc:
                unreadable[rank] = (name, str(exc))
                return
            copies[rank] = CatalogCopy(name, path, hour, rank)

    window = max(1, concurrency) * 4  # tasks created at a time: bounded, not one per file
    try:
        for start in range(0, len(parsed), window):
            async with asyncio.TaskGroup() as group:
                for rank in range(start, min(len(parsed), start + window)):
                    (hour, _epoch, _sequence), name = parsed[rank]
                    group.create_task(one(rank, hour, name))
    except BaseExceptionGroup as errors:  # one error as itself (a missing file first)
        flat = list(_leaves(errors))
        raise next((e for e in flat if isinstance(e, PinnedFileMissing)), flat[0]) from None
    return [copies[r] for r in sorted(copies)], [unreadable[r] for r in sorted(unreadable)]


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(error)
        else:
            yield error


@dataclass(frozen=True, slots=True)
class JoinLimits:
    born_before_ns: int
    """The audit's start plus the settle margin: later records are the steady pass's."""
    phantom_before_ns: int
    """The audit's start minus the settle margin: a phantom's newest hour ended before."""
    orphan_before_ns: int
    """Store time minus the retry horizon: an orphan was last modified before."""


@dataclass
class JoinResults:
    records: str
    blobs: str
    referencing: str
    listed_old: dict[str, int] = field(default_factory=dict)
    listed_young: dict[str, int] = field(default_factory=dict)
    blobs_listed: int = 0
    """Listed keys that name a blob (others under ``raw-blobs/v1/`` are skipped)."""
    reasons: dict[str, int] = field(default_factory=dict)


def iter_batches(path: str, *, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """A result file in batches of `BATCH_ROWS` rows."""
    parquet = pq.ParquetFile(path)
    try:
        yield from parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns)
    finally:
        parquet.close()


class AuditJoins:
    """One DuckDB session over the listing parts and catalog copies (see module)."""

    def __init__(
        self,
        listing: Mapping[ListingKind, Sequence[str]],
        catalog: Sequence[CatalogCopy],
        spill_dir: str,
        *,
        memory_limit_mb: int,
        threads: int = 2,
    ) -> None:
        self._dir = spill_dir
        os.makedirs(os.path.join(spill_dir, "duckdb-spill"), exist_ok=True)
        # A database file in the spill directory: the stages' tables live on disk.
        database = os.path.join(spill_dir, "audit.duckdb")
        if os.path.exists(database):
            os.remove(database)  # a crashed run's: the joins are re-run from their inputs
        self._con = duckdb.connect(
            database,
            config={
                "memory_limit": f"{memory_limit_mb}MB",
                "temp_directory": os.path.join(spill_dir, "duckdb-spill"),
                "threads": max(1, threads),
                "preserve_insertion_order": False,
            },
        )
        self._catalog = list(catalog)
        self._create_views(listing)

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> AuditJoins:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _create_views(self, listing: Mapping[ListingKind, Sequence[str]]) -> None:
        con = self._con
        parts = []
        for kind in LISTING_KINDS:
            paths = list(listing.get(kind, ()))
            if paths:
                parts.append(
                    f"SELECT {sql_string(kind)} AS kind, key, etag, size, "
                    f"epoch_us(last_modified) * 1000 AS last_modified_ns "
                    f"FROM read_parquet({sql_list(paths)})"
                )
        if not parts:
            parts.append(
                "SELECT NULL::VARCHAR AS kind, NULL::VARCHAR AS key, NULL::VARCHAR AS etag, "
                "NULL::BIGINT AS size, NULL::BIGINT AS last_modified_ns WHERE false"
            )
        con.execute("CREATE TEMP VIEW listing AS " + " UNION ALL ".join(parts))
        con.execute(
            "CREATE OR REPLACE TABLE catalog_files (path VARCHAR, file_rank INTEGER, "
            "hour_start_ns BIGINT, retired BOOLEAN)"
        )
        self.set_retired(frozenset())
        columns = ", ".join(CATALOG_COLUMNS)
        if self._catalog:
            source = (
                f"SELECT {columns}, filename, file_row_number FROM read_parquet("
                f"{sql_list([c.path for c in self._catalog])}, filename = true, "
                "file_row_number = true)"
            )
        else:
            source = (
                "SELECT NULL::VARCHAR AS key, NULL::VARCHAR AS kind, NULL::VARCHAR AS etag, "
                "NULL::VARCHAR AS frame_sha256, NULL::VARCHAR AS accepted_frame_sha256, "
                "NULL::BIGINT AS time_unix_ns, NULL::VARCHAR AS filename, "
                "NULL::BIGINT AS file_row_number WHERE false"
            )
        con.execute(
            "CREATE TEMP VIEW catalog_rows AS SELECT r.key, r.kind, r.etag, r.frame_sha256, "
            "r.accepted_frame_sha256, r.time_unix_ns, "
            "('0x' || substr(r.frame_sha256, 1, 15))::BIGINT AS sha_prefix, "
            "md5_number(r.key) AS key_id, "
            f"f.file_rank::BIGINT * {ROWS_PER_FILE_RANK} + r.file_row_number AS row_rank, "
            "(f.retired AND r.kind = 'accepted') AS retired, f.hour_start_ns "
            f"FROM ({source}) r JOIN catalog_files f ON r.filename = f.path"
        )

    def set_retired(self, hours: frozenset[int]) -> None:
        """The hours (start, ns) whose accepted rows keep no blob alive (raw retention's
        retired hours that hold, `reconciler.gc.raw_retention.Retired.holds`)."""
        con = self._con
        con.execute("DELETE FROM catalog_files")
        if self._catalog:
            rows = [
                (c.path, c.rank, c.hour.start_ns, c.hour.start_ns in hours) for c in self._catalog
            ]
            con.executemany("INSERT INTO catalog_files VALUES (?, ?, ?, ?)", rows)

    def accepted_batches(self, hours: Sequence[int]) -> dict[int, int]:
        """Unique accepted batches per catalog hour of ``hours`` (start, ns)."""
        if not hours:
            return {}
        con = self._con
        con.execute(
            "CREATE OR REPLACE TEMP VIEW catalog_rows_of_covered_hours AS "
            "SELECT * FROM catalog_rows WHERE hour_start_ns IN ("
            + ", ".join(str(int(h)) for h in hours)
            + ")"
        )
        found = dict(con.execute(audit_sql.RETIRED_HOUR_BATCHES).fetchall())
        return {int(h): int(found.get(h, 0)) for h in hours}

    def run(self, limits: JoinLimits) -> JoinResults:
        """Run the joins; results land in the spill directory (see module)."""
        con = self._con
        params = {
            "born_before_ns": int(limits.born_before_ns),
            "phantom_before_ns": int(limits.phantom_before_ns),
            "orphan_before_ns": int(limits.orphan_before_ns),
        }
        results = JoinResults(
            records=os.path.join(self._dir, "records.parquet"),
            blobs=os.path.join(self._dir, "blobs.parquet"),
            referencing=os.path.join(self._dir, "referencing.parquet"),
        )
        for kind, old, young in con.execute(
            audit_sql.bind(audit_sql.LISTED_COUNTS, **params)
        ).fetchall():
            results.listed_old[kind] = int(old)
            results.listed_young[kind] = int(young)
        [(blobs,)] = con.execute(audit_sql.BLOBS_LISTED).fetchall()
        results.blobs_listed = int(blobs)
        for table, query in (
            ("per_key", audit_sql.PER_KEY),
            ("newest", audit_sql.NEWEST),
            ("record_candidates", audit_sql.bind(audit_sql.RECORD_CANDIDATES, **params)),
        ):
            con.execute(f"CREATE OR REPLACE TABLE {table} AS {query}")
            if table == "newest":
                con.execute("DROP TABLE per_key")
        con.execute("DROP TABLE newest")
        self._copy(audit_sql.RECORD_JOIN + " ORDER BY key", results.records)
        con.execute("DROP TABLE record_candidates")
        con.execute(f"CREATE OR REPLACE TABLE referenced AS {audit_sql.REFERENCED}")
        self._copy(audit_sql.bind(audit_sql.BLOB_JOIN, **params), results.blobs)
        con.execute("DROP TABLE referenced")
        con.execute(
            "CREATE OR REPLACE TEMP VIEW missing_blobs AS SELECT frame_sha256 FROM "
            f"read_parquet({sql_string(results.blobs)}) WHERE reason = 'missing'"
        )
        self._copy(audit_sql.REFERENCING_KEYS, results.referencing)
        for name, path in (("record", results.records), ("blob", results.blobs)):
            for reason, count in con.execute(
                f"SELECT reason, count(*) FROM read_parquet({sql_string(path)}) GROUP BY reason"
            ).fetchall():
                results.reasons[f"{name} {reason}"] = int(count)
        return results

    def _copy(self, query: str, path: str) -> None:
        self._con.execute(
            f"COPY ({query}) TO {sql_string(path)} (FORMAT parquet, COMPRESSION zstd)"
        )

    def references(self, sha: str) -> bool:
        """Whether a live catalog row references the blob ``sha`` (for blob verification's
        message: a query over the catalog copies, rare)."""
        row = self._con.execute(audit_sql.IS_REFERENCED, [sha, sha]).fetchone()
        return bool(row and row[0])
