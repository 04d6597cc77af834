"""`lm-rollup verify`'s batch-by-batch checks, out of core (PROTOCOL §3.7, §3.9, §4).

The accepted batches of the checked hours are local Parquet files of `BATCH_COLUMNS`
(`index.catalog_tables.read_hour_totals` writes a catalog hour's; `rollup.read.verify` writes
those read from ``accepted/v1/``); the ledger files of an hour are copied locally one at a
time; DuckDB compares them under a memory limit, spilling to the work directory. Nothing
here holds an hour as Python objects: only counts and a bounded number of named batches
come back.

- `moved_rows`: the rows of keys cataloged in two or more of the checked hours that are
  not the key's newest row (the newest catalog file's row counts, PROTOCOL §3.7): an audit
  superseded the key with a record of another hour. Rare; returned as Arrow.
- `compare_hour`: one hour's batches against the snapshot's ledger rows of that hour:
  missing (accepted, not in the ledger) and extra (in the ledger, not accepted, or there
  twice) as multisets of ``(manifest_id, frame_sha256)``, the ledger's totals recomputed
  from its files, and **superseded batches**: a batch the ledger holds with another
  ``frame_sha256`` or ``record_count`` than the row that counts, or whose key's newest row
  is in another hour. Those fail the hour naming the key (PROTOCOL §3.7: "if the rollup's
  ledger already holds that key with other fields or in another hour, `lm-rollup verify`
  fails that hour until it is rebuilt").

The ledger records no record time, only the accepted hour: a superseding row whose time
moved within the hour changes nothing the ledger holds, so it is not a difference.
"""

from __future__ import annotations

import asyncio
import io
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from index.catalog_local import MergeLimits, connect, sql_list, sql_string
from index.catalog_tables import _limbs, _setsum_of_limbs
from rollup.table.ledger import conform_ledger
from rollup.table.manifest import LedgerHour, RollupManifestError, Snapshot
from rollup.table.manifest_ledger import ledger_file_hour
from rollup.table.schemas import LEDGER_SCHEMA
from store.base import ObjectStore

MAX_NAMED = 100
"""Superseded batches named per hour at most (the count is exact)."""


@dataclass(frozen=True, slots=True)
class LedgerComparison:
    missing: int
    extra: int
    absent: list[tuple[str, str]]
    """``(manifest_id, frame_sha256)`` of up to ``limit`` missing batches, in id order."""
    ledger_totals: LedgerHour
    """The hour's totals recomputed from its ledger files."""
    superseded: list[str]
    """Up to `MAX_NAMED` batches the ledger holds otherwise than the catalog row that
    counts, each naming its key and the differing fields."""
    superseded_total: int


MOVED_ROWS_SELECT = """
SELECT r.key, r.manifest_id, r.frame_sha256, r.record_count, r.accepted_hour,
    n.accepted_hour AS newest_hour, n.frame_sha256 AS newest_sha256,
    n.time_unix_ns AS newest_time_unix_ns
FROM rows AS r JOIN multi AS m ON r.key = m.key
JOIN rows AS n ON n.key = m.key AND n.catalog_file = m.newest
WHERE r.catalog_file != m.newest
"""
"""The rows of a key whose newest row (``multi.newest``, a ``catalog_file``) is another's."""
_MOVED_SQL = (
    """
WITH rows AS (SELECT * FROM read_parquet({files})),
files AS (
    SELECT catalog_file, row_number() OVER (ORDER BY catalog_file) AS file_order
    FROM (SELECT DISTINCT catalog_file FROM rows)
),
multi AS (
    SELECT f.catalog_file AS newest, m.key FROM (
        SELECT r.key, max(f.file_order) AS newest_order
        FROM rows AS r JOIN files AS f USING (catalog_file)
        GROUP BY r.key HAVING count(*) > 1
    ) AS m JOIN files AS f ON f.file_order = m.newest_order
)
"""
    + MOVED_ROWS_SELECT
)
"""Each key's newest row is the one of the greatest ``catalog_file`` name, taken by its
order among the (few) names: the aggregate over every key keeps an integer, a fixed-size
state that spills within DuckDB's memory limit (a ``max`` of the name itself did not,
`index.catalog_local.NEWEST_PER_KEY`)."""


