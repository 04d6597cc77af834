"""First/last ties against committed ``rollup_1m`` rows (PROTOCOL §4): the tie keys
(agent, boot, seq) those rows do not keep, found in the committed ``points`` rows when a
new partial ties on ``ts``. Pure pyarrow; used by the job's stage 2 and by live queries
that merge the window into committed rows (`collector.query.rows`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup.table.aggregate import PARTIAL_SCHEMA

_KEYS = ("agent", "boot", "seq")


def resolve_committed_ties(
    committed: pa.Table, new: pa.Table, committed_points: Callable[[list[str]], pa.Table]
) -> pa.Table:
    """Fill in the unknown first/last tie keys of committed partials where they matter.

    ``rollup_1m`` keeps a first/last sample's ``ts`` and value but not its (agent, boot,
    seq), so when a new partial's first (last) has the same ``ts`` as the committed
    row's, the committed key is looked up in the committed ``points`` rows
    (``committed_points`` gets the series concerned): the least (greatest) key among that
    series' samples at that ``ts`` *with the committed value* (NaN equal to NaN). Ties
    are rare, so the points are read only when one occurs, and only tied rows are
    touched (the rest of the table is passed through column by column).

    **When the committed point is gone** (``lm-rollup delete --agent`` followed by
    compaction, or points retention shorter than rollup_1m's), no sample matches and the
    key stays unknown: `rollup.table.aggregate.merge_partials` then keeps the committed sample
    on an equal ``ts`` — an unknown key counts as the least for ``first`` and the
    greatest for ``last`` — so a committed first/last is displaced only by a strictly
    earlier/later sample. Deterministic and needs no point; never an error. Its one
    limit: the true key is unknown, so a later sample that should have won the tie by
    its key does not (the answer keeps the value that was committed first). Matching on
    the value keeps another sample at the same ``ts`` from being taken for the gone one;
    if that other sample has the very same value, its key is used (the value answered
    is the same either way)."""
    count = committed.num_rows
    indexed = committed.select(["window_us", "series", "first_ts_us", "last_ts_us"])
    indexed = indexed.append_column("row", pa.array(np.arange(count, dtype=np.int64)))
    joined = indexed.join(
        new.select(["window_us", "series", "first_ts_us", "last_ts_us"]),
        keys=["window_us", "series"],
        right_suffix="_new",
        join_type="inner",
    )
    ties = joined.filter(
        pc.or_(
            pc.equal(joined["first_ts_us"], joined["first_ts_us_new"]),
            pc.equal(joined["last_ts_us"], joined["last_ts_us_new"]),
        )
    )
    if ties.num_rows == 0:
        return committed
    rows = sorted(set(ties["row"].to_pylist()))
    tied = committed.take(pa.array(rows, pa.int64())).to_pylist()
    candidates = _candidates(committed_points(sorted({row["series"] for row in tied})))
    updates: dict[str, list[Any]] = {f"{w}_{k}": [] for w in ("first", "last") for k in _KEYS}
    for row in tied:
        for which, pick in (("first", min), ("last", max)):
            value = row[which]
            found = [
                key
                for sample_value, key in candidates.get((row["series"], row[f"{which}_ts_us"]), ())
                if sample_value == value or (math.isnan(sample_value) and math.isnan(value))
            ]
            chosen: tuple[Any, ...] = pick(found) if found else (None, None, None)
            for name, part in zip(_KEYS, chosen, strict=True):
                updates[f"{which}_{name}"].append(part)
    # Scatter the tied rows' keys into the columns: row i takes entry ``count + j``.
    where = np.arange(count, dtype=np.int64)
    where[rows] = count + np.arange(len(rows), dtype=np.int64)
    picked = pa.array(where)
    for name, values in updates.items():
        column = committed.column(name)
        both = pa.concat_arrays([column.combine_chunks(), pa.array(values, column.type)])
        scattered = both.take(picked)
        committed = committed.set_column(committed.schema.get_field_index(name), name, scattered)
    return committed.cast(PARTIAL_SCHEMA)


def _candidates(points: pa.Table) -> dict[tuple[str, int], list[tuple[float, tuple[Any, ...]]]]:
    """Per (series, ts µs): each committed sample's value and (agent, boot, seq)."""
    table = points.select(["series", "ts", "value", "agent_id", "boot_id", "seq"])
    table = table.cast(
        pa.schema(
            [
                ("series", pa.string()),
                ("ts", pa.int64()),
                ("value", pa.float64()),
                ("agent_id", pa.string()),
                ("boot_id", pa.string()),
                ("seq", pa.int64()),
            ]
        )
    )
    found: dict[tuple[str, int], list[tuple[float, tuple[Any, ...]]]] = {}
    for row in table.to_pylist():
        found.setdefault((row["series"], row["ts"]), []).append(
            (row["value"], (row["agent_id"], row["boot_id"], row["seq"]))
        )
    return found
