"""The full audit's joins out of core, in DuckDB (`reconciler.audit.engines.sql` holds the SQL).

Inputs are local files: the audit's listing parts (`reconciler.audit.listing`'s schema:
``key``, ``etag``, ``size``, ``last_modified``) and copies of the catalog files the audit
pinned (`reconciler.audit.audit_inputs.fetch_catalog`). Only the columns the joins need
are read.

`AuditJoins` opens an in-memory DuckDB with ``memory_limit`` (the audit passes half of
``reconciler.audit_memory_limit_mb``), ``temp_directory`` in the spill directory (tables
and operators spill there beyond the limit), ``preserve_insertion_order = false`` and
bounded threads, and writes each result as a Parquet file in the spill directory, which
callers read in bounded batches (`iter_batches`): nothing is returned as one Python
object per row. The record join (`run_records`) and the blob join (`run_blobs`) run
apart, so the blob join counts the rows the audit wrote meanwhile as references.

Results (`JoinResults`): ``records.parquet`` (records to read, and phantom candidates:
see `reconciler.audit.engines.sql.RECORD_JOIN`), ``blobs.parquet`` (orphans and missing-blob
candidates by raw object key, frame blobs and bundles, `reconciler.audit.engines.sql.BLOB_JOIN`),
``referencing.parquet`` (a record that references each missing-blob candidate),
``bad_ranges.parquet`` (ranges past their bundle's listed size, `sql.BAD_RANGES`),
``bundles.parquet`` (each listed bundle's size, live and dead bytes, `sql.BUNDLE_BYTES`),
and the counts of what was listed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from index.catalog_local import sql_list, sql_string
from index.catalog_rank import RANK_COLUMNS, duckdb_write_rank
from index.rows import FILE_SCHEMA
from reconciler.audit.audit_inputs import CatalogCopy as CatalogCopy
from reconciler.audit.audit_inputs import PinnedFileMissing as PinnedFileMissing
from reconciler.audit.audit_inputs import fetch_catalog as fetch_catalog
from reconciler.audit.engines import sql as audit_sql
from reconciler.audit.engines import sql_bundles as bundle_sql
from reconciler.audit.engines.duckdb_queries import CatalogQueries
from reconciler.audit.engines.result_files import BATCH_ROWS as BATCH_ROWS
from reconciler.audit.engines.result_files import JoinResults as JoinResults
from reconciler.audit.engines.result_files import ResultFiles as ResultFiles
from reconciler.audit.engines.result_files import copy_to_parquet
from reconciler.audit.engines.result_files import iter_batches as iter_batches
from reconciler.audit.ranges import KINDS as LISTING_KINDS
from reconciler.audit.ranges import RAW_KINDS
from reconciler.audit.ranges import ListingKind as ListingKind

STRING_COLUMNS = ["key", "kind", "etag", "frame_sha256", "accepted_frame_sha256", "raw_blob_key"]
INTEGER_COLUMNS = ["time_unix_ns", "raw_offset", "raw_length"]
CATALOG_COLUMNS = [*STRING_COLUMNS, *INTEGER_COLUMNS, *RANK_COLUMNS]
"""The catalog columns the joins read (strings first, then integers: Spark's tasks cast
them so)."""
ROWS_PER_FILE_RANK = 1 << 32
"""``row_rank`` = file rank x this + the row's position in its file (files hold far fewer)."""


@dataclass(frozen=True, slots=True)
class JoinLimits:
    born_before_ns: int
    """The audit's start plus the settle margin: later records are the steady pass's."""
    phantom_before_ns: int
    """The audit's start minus the settle margin: a phantom's newest hour ended before."""
    orphan_before_ns: int
    """Store time minus the retry horizon: an orphan was last modified before."""
    reread_repeated: bool = False
    """Read back every listed key with rows of more than one rank (the first audit after
    the rank columns came, PROTOCOL §3.7: `reconciler.audit.engines.sql.PER_KEY`)."""


