"""What a rollup run must include: cataloged batches not yet in the snapshot's ledger.

Planning reads only what changed (PROTOCOL §4, §3.7): the rollup work markers
(``work/v1/rollup-dirty/catalog/…``, one per catalog file the reconciler wrote) name the
hours that gained rows; for each such hour (and, with ``lookback_hours``, the hours just
before ``now``) the planner reads the hour's catalog and subtracts the snapshot's ledger
for that hour. Catalog rows are verified records (the reconciler read each manifest
itself), so no manifest is read again: a run's requests grow with the dirty hours, never
with the history.

Column-wise and out of core (PROTOCOL §3.9; `rollup.job.plan_sql`): the hours' catalog files
and ledger files are copied locally one at a time and DuckDB, under a memory limit that
spills, keeps the newest row per key, the accepted rows, their ``manifest_id``, the
anti-join with the ledger hour and the dedupe; the result streams into a local Arrow IPC
file that `Plan.items` memory-maps. No Python object per batch, and the driver's memory
does not grow with the hour (3.6M rows: bench/RESULTS.md, ``bench.plan_hour``).

A batch is planned once per plan, by ``manifest_id``: one cataloged under both agent key
forms (PROTOCOL §3, a mixed-version upgrade) counts once (the least key; the two forms in
different hours: the earlier hour's row). A batch's ``accepted_hour`` is its catalog hour
(the UTC hour of ``accepted_at``), which ``verify`` recomputes the ledger's setsums from;
a catalog file holding a row of another hour is refused. Markers are returned, not
deleted: the job deletes them after it has read back a committed pointer whose ledger
includes their rows (or when the plan needed nothing from their hours).

An unreadable catalog file stops the plan (`IndexFileError`): its hour must not be
planned as if its rows did not exist. The reconciler moves such a file aside and the
next audit catalogs its records again. An unreadable ledger file stops it too
(`RollupManifestError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import structlog

from index.catalog_local import MergeLimits
from protocol import keys
from rollup.job.plan_sql import REFUSED_SCHEMA, RETRACTED_SCHEMA, PlannedHours, plan_hours
from rollup.job.tasks import WORK_SCHEMA
from rollup.table.commit import LoadedSnapshot
from rollup.table.manifest_ledger import ledger_file_hour
from store.base import ObjectStore

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Plan:
    base: LoadedSnapshot | None
    items: pa.Table
    """The batches to include, `rollup.job.tasks.WORK_SCHEMA` (memory-mapped when large)."""
    hours_listed: int
    hours_checked: tuple[str, ...]
    dirty_markers: tuple[str, ...] = ()
    skipped: tuple[str, ...] = field(default_factory=tuple)
    retracted: pa.Table = field(default_factory=RETRACTED_SCHEMA.empty_table)
    """Included batches whose key's counting catalog row is ``retracted``
    (`rollup.job.plan_sql.RETRACTED_SCHEMA`): the run removes them first."""
    refused: pa.Table = field(default_factory=REFUSED_SCHEMA.empty_table)
    """Batches not planned: ``overlapping-identity`` (`rollup.job.plan_sql.REFUSED_SCHEMA`)."""

    @property
    def batches(self) -> int:
        return int(self.items.num_rows)

    @property
    def records(self) -> int:
        return int(pc.sum(self.items.column("record_count")).as_py() or 0)

    def refused_problems(self) -> list[dict[str, str]]:
        """One ``overlapping-identity`` problem per refused batch (PROTOCOL §3.7)."""
        return [
            {
                "kind": "overlapping-identity",
                "subject_key": keys.accepted_manifest_key(
                    keys.parse_manifest_id(row["manifest_id"]).identity  # type: ignore[arg-type]
                ),
                "detail": f"its seq range overlaps batch {row['other']} of the same agent "
                f"and boot (accepted batch {row['manifest_id']})",
                "manifest_id": row["manifest_id"],
                "accepted_hour": row["accepted_hour"],
            }
            for row in self.refused.to_pylist()
        ]

    def manifest_ids(self) -> list[str]:
        """The planned ``manifest_id``s (for tests and small plans)."""
        return [str(m) for m in self.items.column("manifest_id").to_pylist()]

    def batches_per_hour(self) -> dict[str, int]:
        """Planned batches per ``accepted_hour``, column-wise."""
        counts = pc.value_counts(self.items.column("accepted_hour"))
        return {
            str(v): int(c)
            for v, c in zip(
                counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True
            )
        }


async def make_plan(
    store: ObjectStore,
    base: LoadedSnapshot | None,
    *,
    lookback_hours: int = 0,
    now_ns: int | None = None,
    progress: bool = False,
    limits: MergeLimits | None = None,
) -> Plan:
    """The plan against ``base`` (None: nothing included yet). Store errors propagate
    (nothing has been changed); `RollupManifestError` if a ledger file is unreadable,
    `IndexFileError` if a catalog file is. ``limits``: DuckDB's memory limit and where
    local copies, spill files and the plan's items go."""
    markers, hours = await _work_markers(store)
    if lookback_hours and now_ns is not None:
        current = keys.UtcHour.from_unix_ns(now_ns)
        hours.update(current.shifted(-back) for back in range(lookback_hours + 1))
    checked = sorted(hours)
    ledger_files = (
        [
            key
            for key in base.snapshot.ledger_files
            if (hour := ledger_file_hour(key)) is None or hour in {h.iso for h in checked}
        ]
        if base is not None and checked
        else []
    )
    planned = (
        await plan_hours(store, checked, ledger_files, limits or MergeLimits())
        if checked
        else PlannedHours(WORK_SCHEMA.empty_table())
    )
    items = planned.items
    log.info(
        "rollup_plan_read",
        hours_checked=len(checked),
        pending_batches=items.num_rows,
        work_markers=len(markers),
    )
    return Plan(
        base=base,
        items=items,
        hours_listed=len(checked),
        hours_checked=tuple(h.iso for h in checked),
        dirty_markers=tuple(markers),
        retracted=planned.retracted,
        refused=planned.refused,
    )


async def _work_markers(store: ObjectStore) -> tuple[list[str], set[keys.UtcHour]]:
    """The work markers and the hours they name."""
    marker_keys: list[str] = []
    hours: set[keys.UtcHour] = set()
    async for info in store.list(keys.ROLLUP_WORK_PREFIX):
        try:
            catalog_key = keys.parse_rollup_work_marker_key(info.key)
            hour, _epoch, _sequence = keys.parse_index_catalog_key(catalog_key)
        except keys.KeyFormatError:
            log.warning("rollup_work_marker_ignored", key=info.key)
            continue
        hours.add(hour)
        marker_keys.append(info.key)
    return marker_keys, hours