def moved_rows(batch_files: Sequence[str], limits: MergeLimits, tmp: str) -> pa.Table:
    """Rows of `BATCH_COLUMNS` files (one per hour) whose key's newest row is another
    file's, with that row's hour, hash and time (``newest_*``)."""
    if not batch_files:
        return pa.table({})
    with connect(limits, tmp) as con:
        return con.execute(_MOVED_SQL.format(files=sql_list(batch_files))).to_arrow_table()


_COMPARE_SQL = {
    "missing": """
        SELECT count(*) FROM accepted AS a
        WHERE NOT EXISTS (SELECT 1 FROM ledger AS l
            WHERE l.manifest_id = a.manifest_id AND l.frame_sha256 = a.frame_sha256)""",
    "absent": """
        SELECT a.manifest_id, a.frame_sha256 FROM accepted AS a
        WHERE NOT EXISTS (SELECT 1 FROM ledger AS l
            WHERE l.manifest_id = a.manifest_id AND l.frame_sha256 = a.frame_sha256)
        ORDER BY 1, 2 LIMIT {limit}""",
    "extra": """
        SELECT coalesce(sum(greatest(l.n - coalesce(a.n, 0), 0)), 0) FROM
            (SELECT manifest_id, frame_sha256, count(*) AS n FROM ledger GROUP BY ALL) AS l
        LEFT JOIN (SELECT manifest_id, frame_sha256, count(*) AS n FROM accepted GROUP BY ALL)
            AS a ON l.manifest_id = a.manifest_id AND l.frame_sha256 = a.frame_sha256""",
    "totals": """
        SELECT count(*), coalesce(sum(record_count), 0), {limbs}
        FROM (SELECT record_count, sha256(manifest_id || chr(10) || frame_sha256) AS h
              FROM ledger)""",
    "differs": """
        SELECT DISTINCT a.key, l.frame_sha256, a.frame_sha256, l.record_count, a.record_count
        FROM ledger AS l JOIN accepted AS a ON l.manifest_id = a.manifest_id
        WHERE l.frame_sha256 != a.frame_sha256 OR l.record_count != a.record_count
        ORDER BY 1 LIMIT {limit}""",
    "moved": """
        SELECT DISTINCT m.key, m.newest_hour, m.newest_sha256, m.newest_time_unix_ns,
            l.frame_sha256
        FROM ledger AS l JOIN moved AS m ON l.manifest_id = m.manifest_id
        ORDER BY 1 LIMIT {limit}""",
    "differs_n": """
        SELECT count(DISTINCT a.key)
        FROM ledger AS l JOIN accepted AS a ON l.manifest_id = a.manifest_id
        WHERE l.frame_sha256 != a.frame_sha256 OR l.record_count != a.record_count""",
    "moved_n": """
        SELECT count(DISTINCT m.key)
        FROM ledger AS l JOIN moved AS m ON l.manifest_id = m.manifest_id""",
}


