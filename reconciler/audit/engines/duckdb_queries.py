"""The few small catalog queries the audit's acts make of the local engine's
``catalog_rows`` view (`reconciler.audit.engines.duckdb_joins.AuditJoins`): a handful of
keys or one hash at a time, never a pass over the catalog per row found."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from index.catalog_local import sql_string
from reconciler.audit.engines import sql as audit_sql

NEWEST_COLUMNS = (
    "etag",
    "frame_sha256",
    "accepted_frame_sha256",
    "time_unix_ns",
    "raw_blob_key",
    "raw_offset",
    "raw_length",
)
NewestRow = tuple[str | None, str, str | None, int, str | None, int | None, int | None]
"""A key's newest catalog row: `NEWEST_COLUMNS`, in order."""


def newest_row(values: Sequence[object]) -> NewestRow:
    """`NewestRow` of one result row of either engine (`NEWEST_COLUMNS`, in order)."""
    etag, sha, accepted, time_ns, raw_key, offset, length = values
    return (
        None if etag is None else str(etag),
        str(sha),
        None if accepted is None else str(accepted),
        int(str(time_ns)),
        None if raw_key is None else str(raw_key),
        None if offset is None else int(str(offset)),
        None if length is None else int(str(length)),
    )


class CatalogQueries:
    _con: duckdb.DuckDBPyConnection

    def newest_rows(self, record_keys: Sequence[str]) -> dict[str, NewestRow]:
        """Per key of ``record_keys`` (few): its newest catalog row's `NEWEST_COLUMNS`."""
        if not record_keys:
            return {}
        found = self._con.execute(
            "SELECT key, "
            + ", ".join(f"arg_max({c}, write_rank)" for c in NEWEST_COLUMNS)
            + f" FROM catalog_rows WHERE key IN ({', '.join(sql_string(k) for k in record_keys)}) "
            "GROUP BY key"
        ).fetchall()
        return {str(k): newest_row(values) for k, *values in found}

    def key_hours(self, record_keys: Sequence[str]) -> dict[str, list[int]]:
        """As `reconciler.audit.engines.engine.EngineJoins.key_hours`."""
        if not record_keys:
            return {}
        found = self._con.execute(
            "SELECT DISTINCT key, hour_start_ns FROM catalog_rows "
            f"WHERE key IN ({', '.join(sql_string(k) for k in record_keys)}) ORDER BY 1, 2"
        ).fetchall()
        hours: dict[str, list[int]] = {}
        for key, hour in found:
            hours.setdefault(str(key), []).append(int(hour))
        return hours

    def references(self, raw_key: str) -> bool:
        """Whether a live catalog row references the raw object ``raw_key`` (for blob
        verification's message: a query over the catalog copies, rare). Its own cursor:
        safe while a join runs in another thread."""
        cursor = self._con.cursor()
        try:
            row = cursor.execute(audit_sql.IS_REFERENCED, [raw_key, raw_key]).fetchone()
        finally:
            cursor.close()
        return bool(row and row[0])