class AuditJoins(ResultFiles, CatalogQueries):
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
        # An in-memory database: the stages' tables are evicted to the spill directory
        # beyond the limit, and nothing is checkpointed at close (a file database cost
        # ~0.1 s an audit even for a small store).
        self._con = duckdb.connect(
            ":memory:",
            config={
                "memory_limit": f"{memory_limit_mb}MB",
                "temp_directory": os.path.join(spill_dir, "duckdb-spill"),
                "threads": max(1, threads),
                "preserve_insertion_order": False,
            },
        )
        self._results_con = self._con
        self._catalog = list(catalog)
        self._create_views(listing)

    def close(self) -> None:
        self._con.close()

    def interrupt(self) -> None:
        """Stop the query running in another thread (it raises there)."""
        self._con.interrupt()

    def __enter__(self) -> AuditJoins:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _create_views(self, listing: Mapping[ListingKind, Sequence[str]]) -> None:
        self.set_listing(listing)
        self._create_catalog_views()

    def set_listing(self, listing: Mapping[ListingKind, Sequence[str]]) -> None:
        """The listing parts (local Parquet files) the joins read, per kind."""
        con = self._con
        parts = []
        for kind in LISTING_KINDS:
            paths = list(listing.get(kind, ()))
            if paths:
                # A record without a LastModified counts as old (as on Spark).
                modified = audit_sql.listed_modified_ns(
                    sql_string(kind), "epoch_us(last_modified) * 1000"
                )
                if kind in RAW_KINDS:  # each kind's ids only: the rest stay null
                    ids = ("NULL::UHUGEINT", "NULL::UBIGINT", "md5_number(key)")
                else:
                    ids = ("md5_number(key)", _etag_id("etag"), "NULL::UHUGEINT")
                parts.append(
                    f"SELECT {sql_string(kind)} AS kind, key, etag, size, "
                    f"{modified} AS last_modified_ns, {ids[0]} AS key_id, {ids[1]} AS etag_id, "
                    f"{ids[2]} AS raw_id FROM read_parquet({sql_list(paths)})"
                )
        if not parts:
            parts.append(
                "SELECT NULL::VARCHAR AS kind, NULL::VARCHAR AS key, NULL::VARCHAR AS etag, "
                "NULL::BIGINT AS size, NULL::BIGINT AS last_modified_ns, "
                "NULL::UHUGEINT AS key_id, NULL::UBIGINT AS etag_id, NULL::UHUGEINT AS raw_id "
                "WHERE false"
            )
        con.execute("CREATE OR REPLACE VIEW listing AS " + " UNION ALL ".join(parts))

    def _create_catalog_views(self) -> None:
        con = self._con
        con.execute(
            "CREATE OR REPLACE TABLE catalog_files (path VARCHAR, file_rank INTEGER, "
            "hour_start_ns BIGINT, retired BOOLEAN)"
        )
        self.set_retired(frozenset())
        columns = ", ".join(CATALOG_COLUMNS)
        if self._catalog:
            # Copies of files written before the range columns lack them (`fetch_catalog`
            # keeps them as they are): read by name, the columns null there; an empty file
            # of the whole schema first, so they exist even when no copy has them.
            schema_file = os.path.join(self._dir, "catalog-schema.parquet")
            pq.write_table(FILE_SCHEMA.empty_table(), schema_file)
            paths = [schema_file, *(c.path for c in self._catalog)]
            source = (
                f"SELECT {columns}, filename, file_row_number FROM read_parquet("
                f"{sql_list(paths)}, filename = true, file_row_number = true, "
                "union_by_name = true)"
            )
        else:
            source = (
                "SELECT NULL::VARCHAR AS key, NULL::VARCHAR AS kind, NULL::VARCHAR AS etag, "
                "NULL::VARCHAR AS frame_sha256, NULL::VARCHAR AS accepted_frame_sha256, "
                "NULL::VARCHAR AS raw_blob_key, NULL::BIGINT AS time_unix_ns, "
                "NULL::BIGINT AS raw_offset, NULL::BIGINT AS raw_length, NULL::BIGINT AS first_epoch, "
                "NULL::BIGINT AS first_sequence, NULL::BIGINT AS first_position, "
                "NULL::VARCHAR AS filename, NULL::BIGINT AS file_row_number WHERE false"
            )
        con.execute(
            "CREATE OR REPLACE VIEW catalog_rows AS SELECT r.key, r.kind, r.etag, r.frame_sha256, "
            "r.accepted_frame_sha256, r.raw_blob_key, r.raw_offset, r.raw_length, r.time_unix_ns, "
            "('0x' || substr(r.frame_sha256, 1, 15))::BIGINT AS sha_prefix, "
            "md5_number(r.key) AS key_id, "
            f"{_etag_id('r.etag')} AS etag_id, {_raw_ids('r.')}, "
            f"f.file_rank::BIGINT * {ROWS_PER_FILE_RANK} + r.file_row_number AS row_rank, "
            f"{duckdb_write_rank('r.')} AS write_rank, "
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

    def run(self, limits: JoinLimits, added: Sequence[str] = ()) -> JoinResults:
        """Both joins (`run_records`, then `run_blobs`); results land in the spill directory."""
        results = self.run_records(limits)
        self.run_blobs(limits, results, added)
        return results

    def run_records(self, limits: JoinLimits) -> JoinResults:
        """The listed counts and the record join (``records.parquet``); the blob join's
        fields of the result are filled by `run_blobs`."""
        con = self._con
        params = limit_params(limits)
        results = JoinResults.in_dir(self._dir)
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
        self._count_reasons(results, "record", results.records)
        return results

    def run_blobs(self, limits: JoinLimits, results: JoinResults, added: Sequence[str]) -> None:
        """The blob join (``blobs.parquet``, ``referencing.parquet``). ``added``: Parquet
        files of rows the audit wrote after `run_records` (``key``, ``frame_sha256``,
        ``accepted_frame_sha256`` and the raw key and range: `ADDED_SCHEMA`): they
        reference raw objects as catalog rows do."""
        con = self._con
        columns = ", ".join(ADDED_SCHEMA.names)
        if added:
            source = f"SELECT {columns} FROM read_parquet({sql_list(list(added))})"
        else:
            source = (
                "SELECT NULL::VARCHAR AS key, NULL::VARCHAR AS frame_sha256, "
                "NULL::VARCHAR AS accepted_frame_sha256, NULL::VARCHAR AS raw_blob_key, "
                "NULL::BIGINT AS raw_offset, NULL::BIGINT AS raw_length WHERE false"
            )
        con.execute(
            f"CREATE OR REPLACE TEMP VIEW added_rows AS SELECT *, {_raw_ids('')} FROM ({source})"
        )
        # Each stage its own table, so each has the whole memory limit; only fixed-size
        # columns go through the join, the few hashes found are fetched after.
        blob_join = audit_sql.bind(audit_sql.BLOB_JOIN, **limit_params(limits))
        for table, query in (
            ("referenced", audit_sql.REFERENCED),
            ("listed_blobs", audit_sql.LISTED_BLOBS),
            ("blob_results", blob_join),
            ("orphan_hashes", audit_sql.ORPHAN_HASHES),
            ("referencing", audit_sql.REFERENCING_KEYS),
        ):
            con.execute(f"CREATE OR REPLACE TABLE {table} AS {query}")
            if table == "blob_results":
                con.execute("DROP TABLE referenced")
                con.execute("DROP TABLE listed_blobs")
        self._copy(audit_sql.BLOB_RESULTS, results.blobs)
        self._copy("SELECT raw_key, record_key FROM referencing", results.referencing)
        for table in ("blob_results", "orphan_hashes", "referencing"):
            con.execute(f"DROP TABLE {table}")
        self._count_reasons(results, "blob", results.blobs)
        con.execute(f"CREATE OR REPLACE TABLE bad_range_ids AS {bundle_sql.BAD_RANGE_IDS}")
        self._copy(bundle_sql.BAD_RANGES + " ORDER BY raw_key, raw_offset", results.bad_ranges)
        con.execute("DROP TABLE bad_range_ids")
        self._copy(bundle_sql.BUNDLE_BYTES, results.bundles)

    def _copy(self, query: str, path: str) -> None:
        copy_to_parquet(self._con, query, path)


def _raw_ids(alias: str) -> str:
    """A row's ``raw_id`` and ``accepted_raw_id`` (`reconciler.audit.engines.sql`): 128-bit
    digests of the raw keys it names (a quarantine's accepted side: the frame blob of
    ``accepted_frame_sha256``, null without one)."""
    own = audit_sql.row_raw_key(f"{alias}raw_blob_key", f"{alias}frame_sha256")
    accepted = audit_sql.frame_blob_key(f"{alias}accepted_frame_sha256")
    return f"md5_number({own}) AS raw_id, md5_number({accepted}) AS accepted_raw_id"


def _etag_id(column: str) -> str:
    """DuckDB's 64-bit ``hash`` of the normalized ETag, null for none (`reconciler.audit.engines.sql`)."""
    return (
        f"CASE WHEN {column} IS NULL THEN NULL ELSE hash({audit_sql.normalized_etag(column)}) END"
    )


def limit_params(limits: JoinLimits) -> dict[str, int]:
    return {
        "born_before_ns": int(limits.born_before_ns),
        "phantom_before_ns": int(limits.phantom_before_ns),
        "orphan_before_ns": int(limits.orphan_before_ns),
        "reread_repeated": int(limits.reread_repeated),
    }


ADDED_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("frame_sha256", pa.string()),
        ("accepted_frame_sha256", pa.string()),
        ("raw_blob_key", pa.string()),
        ("raw_offset", pa.int64()),
        ("raw_length", pa.int64()),
    ]
)
"""Rows the audit wrote itself, as `AuditJoins.run_blobs` reads them."""
