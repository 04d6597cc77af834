"""The audit joins' result files (PROTOCOL §3.9), whichever engine wrote them
(`reconciler.audit.engines.duckdb_joins.AuditJoins`, `spark_joins.SparkAuditJoins`): their
names (`JoinResults`), reading them in bounded batches (`iter_batches`), and the queries
over them both engines share (`ResultFiles`: the pending counts, the orphan file, the
bundles' totals), in a local DuckDB connection."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from index.catalog_local import sql_string
from protocol import keys

BATCH_ROWS = 4096
"""Rows per batch when results are read back (`iter_batches`)."""


@dataclass
class JoinResults:
    records: str
    blobs: str
    referencing: str
    bad_ranges: str
    bundles: str
    listed_old: dict[str, int] = field(default_factory=dict)
    listed_young: dict[str, int] = field(default_factory=dict)
    blobs_listed: int = 0
    """Listed keys that name a raw object, a frame blob or a bundle (other keys under
    ``raw-blobs/v1/`` and ``raw-bundles/v1/`` are skipped)."""
    reasons: dict[str, int] = field(default_factory=dict)

    @classmethod
    def in_dir(cls, directory: str) -> JoinResults:
        """The result files of either engine, named in ``directory``."""
        return cls(
            records=os.path.join(directory, "records.parquet"),
            blobs=os.path.join(directory, "blobs.parquet"),
            referencing=os.path.join(directory, "referencing.parquet"),
            bad_ranges=os.path.join(directory, "bad_ranges.parquet"),
            bundles=os.path.join(directory, "bundles.parquet"),
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
        hash) at ``path`` from ``blobs.parquet``: its orphans but those of ``keep`` (raw
        keys rows written since reference, few); returns how many. A bundle's row names
        its key in ``raw_blob_key`` (null for a frame blob: the one of its hash)."""
        kept = sorted(set(keep))
        unless = f" AND raw_key NOT IN ({', '.join(sql_string(k) for k in kept)})" if kept else ""
        query = (
            "SELECT frame_sha256, size::BIGINT AS size, last_modified_ns::BIGINT AS "
            "last_modified_ns, raw_retention, CASE WHEN raw_key LIKE "
            f"{sql_string(keys.RAW_BUNDLES_PREFIX + '%')} THEN raw_key END AS raw_blob_key "
            f"FROM read_parquet({sql_string(results.blobs)}) WHERE reason = 'orphan'{unless} "
            "ORDER BY frame_sha256"
        )
        copy_to_parquet(self._results_con, query, path)
        rows: int = pq.read_metadata(path).num_rows
        return rows

    def bundle_totals(self, results: JoinResults) -> dict[str, int]:
        """From ``bundles.parquet``: `protocol.records.AuditRecord`'s ``bundles_listed``,
        ``bundle_bytes``, ``bundle_dead_bytes`` and ``bundle_pinned_bytes``."""
        [(count, size, dead, pinned)] = self._results_con.execute(
            "SELECT count(*), coalesce(sum(size), 0), coalesce(sum(dead_bytes), 0), "
            "coalesce(sum(CASE WHEN pinned THEN size ELSE 0 END), 0) "
            f"FROM read_parquet({sql_string(results.bundles)})"
        ).fetchall()
        return {
            "bundles_listed": int(count),
            "bundle_bytes": int(size),
            "bundle_dead_bytes": int(dead),
            "bundle_pinned_bytes": int(pinned),
        }
