"""Each batch's span of point times in a catalog hour, out of core (PROTOCOL §3.7, §3.9).

`read_hour_spans` gives ``[min_ts_ns, max_ts_ns]`` of each batch a ledger hour includes
(its ``manifest_id`` column), from the accepted row that counts of each key
(`index.catalog_rank`), in DuckDB over local copies of the hour's files under the memory
limit (`index.catalog_tables.query_hour`): an hour of millions of batches is never all in
memory, only the answer, 16 bytes a batch. A null bound (a row written before the columns
existed) is the widest; an included batch without an accepted row spans all time; a batch
cataloged under both agent key forms (PROTOCOL §3) is one batch, its rows' widest span.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from protocol import keys
from store.base import ObjectStore

from .catalog_local import ONE_ROW_PER_KEY, MergeLimits
from .catalog_tables import MANIFEST_ID_SQL, query_hour

LOWEST, HIGHEST = -(2**63), 2**63 - 1
_SPANS_SQL = """
SELECT min(coalesce(a.low, ({lowest})::BIGINT)) AS low, max(coalesce(a.high, {highest})) AS high
FROM included AS i LEFT JOIN (
    SELECT {mid} AS mid, r.min_ts_ns AS low, r.max_ts_ns AS high
    FROM {one_row_per_key} AND r.kind = 'accepted'
) AS a ON a.mid = i.id
GROUP BY i.id
"""


async def read_hour_spans(
    store: ObjectStore, hour: keys.UtcHour, included: pa.Array, limits: MergeLimits | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(mins, maxs)``, one pair per distinct id of ``included`` (``manifest_id``\\s), as
    above. `IndexFileError` when a file is not a catalog file of the hour."""
    if len(included) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)

    def spans(con: duckdb.DuckDBPyConnection, files: str, _named: dict[str, str]) -> pa.Table:
        con.register("included", pa.table({"id": included}))
        sql = _SPANS_SQL.format(
            lowest=LOWEST,
            highest=HIGHEST,
            mid=MANIFEST_ID_SQL,
            one_row_per_key=ONE_ROW_PER_KEY.format(files=files),
        )
        return con.execute(sql).to_arrow_table()

    found = await query_hour(store, hour, limits or MergeLimits(), spans)
    if found is None:  # no catalog file: every batch may span all time
        distinct = len(pc.unique(included))
        return np.full(distinct, LOWEST, np.int64), np.full(distinct, HIGHEST, np.int64)
    return (
        found.column("low").to_numpy().astype(np.int64, copy=False),
        found.column("high").to_numpy().astype(np.int64, copy=False),
    )
