"""What a rollup run must include: cataloged batches not yet in the snapshot's ledger.

Planning reads only what changed (PROTOCOL §4, §3.7): the rollup work markers
(``work/v1/rollup-dirty/catalog/…``, one per catalog file the reconciler wrote) name the
hours that gained rows; for each such hour (and, with ``lookback_hours``, the hours just
before ``now``) the planner reads the hour's catalog (`index.catalog.read_hour`: a few
files per hour once compacted) and subtracts the snapshot's ledger for that hour. Catalog
rows are verified records (the reconciler read each manifest itself), so no manifest is
read again: a run's requests grow with the dirty hours, never with the history.

A batch is planned once per plan, by ``manifest_id``: one cataloged under both agent key
forms (PROTOCOL §3, a mixed-version upgrade) counts once (`CatalogHour.batches`; the
two forms in different hours: the earlier hour's row). A batch's ``accepted_hour`` is
its catalog hour (the UTC hour of ``accepted_at``), which
``verify`` recomputes the ledger's setsums from; `index.catalog.read_file` refuses a file
holding a row of another hour. Markers are returned, not deleted: the job deletes them
after it has read back a committed pointer whose ledger includes their rows (or when the
plan needed nothing from their hours).

An unreadable catalog file stops the plan (`IndexFileError`): its hour must not be
planned as if its rows did not exist. The reconciler moves such a file aside and the
next audit catalogs its records again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from index.catalog import read_hour
from protocol import keys
from rollup.commit import LoadedSnapshot
from rollup.ledger import included_manifest_ids
from store.base import ObjectStore

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One accepted batch to include (a row of `rollup.tasks.WORK_SCHEMA`)."""

    manifest_id: str
    frame_sha256: str
    raw_blob_key: str
    accepted_hour: str
    record_count: int

    def as_row(self) -> tuple[str, str, str, str, int]:
        return (
            self.manifest_id,
            self.frame_sha256,
            self.raw_blob_key,
            self.accepted_hour,
            self.record_count,
        )


@dataclass(frozen=True, slots=True)
class Plan:
    base: LoadedSnapshot | None
    items: tuple[WorkItem, ...]
    hours_listed: int
    hours_checked: tuple[str, ...]
    dirty_markers: tuple[str, ...] = ()
    skipped: tuple[str, ...] = field(default_factory=tuple)

    @property
    def records(self) -> int:
        return sum(item.record_count for item in self.items)


async def make_plan(
    store: ObjectStore,
    base: LoadedSnapshot | None,
    *,
    lookback_hours: int = 0,
    now_ns: int | None = None,
    progress: bool = False,
) -> Plan:
    """The plan against ``base`` (None: nothing included yet). Store errors propagate
    (nothing has been changed); `RollupManifestError` if a ledger file is unreadable,
    `IndexFileError` if a catalog file is."""
    markers, hours = await _work_markers(store)
    if lookback_hours and now_ns is not None:
        current = keys.UtcHour.from_unix_ns(now_ns)
        hours.update(current.shifted(-back) for back in range(lookback_hours + 1))
    checked = sorted(hours)
    included: dict[str, set[str]] = {}
    if base is not None and checked:
        included = await included_manifest_ids(store, base.snapshot, {h.iso for h in checked})
    items: list[WorkItem] = []
    planned: set[str] = set()  # one batch once per plan, whatever its key forms and hours
    for hour in checked:
        done = included.get(hour.iso, set())
        catalog = await read_hour(store, hour)
        for row in catalog.batches():
            manifest_id = row.manifest_id
            if manifest_id in done or manifest_id in planned:
                continue
            planned.add(manifest_id)
            assert row.raw_blob_key is not None and row.record_count is not None
            items.append(
                WorkItem(
                    manifest_id=manifest_id,
                    frame_sha256=row.frame_sha256,
                    raw_blob_key=row.raw_blob_key,
                    accepted_hour=hour.iso,
                    record_count=row.record_count,
                )
            )
    log.info(
        "rollup_plan_read",
        hours_checked=len(checked),
        pending_batches=len(items),
        work_markers=len(markers),
    )
    return Plan(
        base=base,
        items=tuple(items),
        hours_listed=len(checked),
        hours_checked=tuple(h.iso for h in checked),
        dirty_markers=tuple(markers),
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
