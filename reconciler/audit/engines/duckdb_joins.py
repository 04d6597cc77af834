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
candidates, `reconciler.audit.engines.sql.BLOB_JOIN`), ``referencing.parquet`` (a record that
references each missing-blob candidate), and the counts of what was listed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from index.catalog_local import sql_list, sql_string
from index.catalog_rank import RANK_COLUMNS, duckdb_write_rank
from reconciler.audit.audit_inputs import CatalogCopy as CatalogCopy
from reconciler.audit.audit_inputs import PinnedFileMissing as PinnedFileMissing
from reconciler.audit.audit_inputs import fetch_catalog as fetch_catalog
from reconciler.audit.engines import sql as audit_sql
from reconciler.audit.engines.duckdb_queries import CatalogQueries

ListingKind = Literal["accepted", "quarantine", "raw-blobs"]
LISTING_KINDS: tuple[ListingKind, ...] = ("accepted", "quarantine", "raw-blobs")
_ROW_COLUMNS = ["key", "kind", "etag", "frame_sha256", "accepted_frame_sha256", "time_unix_ns"]
CATALOG_COLUMNS = [*_ROW_COLUMNS, *RANK_COLUMNS]
ROWS_PER_FILE_RANK = 1 << 32
"""``row_rank`` = file rank x this + the row's position in its file (files hold far fewer)."""
BATCH_ROWS = 4096
"""Rows per batch when results are read back (`iter_batches`)."""


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

    @classmethod
    def in_dir(cls, directory: str) -> JoinResults:
        """The result files of either engine, named in ``directory``."""
        return cls(
            records=os.path.join(directory, "records.parquet"),
            blobs=os.path.join(directory, "blobs.parquet"),
            referencing=os.path.join(directory, "referencing.parquet"),
        )


def iter_batches(path: str, *, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """A result file in batches of `BATCH_ROWS` rows."""
    parquet = pq.ParquetFile(path)
    try:
        yield from parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns)
    finally:
        parquet.close()


def copy_to_parquet(con: duckdb.DuckDBPyConnection, query: str, path: str) -> None:
    con.execute(f"COPY ({query}) TO {sql_string(path)} (FORMAT parquet, COMPRESSION zstd)")


