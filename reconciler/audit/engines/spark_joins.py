"""The full audit's joins on Spark (``reconciler.audit_engine = "spark"``, PROTOCOL §3.9).

The same statements as the local engine (`reconciler.audit.engines.sql`, run by
`reconciler.audit.engines.duckdb_joins.AuditJoins`) in Spark SQL over temp views of the same names
and columns, producing the same `JoinResults` files (same columns, same rows; records
ordered by key, blobs by hash, referencing keys by hash).

Inputs are objects in the store, read on the executors (each with its own client,
`rollup.table.storage.StoreAccess`: the store is all the executors share with the driver),
so neither the driver nor the executors need a copy of the whole history (the tasks are
`reconciler.audit.engines.spark_tasks`):

- the audit's listing parts (store keys, `reconciler.audit.listing`'s schema), read by
  ``mapInArrow`` tasks into the ``listing`` view (``last_modified`` as nanoseconds, a
  record without one old: `reconciler.audit.engines.sql.listed_modified_ns`, as in DuckDB);
- the catalog files the audit pinned (store keys), read whole per task (every column of
  `index.rows.FILE_SCHEMA`, as `fetch_catalog`'s copies; only `CATALOG_COLUMNS` are kept)
  into the ``catalog_rows`` view. ``row_rank`` (a unique row id) is computed where the
  file is read: its rank (epoch, then sequence, as `fetch_catalog` ranks them) x
  `ROWS_PER_FILE_RANK` + the row's place in the file; so are the rows' ranks
  (`index.catalog_rank.with_rank`), packed in the view as ``write_rank``
  (`index.catalog_rank.spark_write_rank`, the value DuckDB's ``HUGEINT`` holds). ``sha_prefix`` is ``conv(substr(frame_sha256, 1, 15), 16, 10)``
  and ``key_id`` is the key itself, ``raw_id`` the raw key, ``etag_id`` the normalized ETag
  (Spark's aggregates spill string keys; no digest, so no
  collision to reason about).

A pinned file that is gone fails the task, and the constructor raises `PinnedFileMissing`
(never "no rows"; ``spark.sql.files.ignoreMissingFiles`` is not involved, as no Spark file
source is used, and the constructor refuses a session that sets it). A file that is not an
index file is listed in `SparkAuditJoins.unreadable`, as `fetch_catalog` returns it (a file
whose pages are corrupt counts as unreadable here; in DuckDB the joins fail on it).

Results: each is written by the executors as Parquet parts under ``results_prefix`` in the
store (one a partition of the sorted result), then concatenated in partition order by the
driver into one local file in ``out_dir`` (one part in memory at a time;
`reconciler.audit.engines.spark_results`). As the local engine, the record join (`run_records`)
and the blob join (`run_blobs`) run apart: the rows the audit wrote in between (local files
on the driver) go to the store as parts under ``results_prefix`` ``added/`` and are read by
the executors as references. The driver's queries over the result files (`pending`,
`write_orphans`: `ResultFiles`) run in a small local DuckDB, as the local engine's do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from index.catalog_rank import spark_write_rank
from protocol import keys
from reconciler.audit.engines import sql as audit_sql
from reconciler.audit.engines import sql_bundles as bundle_sql
from reconciler.audit.engines.duckdb_joins import (
    ADDED_SCHEMA,
    CatalogCopy,
    JoinLimits,
    JoinResults,
    ListingKind,
    PinnedFileMissing,
    ResultFiles,
    limit_params,
)
from reconciler.audit.engines.duckdb_queries import NEWEST_COLUMNS, NewestRow, newest_row
from reconciler.audit.engines.spark_results import (
    BAD_RANGES_SCHEMA,
    BLOBS_SCHEMA,
    BUNDLES_SCHEMA,
    RECORDS_SCHEMA,
    REFERENCING_SCHEMA,
    download_parts,
    upload_parts,
)
from reconciler.audit.engines.spark_tasks import (
    ADDED_DDL,
    CATALOG_DDL,
    LISTING_DDL,
    MISSING,
    PART_DDL,
    ReadCatalog,
    ReadListing,
    ReadParts,
    WriteResult,
)
from reconciler.audit.ranges import KINDS as LISTING_KINDS
from rollup.table.storage import StoreAccess

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


RAW_IDS = (
    f"{audit_sql.row_raw_key('raw_blob_key', 'frame_sha256')} AS raw_id, "
    f"{audit_sql.frame_blob_key('accepted_frame_sha256')} AS accepted_raw_id"
)
"""A row's ``raw_id`` and ``accepted_raw_id`` (`reconciler.audit.engines.sql`): the raw
keys themselves (a quarantine's accepted side: the frame blob of its hash, null without
one, as ``||`` with a null is null)."""


def rank_catalog(names: Sequence[str]) -> list[tuple[int, keys.UtcHour, str]]:
    """``(rank, hour, name)`` in write order: by epoch, then sequence (as `fetch_catalog`)."""
    parsed = sorted(
        ((keys.parse_index_catalog_key(name), name) for name in names),
        key=lambda item: (item[0][1], item[0][2]),
    )
    return [(rank, hour, name) for rank, ((hour, _e, _s), name) in enumerate(parsed)]


class SparkAuditJoins(ResultFiles):
    """One Spark session's views over the listing parts and pinned catalog files (see
    module); the methods of `AuditJoins` that the audit uses, with the same results."""

    def __init__(
        self,
        spark: SparkSession,
        access: StoreAccess,
        listing: Mapping[ListingKind, Sequence[str]],
        catalog: Sequence[str],
        *,
        results_prefix: str,
        out_dir: str,
        memory_limit_mb: int = 256,
    ) -> None:
        conf = spark.conf.get("spark.sql.files.ignoreMissingFiles", "false")
        if str(conf).lower() != "false":
            raise ValueError("spark.sql.files.ignoreMissingFiles must stay false for the audit")
        self._spark = spark
        self._access = access
        self._prefix = results_prefix
        self._dir = out_dir
        os.makedirs(os.path.join(out_dir, "duckdb-spill"), exist_ok=True)
        # The driver's own queries over the result files (`pending`, `write_orphans`).
        self._results_con = duckdb.connect(
            ":memory:",
            config={
                "memory_limit": f"{memory_limit_mb}MB",
                "temp_directory": os.path.join(out_dir, "duckdb-spill"),
                "threads": 2,
            },
        )
        self._persisted: list[DataFrame] = []
        ranked = rank_catalog(catalog)
        listing_files = [(kind, key) for kind in LISTING_KINDS for key in listing.get(kind, ())]
        self._listing = self._keep(
            self._files(listing_files, "kind string, key string").mapInArrow(
                ReadListing(access), LISTING_DDL
            )
        )
        self._listing.createOrReplaceTempView("listing_base")
        # The ids of `reconciler.audit.engines.sql` are the strings themselves here.
        modified = audit_sql.listed_modified_ns("kind", "last_modified_ns")
        raw = "kind IN ('raw-blobs', 'raw-bundles')"
        self._sql(
            f"SELECT kind, key, etag, size, {modified} AS last_modified_ns, "
            f"CASE WHEN NOT {raw} THEN key END AS key_id, "
            f"CASE WHEN NOT {raw} THEN {audit_sql.normalized_etag('etag')} END "
            f"AS etag_id, CASE WHEN {raw} THEN key END AS raw_id "
            "FROM listing_base"
        ).createOrReplaceTempView("listing")
        rows = [(name, rank, hour.start_ns) for rank, hour, name in ranked]
        self._catalog_base = self._keep(
            self._files(rows, "name string, rank long, hour_start_ns long").mapInArrow(
                ReadCatalog(access), CATALOG_DDL
            )
        )
        try:
            errors = {
                int(r["file_rank"]): str(r["error"])
                for r in self._catalog_base.where("error IS NOT NULL")
                .select("file_rank", "error")
                .distinct()
                .collect()
            }
        except Exception as exc:  # Spark wraps the task's error: find ours in its text
            text = str(exc)
            if MISSING in text:
                name = text.split(MISSING, 1)[1].strip().split("'")[1]
                raise PinnedFileMissing(f"pinned catalog file {name!r} is gone") from None
            raise
        self.unreadable = [(name, errors[rank]) for rank, _h, name in ranked if rank in errors]
        """Pinned files that are not index files, each with why (as `fetch_catalog`)."""
        self.readable = [
            CatalogCopy(name, name, hour, rank) for rank, hour, name in ranked if rank not in errors
        ]
        """The readable pinned files (``path`` is the store key), for `settle_retired`."""
        self.set_retired(frozenset())

    def _files(self, rows: list[tuple[Any, ...]], ddl: str) -> DataFrame:
        """One row a file, spread over the cluster's task slots (a few files a task)."""
        frame = self._spark.createDataFrame(rows, ddl)
        slots = max(1, min(len(rows), 4 * self._spark.sparkContext.defaultParallelism))
        return frame.repartition(slots)

    def _keep(self, frame: DataFrame) -> DataFrame:
        """``frame`` computed once (the inputs are read from the store once) and kept on
        the executors' local disks, not in their heap: with ``MEMORY_AND_DISK`` a local[2]
        session ran out of a 4 GiB heap at 10M manifests (8 GiB worked); with ``DISK_ONLY``
        4 GiB completed the same run, faster (1 GiB still ran out, in the record join:
        `bench.join_spark`, bench/RESULTS.md)."""
        from pyspark import StorageLevel

        kept = frame.persist(StorageLevel.DISK_ONLY)
        self._persisted.append(kept)
        return kept

    def close(self) -> None:
        for frame in self._persisted:
            frame.unpersist()
        self._persisted.clear()
        self._results_con.close()

    def __enter__(self) -> SparkAuditJoins:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _sql(self, text: str) -> DataFrame:
        return self._spark.sql(audit_sql.for_spark(text))

    def set_retired(self, hours: frozenset[int]) -> None:
        """As `AuditJoins.set_retired`."""
        retired = (
            f"(kind = 'accepted' AND hour_start_ns IN ({', '.join(str(int(h)) for h in sorted(hours))}))"
            if hours
            else "false"
        )
        self._catalog_base.createOrReplaceTempView("catalog_base")
        self._sql(
            "SELECT key, kind, etag, frame_sha256, accepted_frame_sha256, raw_blob_key, "
            "raw_offset, raw_length, time_unix_ns, "
            "CAST(conv(substr(frame_sha256, 1, 15), 16, 10) AS BIGINT) AS sha_prefix, "
            f"key AS key_id, {audit_sql.normalized_etag('etag')} AS etag_id, {RAW_IDS}, "
            f"row_rank, {spark_write_rank()} AS write_rank, {retired} AS retired, hour_start_ns "
            "FROM catalog_base WHERE error IS NULL"
        ).createOrReplaceTempView("catalog_rows")

    def accepted_batches(self, hours: Sequence[int]) -> dict[int, int]:
        """As `AuditJoins.accepted_batches`."""
        if not hours:
            return {}
        self._sql(
            "SELECT * FROM catalog_rows WHERE hour_start_ns IN ("
            + ", ".join(str(int(h)) for h in hours)
            + ")"
        ).createOrReplaceTempView("catalog_rows_of_covered_hours")
        found = {int(r[0]): int(r[1]) for r in self._sql(audit_sql.RETIRED_HOUR_BATCHES).collect()}
        return {int(h): found.get(int(h), 0) for h in hours}

    def run(self, limits: JoinLimits, added: Sequence[str] = ()) -> JoinResults:
        """Both joins (`run_records`, then `run_blobs`); results land in ``out_dir``."""
        results = self.run_records(limits)
        self.run_blobs(limits, results, added)
        return results

    def run_records(self, limits: JoinLimits) -> JoinResults:
        """As `AuditJoins.run_records` (``records.parquet`` in ``out_dir``)."""
        params = limit_params(limits)
        results = JoinResults.in_dir(self._dir)
        for kind, old, young in self._sql(
            audit_sql.bind(audit_sql.LISTED_COUNTS, **params)
        ).collect():
            results.listed_old[str(kind)] = int(old)
            results.listed_young[str(kind)] = int(young)
        results.blobs_listed = int(self._sql(audit_sql.BLOBS_LISTED).collect()[0][0])
        for view, query in (
            ("per_key", audit_sql.PER_KEY),
            ("newest", audit_sql.NEWEST),
            ("record_candidates", audit_sql.bind(audit_sql.RECORD_CANDIDATES, **params)),
        ):
            self._sql(query).createOrReplaceTempView(view)
        self._write(
            self._sql(audit_sql.RECORD_JOIN).orderBy("key"),
            RECORDS_SCHEMA,
            "records",
            results.records,
        )
        self._count_reasons(results, "record", results.records)
        return results

    def run_blobs(self, limits: JoinLimits, results: JoinResults, added: Sequence[str]) -> None:
        """As `AuditJoins.run_blobs`: ``added`` (local files of the rows the audit wrote
        since `run_records`) goes to the store first, as parts the executors read."""
        self._set_added(added)
        self._sql(audit_sql.REFERENCED).createOrReplaceTempView("referenced")
        self._sql(audit_sql.LISTED_BLOBS).createOrReplaceTempView("listed_blobs")
        blob_results = self._keep(
            self._sql(audit_sql.bind(audit_sql.BLOB_JOIN, **limit_params(limits)))
        )
        blob_results.createOrReplaceTempView("blob_results")
        orphan_hashes = self._keep(self._sql(audit_sql.ORPHAN_HASHES))
        orphan_hashes.createOrReplaceTempView("orphan_hashes")
        referencing = self._keep(self._sql(audit_sql.REFERENCING_KEYS))
        referencing.createOrReplaceTempView("referencing")
        blobs = self._sql(audit_sql.BLOB_RESULTS)
        self._write(blobs.orderBy("raw_key"), BLOBS_SCHEMA, "blobs", results.blobs)
        self._write(
            self._sql("SELECT raw_key, record_key FROM referencing").orderBy("raw_key"),
            REFERENCING_SCHEMA,
            "referencing",
            results.referencing,
        )
        self._count_reasons(results, "blob", results.blobs)
        self._keep(self._sql(bundle_sql.BAD_RANGE_IDS)).createOrReplaceTempView("bad_range_ids")
        self._write(
            self._sql(bundle_sql.BAD_RANGES).orderBy("raw_key", "raw_offset"),
            BAD_RANGES_SCHEMA,
            "bad_ranges",
            results.bad_ranges,
        )
        self._write(
            self._sql(bundle_sql.BUNDLE_BYTES).orderBy("raw_key"),
            BUNDLES_SCHEMA,
            "bundles",
            results.bundles,
        )

    def _set_added(self, added: Sequence[str]) -> None:
        """The ``added_rows`` view (`reconciler.audit.engines.sql.REFERENCED`) over ``added``,
        copied to the store (`_upload_added`) for the executors to read."""
        parts = upload_parts(self._access, f"{self._prefix}added/", added, ADDED_SCHEMA)
        if parts:
            frame = self._files([(key,) for key in parts], "key string").mapInArrow(
                ReadParts(self._access, tuple(ADDED_SCHEMA.names)), ADDED_DDL
            )
        else:
            frame = self._spark.createDataFrame([], ADDED_DDL)
        self._keep(frame).createOrReplaceTempView("added_base")
        self._sql(f"SELECT *, {RAW_IDS} FROM added_base").createOrReplaceTempView("added_rows")

    def key_hours(self, record_keys: Sequence[str]) -> dict[str, list[int]]:
        """As `AuditJoins.key_hours` (a Spark query: a few keys)."""
        if not record_keys:
            return {}
        from pyspark.sql import functions as f

        found = (
            self._spark.table("catalog_rows")
            .where(f.col("key").isin(list(record_keys)))
            .select("key", "hour_start_ns")
            .distinct()
            .collect()
        )
        hours: dict[str, list[int]] = {}
        for row in found:
            hours.setdefault(str(row["key"]), []).append(int(row["hour_start_ns"]))
        return {key: sorted(found_hours) for key, found_hours in hours.items()}

    def newest_rows(self, record_keys: Sequence[str]) -> dict[str, NewestRow]:
        """As `AuditJoins.newest_rows` (a Spark query: a few keys)."""
        if not record_keys:
            return {}
        from pyspark.sql import functions as f

        found = (
            self._spark.table("catalog_rows")
            .where(f.col("key").isin(list(record_keys)))
            .groupBy("key")
            .agg(*(f.max_by(column, "write_rank").alias(column) for column in NEWEST_COLUMNS))
            .collect()
        )
        return {str(r["key"]): newest_row([r[c] for c in NEWEST_COLUMNS]) for r in found}

    def interrupt(self) -> None:
        """Cancel the session's running jobs (the call waiting on one raises)."""
        self._spark.sparkContext.cancelAllJobs()

    def _write(self, frame: DataFrame, schema: pa.Schema, name: str, path: str) -> None:
        """``frame`` as one local Parquet file at ``path`` (see module)."""
        prefix = f"{self._prefix}{name}/"
        written = frame.mapInArrow(WriteResult(self._access, prefix, schema), PART_DDL).collect()
        parts = [str(r["key"]) for r in sorted(written, key=lambda r: int(r["part"]))]
        download_parts(self._access, parts, schema, path)

    def references(self, raw_key: str) -> bool:
        """As `AuditJoins.references`."""
        from pyspark.sql import functions as f

        rows = self._spark.table("catalog_rows").where(
            ~f.col("retired")
            & ((f.col("raw_id") == f.lit(raw_key)) | (f.col("accepted_raw_id") == f.lit(raw_key)))
        )
        return bool(rows.limit(1).count())
