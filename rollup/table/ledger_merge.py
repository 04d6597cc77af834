"""Merging an accepted hour's ledger files into one (issue 24 item 10; part of compaction).

Every rollup run writes one ledger file per accepted hour it includes batches of, so a
snapshot's ``ledger.files`` would grow with runs x hours. Compaction (`rollup.lifecycle.compaction`)
merges the files of each hour that has at least ``min_files`` of them into one file of
the same rows (sorted by ``manifest_id``), in the same commit as its data files, so a
snapshot lists about one ledger file per accepted hour.

Exact and verifiable: the merged rows are the hour's rows, none dropped or added, and
their totals (batches, records, setsum: `rollup.table.ledger.ledger_totals`) must equal the
snapshot's ``ledger.hours`` entry before anything is committed; an hour whose files
disagree with it is left alone and logged (``lm-rollup verify`` shows it). ``ledger.hours``,
``late_excluded`` and ``lost`` are per-hour totals, untouched. A key without a parseable
partition (written before the partition rule) is never merged.

Cost per merged hour: one GET per input file and one PUT; a commit's manifest then lists
one file for the hour instead of one per run.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import structlog

from protocol import keys
from rollup.table.ledger import decode_ledger, encode_ledger, ledger_totals
from rollup.table.manifest import Snapshot
from rollup.table.manifest_ledger import ledger_file_hour
from rollup.table.schemas import LEDGER_SCHEMA
from store.base import ObjectStore

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class LedgerMerge:
    """One hour's merge: the files it replaces and the one file that replaces them."""

    hour: str
    removed: tuple[str, ...]
    added: str
    batches: int


def choose_hours(
    snapshot: Snapshot, *, min_files: int, hours: Sequence[keys.UtcHour] | None = None
) -> dict[str, tuple[str, ...]]:
    """Per accepted hour with at least ``min_files`` ledger files (``hours``: only those,
    when they have two or more), its files. Pure."""
    wanted = {hour.iso for hour in hours} if hours is not None else None
    by_hour: dict[str, list[str]] = {}
    for path in snapshot.ledger_files:
        hour = ledger_file_hour(path)
        if hour is not None and (wanted is None or hour in wanted):
            by_hour.setdefault(hour, []).append(path)
    least = 2 if wanted is not None else max(2, min_files)
    return {h: tuple(sorted(p)) for h, p in sorted(by_hour.items()) if len(p) >= least}


async def merge_hours(
    store: ObjectStore,
    snapshot: Snapshot,
    chosen: dict[str, tuple[str, ...]],
    *,
    concurrency: int = 16,
) -> list[LedgerMerge]:
    """Write one merged ledger file for each chosen hour whose rows add up to the
    snapshot's totals for it; the merges to commit (see the module doc)."""
    limit = asyncio.Semaphore(concurrency)

    async def read(key: str) -> pa.Table:
        async with limit:
            body, _ = await store.get(key)
        return decode_ledger(body, key=key)

    merges: list[LedgerMerge] = []
    for hour, paths in chosen.items():
        rows = pa.concat_tables(await asyncio.gather(*(read(p) for p in paths)))
        totals = ledger_totals(rows)
        if set(totals) != {hour} or totals[hour] != snapshot.ledger_hours.get(hour):
            log.warning(
                "rollup_ledger_merge_skipped",
                hour=hour,
                files=len(paths),
                detail="the files' rows do not add up to ledger.hours (see lm-rollup verify)",
            )
            continue
        merged = rows.sort_by("manifest_id").cast(LEDGER_SCHEMA)
        key = keys.rollup_ledger_key(keys.UtcHour.parse_iso(hour), str(uuid.uuid4()))
        await store.put(key, encode_ledger(merged))
        merges.append(LedgerMerge(hour, paths, key, merged.num_rows))
    return merges
