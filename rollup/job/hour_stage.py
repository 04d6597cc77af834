"""Stage 2 of a rollup run: one hour's partials → its ``rollup_1m`` and ledger files.

`hour_stage` (one call per hour, through ``groupBy("hour").applyInArrow``) merges the
hour's partials from every stage-1 task with the ``rollup_1m`` rows already committed
for that hour (`resolve_committed_ties` supplies the tie keys those rows do not keep),
writes the replacement ``rollup_1m`` file and the hour's ledger file, and passes stage
1's file and problem records through. Out come `rollup.job.tasks.RESULT_SCHEMA` rows for the
driver.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from protocol import keys
from rollup.job.tasks import (
    RESULT_SCHEMA,
    HourFunction,
    HourInputs,
    WriteOptions,
    distinct_series_info,
    file_body,
    from_ipc,
    record,
    records_table,
    write_parquet,
)
from rollup.table import aggregate
from rollup.table.aggregate import PARTIAL_SCHEMA, SERIES_INFO_SCHEMA
from rollup.table.ledger import LedgerRow, ledger_table, ledger_totals
from rollup.table.schemas import LEDGER_SCHEMA, POINTS_SCHEMA, ROLLUP_1M_SCHEMA, file_stats
from rollup.table.storage import read_parquet
from rollup.table.tombstones import drop_masked, for_table


def hour_stage(options: WriteOptions, inputs: HourInputs) -> HourFunction:
    """Stage 2 as the function ``applyInArrow`` wants: PySpark reads its two parameters
    and type hints to pass the grouping key and the whole hour as one `pyarrow.Table`."""

    def run(key: tuple[pa.Scalar, ...], rows: pa.Table) -> pa.Table:
        return write_hour(options, inputs, str(key[0].as_py()), rows)

    return run


def write_hour(options: WriteOptions, inputs: HourInputs, hour: str, rows: pa.Table) -> pa.Table:
    """Stage 2 for one hour (``YYYY-MM-DDTHH``) of `STAGE1_SCHEMA` rows; see the module doc."""
    kinds = rows.column("kind")
    out: list[pa.Table] = [
        rows.filter(pc.is_in(kinds, pa.array(["points_file", "problem"]))).select(
            RESULT_SCHEMA.names
        )
    ]
    partials = from_ipc(rows.filter(pc.equal(kinds, "partials")).column("data"), PARTIAL_SCHEMA)
    if partials.num_rows:
        info = from_ipc(rows.filter(pc.equal(kinds, "series")).column("data"), SERIES_INFO_SCHEMA)
        written = _write_rollup_hour(options, inputs, hour, partials, info)
        out.append(records_table([written]).select(RESULT_SCHEMA.names))
    ledger = rows.filter(pc.equal(kinds, "ledger"))
    if ledger.num_rows:
        written = _write_ledger_hour(options, hour, ledger)
        out.append(records_table([written]).select(RESULT_SCHEMA.names))
    return pa.concat_tables(out).cast(RESULT_SCHEMA)


def _write_rollup_hour(
    options: WriteOptions, inputs: HourInputs, hour: str, partials: pa.Table, info: pa.Table
) -> dict[str, Any]:
    new = aggregate.merge_partials(partials.cast(PARTIAL_SCHEMA))
    committed = read_parquet(
        options.access, list(inputs.rollup_files.get(hour, ())), ROLLUP_1M_SCHEMA
    )
    # The rewritten file replaces the committed ones: it must not bring back rows the
    # base snapshot's deletes mask in them (applying all of them again is harmless).
    committed, _ = drop_masked(for_table(inputs.tombstones, "rollup_1m"), "rollup_1m", committed)
    if committed.num_rows:
        existing = aggregate.partials_of_rollup(committed)
        existing = resolve_committed_ties(
            existing,
            new,
            lambda series: _committed_points(options, inputs, hour, series),
        )
        new = aggregate.merge_partials(pa.concat_tables([existing, new]))
        info = pa.concat_tables([info.cast(SERIES_INFO_SCHEMA), aggregate.series_info(committed)])
    rows = aggregate.rollup_rows(new, distinct_series_info(info.cast(SERIES_INFO_SCHEMA)))
    utc_hour = keys.UtcHour.parse_iso(hour)
    path = keys.rollup_data_key("rollup_1m", utc_hour, str(uuid.uuid4()))
    size = write_parquet(options, path, rows, ROLLUP_1M_SCHEMA)
    low, high = file_stats(rows)
    return record(
        "rollup_file", hour, file_body("rollup_1m", path, utc_hour, rows.num_rows, size, low, high)
    )


def _write_ledger_hour(options: WriteOptions, hour: str, rows: pa.Table) -> dict[str, Any]:
    bodies = [json.loads(text) for text in rows.column("body").to_pylist()]
    table = ledger_table(
        LedgerRow(b["manifest_id"], b["frame_sha256"], b["record_count"], b["accepted_hour"])
        for b in bodies
    )
    path = keys.rollup_ledger_key(keys.UtcHour.parse_iso(hour), str(uuid.uuid4()))
    write_parquet(options, path, table, LEDGER_SCHEMA)
    totals = ledger_totals(table)[hour]
    late = ledger_totals(table.filter(pa.array([bool(b.get("late_excluded")) for b in bodies])))
    return record(
        "ledger_file",
        hour,
        {
            "path": path,
            "batches": totals.batches,
            "records": totals.records,
            "setsum": totals.setsum,
            "late_excluded": late[hour].to_dict() if hour in late else None,
        },
    )


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


_KEYS = ("agent", "boot", "seq")


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


def _committed_points(
    options: WriteOptions, inputs: HourInputs, hour: str, series: list[str]
) -> pa.Table:
    paths = list(inputs.points_files.get(hour, ()))
    fs, root = options.access.filesystem()
    wanted = pc.field("series").isin(series)
    tables = [
        pq.read_table(f"{root}/{path}", filesystem=fs, filters=wanted, schema=POINTS_SCHEMA)
        for path in paths
    ]
    return pa.concat_tables(tables) if tables else POINTS_SCHEMA.empty_table()
