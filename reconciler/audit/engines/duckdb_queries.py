"""The few small catalog queries the audit's acts make of the local engine's
``catalog_rows`` view (`reconciler.audit.engines.duckdb_joins.AuditJoins`): a handful of
keys or one hash at a time, never a pass over the catalog per row found."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from index.catalog_local import sql_string
from reconciler.audit.engines import sql as audit_sql


class CatalogQueries:
    _con: duckdb.DuckDBPyConnection

    def newest_rows(
        self, record_keys: Sequence[str]
    ) -> dict[str, tuple[str | None, str, str | None, int]]:
        """Per key of ``record_keys`` (few): its newest catalog row's ``etag``,
        ``frame_sha256``, ``accepted_frame_sha256`` and ``time_unix_ns``."""
        if not record_keys:
            return {}
        found = self._con.execute(
            "SELECT key, arg_max(etag, write_rank), arg_max(frame_sha256, write_rank), "
            "arg_max(accepted_frame_sha256, write_rank), arg_max(time_unix_ns, write_rank) "
            f"FROM catalog_rows WHERE key IN ({', '.join(sql_string(k) for k in record_keys)}) "
            "GROUP BY key"
        ).fetchall()
        return {str(k): (etag, sha, accepted, int(time)) for k, etag, sha, accepted, time in found}

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

    def references(self, sha: str) -> bool:
        """Whether a live catalog row references the blob ``sha`` (for blob verification's
        message: a query over the catalog copies, rare). Its own cursor: safe while a
        join runs in another thread."""
        cursor = self._con.cursor()
        try:
            row = cursor.execute(audit_sql.IS_REFERENCED, [sha, sha]).fetchone()
        finally:
            cursor.close()
        return bool(row and row[0])