async def compare_hour(
    store: ObjectStore,
    snapshot: Snapshot | None,
    hour: str,
    batches: str,
    moved: pa.Table,
    limits: MergeLimits,
    *,
    limit: int,
) -> LedgerComparison:
    """The hour's accepted batches (rows of ``batches`` whose ``accepted_hour`` is
    ``hour``) against the snapshot's ledger rows of that hour (module doc). ``moved``:
    `moved_rows` (of every checked hour). Raises store errors, `RollupManifestError` when
    a ledger file is not one."""
    wanted = [
        key
        for key in (snapshot.ledger_files if snapshot is not None else ())
        if (file_hour := ledger_file_hour(key)) is None or file_hour == hour
    ]
    with tempfile.TemporaryDirectory(prefix="lm-verify-ledger-", dir=limits.spill_dir) as tmp:
        paths = []
        for i, key in enumerate(wanted):  # one body in memory at a time
            body, _etag = await store.get(key)
            path = str(Path(tmp, f"{i:08d}.parquet"))
            await asyncio.to_thread(_write_ledger_copy, body, key, path)
            del body
            paths.append(path)
        if not paths:
            paths.append(str(Path(tmp, "empty.parquet")))
            await asyncio.to_thread(pq.write_table, LEDGER_SCHEMA.empty_table(), paths[0])
        mine = None
        if moved.num_columns:
            mine = moved.filter(pc.equal(moved.column("accepted_hour"), hour))
        return await asyncio.to_thread(_compare, paths, batches, hour, mine, limits, tmp, limit)


def _write_ledger_copy(body: bytes, key: str, path: str) -> None:
    try:
        table = conform_ledger(pq.read_table(io.BytesIO(body)))
    except (pa.ArrowException, KeyError, ValueError) as exc:
        raise RollupManifestError(f"ledger file {key!r} is unreadable: {exc}") from None
    pq.write_table(table, path)


def _compare(
    ledger_paths: list[str],
    batches: str,
    hour: str,
    moved: pa.Table | None,
    limits: MergeLimits,
    tmp: str,
    limit: int,
) -> LedgerComparison:
    with connect(limits, tmp) as con:
        con.execute(
            f"CREATE TEMP VIEW ledger AS SELECT * FROM read_parquet({sql_list(ledger_paths)}) "
            f"WHERE accepted_hour = {sql_string(hour)}"
        )
        con.execute(
            f"CREATE TEMP VIEW accepted AS SELECT * FROM read_parquet({sql_string(batches)}) "
            f"WHERE accepted_hour = {sql_string(hour)}"
        )
        one = _one_row(con)
        (missing,) = one(_COMPARE_SQL["missing"])
        (extra,) = one(_COMPARE_SQL["extra"])
        batches_n, records, *limbs = one(_COMPARE_SQL["totals"].format(limbs=_limbs("h")))
        absent = con.execute(_COMPARE_SQL["absent"].format(limit=limit)).fetchall()
        named = [
            f"{key}: the ledger holds frame_sha256 {ledger_sha}, record_count {ledger_n}; the "
            f"catalog row that counts has frame_sha256 {sha}, record_count {n}"
            for key, ledger_sha, sha, ledger_n, n in con.execute(
                _COMPARE_SQL["differs"].format(limit=MAX_NAMED)
            ).fetchall()
        ]
        (total,) = one(_COMPARE_SQL["differs_n"])
        if moved is not None and moved.num_rows:
            con.register("moved", moved)
            named += [
                f"{key}: the ledger holds it in hour {hour} (frame_sha256 {ledger_sha}); the "
                f"catalog row that counts is in hour {new_hour} (frame_sha256 {sha}, "
                f"time_unix_ns {time_ns})"
                for key, new_hour, sha, time_ns, ledger_sha in con.execute(
                    _COMPARE_SQL["moved"].format(limit=MAX_NAMED)
                ).fetchall()
            ]
            (moved_n,) = one(_COMPARE_SQL["moved_n"])
            total += moved_n
    setsum = _setsum_of_limbs(limbs)
    return LedgerComparison(
        missing=int(missing),
        extra=int(extra),
        absent=[(str(m), str(s)) for m, s in absent],
        ledger_totals=LedgerHour(int(batches_n), int(records), setsum.hex),
        superseded=named[:MAX_NAMED],
        superseded_total=int(total),
    )


def _one_row(con: duckdb.DuckDBPyConnection) -> Callable[[str], tuple[Any, ...]]:
    def run(sql: str) -> tuple[Any, ...]:
        row = con.execute(sql).fetchone()
        assert row is not None
        return tuple(row)

    return run