class ResultFiles:
    """Queries over the result files (`JoinResults`) in a local DuckDB connection
    (``_results_con``): both engines' (`AuditJoins`, `SparkAuditJoins`)."""

    _results_con: duckdb.DuckDBPyConnection

    def _count_reasons(self, results: JoinResults, name: str, path: str) -> None:
        found = self._results_con.execute(
            f"SELECT reason, count(*) FROM read_parquet({sql_string(path)}) GROUP BY reason"
        ).fetchall()
        for reason, count in found:
            results.reasons[f"{name} {reason}"] = int(count)

    def pending(self, results: JoinResults) -> dict[str, int]:
        """Listed records the record join found to act on, per kind (``accepted``,
        ``quarantine``; phantom candidates are not listed)."""
        rows = self._results_con.execute(
            f"SELECT kind, count(*) FROM read_parquet({sql_string(results.records)}) "
            "WHERE reason <> 'phantom' GROUP BY kind"
        ).fetchall()
        return {str(kind): int(count) for kind, count in rows}

    def write_orphans(self, results: JoinResults, path: str, *, keep: Iterable[str] = ()) -> int:
        """The orphan file's Parquet (`reconciler.audit.orphans.ORPHAN_SCHEMA`, zstd, by
        hash) at ``path`` from ``blobs.parquet``: its orphans but those of ``keep`` (hashes
        rows written since reference, few); returns how many."""
        kept = sorted(set(keep))
        unless = (
            f" AND frame_sha256 NOT IN ({', '.join(sql_string(k) for k in kept)})" if kept else ""
        )
        query = (
            "SELECT frame_sha256, size::BIGINT AS size, last_modified_ns::BIGINT AS "
            "last_modified_ns, raw_retention FROM "
            f"read_parquet({sql_string(results.blobs)}) WHERE reason = 'orphan'{unless} "
            "ORDER BY frame_sha256"
        )
        copy_to_parquet(self._results_con, query, path)
        rows: int = pq.read_metadata(path).num_rows
        return rows


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
                blob_sha = f"substr(key, {len('raw-blobs/v1/sha256/hh/hh/') + 1}, 64)"
                if kind == "raw-blobs":  # each kind's ids only: the rest stay null
                    ids = ("NULL::UHUGEINT", "NULL::UBIGINT", f"md5_number({blob_sha})")
                else:
                    ids = ("md5_number(key)", _etag_id("etag"), "NULL::UHUGEINT")
                parts.append(
                    f"SELECT {sql_string(kind)} AS kind, key, etag, size, "
                    f"{modified} AS last_modified_ns, {ids[0]} AS key_id, {ids[1]} AS etag_id, "
                    f"{ids[2]} AS sha_id FROM read_parquet({sql_list(paths)})"
                )
        if not parts:
            parts.append(
                "SELECT NULL::VARCHAR AS kind, NULL::VARCHAR AS key, NULL::VARCHAR AS etag, "
                "NULL::BIGINT AS size, NULL::BIGINT AS last_modified_ns, "
                "NULL::UHUGEINT AS key_id, NULL::UBIGINT AS etag_id, NULL::UHUGEINT AS sha_id "
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
            source = (
                f"SELECT {columns}, filename, file_row_number FROM read_parquet("
                f"{sql_list([c.path for c in self._catalog])}, filename = true, "
                "file_row_number = true)"
            )
        else:
            source = (
                "SELECT NULL::VARCHAR AS key, NULL::VARCHAR AS kind, NULL::VARCHAR AS etag, "
                "NULL::VARCHAR AS frame_sha256, NULL::VARCHAR AS accepted_frame_sha256, "
                "NULL::BIGINT AS time_unix_ns, NULL::BIGINT AS first_epoch, "
                "NULL::BIGINT AS first_sequence, NULL::BIGINT AS first_position, "
                "NULL::VARCHAR AS filename, NULL::BIGINT AS file_row_number WHERE false"
            )
        con.execute(
            "CREATE OR REPLACE VIEW catalog_rows AS SELECT r.key, r.kind, r.etag, r.frame_sha256, "
            "r.accepted_frame_sha256, r.time_unix_ns, "
            "('0x' || substr(r.frame_sha256, 1, 15))::BIGINT AS sha_prefix, "
            "md5_number(r.key) AS key_id, "
            f"{_etag_id('r.etag')} AS etag_id, md5_number(r.frame_sha256) AS sha_id, "
            "md5_number(r.accepted_frame_sha256) AS accepted_sha_id, "
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
        ``accepted_frame_sha256``: `ADDED_SCHEMA`): they reference blobs as catalog rows do."""
        con = self._con
        if added:
            source = f"SELECT key, frame_sha256, accepted_frame_sha256 FROM read_parquet({sql_list(list(added))})"
        else:
            source = (
                "SELECT NULL::VARCHAR AS key, NULL::VARCHAR AS frame_sha256, "
                "NULL::VARCHAR AS accepted_frame_sha256 WHERE false"
            )
        con.execute(
            "CREATE OR REPLACE TEMP VIEW added_rows AS SELECT *, md5_number(frame_sha256) AS "
            f"sha_id, md5_number(accepted_frame_sha256) AS accepted_sha_id FROM ({source})"
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
        self._copy("SELECT frame_sha256, record_key FROM referencing", results.referencing)
        for table in ("blob_results", "orphan_hashes", "referencing"):
            con.execute(f"DROP TABLE {table}")
        self._count_reasons(results, "blob", results.blobs)

    def _copy(self, query: str, path: str) -> None:
        copy_to_parquet(self._con, query, path)


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
    ]
)
"""Rows the audit wrote itself, as `AuditJoins.run_blobs` reads them."""
