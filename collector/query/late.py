"""``sources.late_batches`` of a ``/v1/query`` answer (PROTOCOL §2).

``complete`` is defined by *acceptance* time (`collector.query.coverage`): every batch
accepted before ``sealed_through_ns`` is in the snapshot. A batch accepted later can still
carry older points (an agent replaying its spool after an outage), so an old range can
still grow after it was answered ``complete: true``. ``late_batches`` says how much of an
answer came that way: the batches accepted at or after ``sealed_through_ns`` whose points'
span ``[min_ts_ns, max_ts_ns]`` overlaps the answer's points range and that the answer
includes, each counted once, from two places:

- the snapshot (`committed`): its ledger hours from the seal's hour on (every batch of
  such an hour was accepted at or after the seal), each batch's span from its catalog row
  (PROTOCOL §3.7: ``min_ts_ns``/``max_ts_ns``), matched to the ledger's ``manifest_id``\\s
  in DuckDB, out of core (`index.catalog_spans`);
- the live part (`in_live_part`): the window's batches the snapshot lacks, accepted at
  or after the seal (their span from the decoded frame, `collector.query.window`).

Never an under-count: a catalog row whose ``min_ts_ns``/``max_ts_ns`` are null (written
before the columns existed), a ledger batch with no catalog row, an hour whose catalog
could not be read, and an hour not examined in this answer (below) overlap every range.
Counted by time alone: a counted batch may hold no point of the query's metric or labels
(and one whose points a retention already dropped, the rollup's *late, excluded*, counts
when its span overlaps).

Cost: an hour's spans are read once per (hour, ledger totals) — a ledger hour's batch
count and setsum name the set of batches it includes, so an hour no rollup run changed
is not read again, whatever the version — out of core (the hour's catalog in DuckDB
under its memory limit), and kept as two int64 arrays (16 bytes a batch; at most
`MAX_CACHED_BATCHES` in all, the least recently used dropped). An answer asks for at
most `MAX_HOURS_READ_PER_QUERY` hours it lacks; they are read in one background task per
process, one hour at a time (an hour of a million batches or more takes seconds), and the
answer waits for them at most ``wait_s`` (``query.history_wait_s``): an hour not read by
then counts every batch its ledger hour includes (an upper bound) until it has been. A
read the store fails is logged and counted whole; a later answer asks again. Any other
failure reaches an answer (503), once, as when answers read the hours themselves.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import numpy as np
import structlog

from index.catalog_spans import read_hour_spans
from index.rows import IndexFileError
from protocol import keys
from rollup.table.manifest import LedgerHour, Snapshot
from store.errors import StoreError

from .background import BackgroundRead
from .committed import SnapshotSource
from .window import WindowBatch

log = structlog.get_logger("collector.query")
MAX_CACHED_BATCHES = 2_000_000
MAX_HOURS_READ_PER_QUERY = 16
MAX_WANTED_HOURS = 64  # hours asked for and waiting for the reader, at most


def overlaps(min_ts_ns: int, max_ts_ns: int, range_ns: tuple[int, int]) -> bool:
    """Whether points in ``[min_ts_ns, max_ts_ns]`` may fall in ``range_ns`` (half-open)."""
    return min_ts_ns < range_ns[1] and max_ts_ns >= range_ns[0]


def in_live_part(
    batches: Iterable[WindowBatch], *, sealed_through_ns: int, range_ns: tuple[int, int]
) -> int:
    """Late batches among the live part's ``batches`` (the window's, less the snapshot's)."""
    return sum(
        1
        for b in batches
        if b.accepted_ns >= sealed_through_ns and overlaps(b.min_ts_ns, b.max_ts_ns, range_ns)
    )


class LateBatches:
    def __init__(
        self,
        snapshots: SnapshotSource,
        *,
        max_cached_batches: int = MAX_CACHED_BATCHES,
        max_hours_read: int = MAX_HOURS_READ_PER_QUERY,
        wait_s: float = 1.0,
    ) -> None:
        self._snapshots = snapshots
        self._max_cached = max_cached_batches
        self._max_hours_read = max_hours_read
        self._wait_s = wait_s
        self._spans: OrderedDict[tuple[str, LedgerHour], tuple[np.ndarray, np.ndarray]] = (
            OrderedDict()
        )
        self._cached = 0
        # Hours asked for and not read yet (with the snapshot that names their batches).
        self._wanted: dict[tuple[str, LedgerHour], Snapshot] = {}
        self._reader = BackgroundRead("late-batches")

    async def committed(
        self, snapshot: Snapshot | None, *, sealed_through_ns: int, range_ns: tuple[int, int]
    ) -> int:
        """Late batches the snapshot includes (as above)."""
        if snapshot is None:
            return 0
        # Hours before the seal's own hour hold only batches accepted before the seal
        # ("YYYY-MM-DDTHH" sorts as time).
        first = keys.UtcHour.from_unix_ns(max(0, sealed_through_ns)).iso
        after = [
            (hour, snapshot.ledger_hours[hour])
            for hour in sorted(h for h in snapshot.ledger_hours if h >= first)
            if snapshot.ledger_hours[hour].batches
        ]
        missing = [item for item in after if item not in self._spans]
        for item in missing[: self._max_hours_read]:
            if len(self._wanted) < MAX_WANTED_HOURS:  # beyond: asked for by a later answer
                self._wanted.setdefault(item, snapshot)
        if self._wanted:
            await self._reader.wait(self._read_wanted, self._wait_s)
        low, high = range_ns
        count = 0
        for item in after:
            found = self._spans.get(item)
            if found is None:
                count += item[1].batches  # not read: every batch may overlap
                continue
            self._spans.move_to_end(item)
            mins, maxs = found
            count += int(np.count_nonzero((mins < high) & (maxs >= low)))
        return count

    async def _read_wanted(self) -> None:
        """Read the hours asked for, oldest first, one at a time, until none is left."""
        while self._wanted:
            item = min(self._wanted, key=lambda wanted: wanted[0])
            snapshot = self._wanted.pop(item)
            if item in self._spans:
                continue
            try:
                await self._read(snapshot, *item)
            except StoreError as exc:  # counted whole meanwhile; a later answer asks again
                log.warning("late_batches_store_unavailable", hour=item[0], error=str(exc))

    async def close(self) -> None:
        """Stop the reader (the process is stopping)."""
        await self._reader.close()

    async def _read(self, snapshot: Snapshot, hour: str, totals: LedgerHour) -> None:
        """Cache the hour's spans; nothing when its catalog cannot be read (it counts
        whole)."""
        included = await self._snapshots.ledger_ids(snapshot, hour)
        if len(included) != totals.batches:  # not the ledger the totals describe
            log.warning("late_batches_ledger_mismatch", hour=hour, rows=len(included))
            return
        try:
            found = await read_hour_spans(
                self._snapshots.store, keys.UtcHour.parse_iso(hour), included
            )
        except IndexFileError as exc:
            log.warning("late_batches_catalog_unreadable", hour=hour, error=str(exc))
            return
        size = len(found[0])
        if size <= self._max_cached:
            self._spans[(hour, totals)] = found
            self._cached += size
            while self._cached > self._max_cached:
                _, (dropped, _maxs) = self._spans.popitem(last=False)
                self._cached -= len(dropped)
