"""What the audit's act phase (`reconciler.audit.run.AuditRun`) needs of an engine's joins:
`AuditJoins` (DuckDB, ``audit_engine = "local"``) and `SparkAuditJoins` (``"spark"``)
both provide it, and both write their results as the same local files (`JoinResults`), so
the acts, the orphan file and the problems are one code path whatever engine joined.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from reconciler.audit.engines.duckdb_joins import JoinLimits, JoinResults
from reconciler.audit.engines.duckdb_queries import NewestRow
from reconciler.audit.retired import RetiredJoins


class EngineJoins(RetiredJoins, Protocol):
    def run_records(self, limits: JoinLimits) -> JoinResults:
        """The listed counts and the record join (``records.parquet``)."""
        ...

    def run_blobs(self, limits: JoinLimits, results: JoinResults, added: Sequence[str]) -> None:
        """The blob join (``blobs.parquet``, ``referencing.parquet``); ``added``: local
        Parquet files of the rows the audit wrote after `run_records` (`ADDED_SCHEMA`)."""
        ...

    def pending(self, results: JoinResults) -> dict[str, int]:
        """Listed records the record join found to act on, per kind."""
        ...

    def write_orphans(self, results: JoinResults, path: str, *, keep: Iterable[str] = ()) -> int:
        """The orphan file's Parquet at ``path`` but the raw keys of ``keep``; how many."""
        ...

    def bundle_totals(self, results: JoinResults) -> dict[str, int]:
        """The audit record's bundle figures from ``bundles.parquet``."""
        ...

    def newest_rows(self, record_keys: Sequence[str]) -> dict[str, NewestRow]:
        """Per key of ``record_keys`` (few): its newest catalog row's ``etag``,
        ``frame_sha256``, ``accepted_frame_sha256``, ``time_unix_ns``, raw key and range
        (`reconciler.audit.engines.duckdb_queries.NEWEST_COLUMNS`)."""
        ...

    def key_hours(self, record_keys: Sequence[str]) -> dict[str, list[int]]:
        """Per key of ``record_keys`` (few): the hours (start, ns) whose catalog holds a
        row of it, ascending."""
        ...

    def references(self, raw_key: str) -> bool:
        """Whether a live catalog row references the raw object ``raw_key`` (rare)."""
        ...

    def interrupt(self) -> None:
        """Stop the join running in another thread (it raises there)."""
        ...
