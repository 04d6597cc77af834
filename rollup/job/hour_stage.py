"""Stage 2 of a rollup run: one hour's partials → its ``rollup_1m``, ``series`` and ledger
files.

`hour_stage` (one call per hour, through ``groupBy("hour").applyInArrow``) merges the
hour's partials from every stage-1 task with the ``rollup_1m`` rows already committed
for that hour (`rollup.table.ties.resolve_committed_ties` supplies the tie keys those rows do not keep),
writes the replacement ``rollup_1m`` file, the hour's ``series`` file (every task's
series counts of this run's points combined) and the hour's ledger file, and passes stage
1's file and problem records through. Out come `rollup.job.tasks.RESULT_SCHEMA` rows for the
driver.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

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
from rollup.table.schemas import (
    LEDGER_SCHEMA,
    POINTS_SCHEMA,
    ROLLUP_1M_SCHEMA,
    SERIES_SCHEMA,
    file_stats,
)
from rollup.table.series_rows import HOUR_COUNTS_SCHEMA, series_table
from rollup.table.storage import read_parquet
from rollup.table.ties import resolve_committed_ties
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
    counts = rows.filter(pc.equal(kinds, "series_counts"))
    if counts.num_rows:
        written = _write_series_hour(options, hour, counts)
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


def _write_series_hour(options: WriteOptions, hour: str, rows: pa.Table) -> dict[str, Any]:
    """The hour's ``series`` file: every task's counts of the points this run wrote,
    one row per series (PROTOCOL §4: committed rows of the hour stay in their own files;
    readers combine them)."""
    table = series_table(from_ipc(rows.column("data"), HOUR_COUNTS_SCHEMA))
    utc_hour = keys.UtcHour.parse_iso(hour)
    path = keys.rollup_data_key("series", utc_hour, str(uuid.uuid4()))
    size = write_parquet(options, path, table, SERIES_SCHEMA)
    low, high = file_stats(table)
    return record(
        "series_file", hour, file_body("series", path, utc_hour, table.num_rows, size, low, high)
    )


def _write_ledger_hour(options: WriteOptions, hour: str, rows: pa.Table) -> dict[str, Any]:
    bodies = [json.loads(text) for text in rows.column("body").to_pylist()]
    table = ledger_table(
        LedgerRow(
            b["manifest_id"],
            b["frame_sha256"],
            b["record_count"],
            b["accepted_hour"],
            b.get("min_ts"),
            b.get("max_ts"),
        )
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
