"""Reading the collectors' log segments (PROTOCOL §3.7) from a durable position.

Segment names start with their cut time (the writer's clock when it cut the segment;
older segments, their oldest row's time), so listing order is time order and a reader
resumes with StartAfter: `new_segments` lists from ``position - lookback`` and skips the
names it already consumed inside that window (``seen``). The lookback covers segments
that appear late: clock skew between collectors plus the create's budget
(``store.max_clock_skew_s`` + ``ingest.index_put_budget_s``, checked when settings load:
`config.settings.Settings.log_lookback_floor_s`). A segment that appears later still is the full audit's to find (its records
are listed from ``accepted/v1/`` and ``quarantine/v1/``); a blob row lost that way is
found by the GC's listing merge.

`LogPosition` is what a consumer keeps in its checkpoint: the newest first-time it has
consumed (by name time) and the names consumed within the lookback window before it. Its size is
bounded by the segments written in one lookback window, and it forgets names in time
order (a heap by name time), so consuming a segment costs O(log n), never a pass over
every name it remembers (PROTOCOL §3.9).
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pyarrow as pa

from protocol import keys
from store.base import ObjectInfo, ObjectStore

from .row_checks import decode
from .rows import IndexRow, read_table

NS_PER_S = 1_000_000_000


@dataclass
class LogPosition:
    """How far a consumer has read: ``through_ns`` (the newest consumed segment's first
    time) and the names consumed at or after ``through_ns - lookback``."""

    through_ns: int = 0
    seen: set[str] = field(default_factory=set)
    _by_time: list[tuple[int, str]] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_time = [(keys.parse_index_log_segment_key(key).time_ns, key) for key in self.seen]
        heapq.heapify(self._by_time)

    def consumed(self, key: str, time_ns: int, lookback_ns: int) -> None:
        if key not in self.seen:
            self.seen.add(key)
            heapq.heappush(self._by_time, (time_ns, key))
        if time_ns > self.through_ns:
            self.through_ns = time_ns
            self._forget_before(self.through_ns - lookback_ns)

    def _forget_before(self, horizon_ns: int) -> None:
        while self._by_time and self._by_time[0][0] < horizon_ns:
            _time, key = heapq.heappop(self._by_time)
            self.seen.discard(key)

    def to_json_obj(self) -> dict[str, object]:
        return {"through_ns": self.through_ns, "seen": sorted(self.seen)}

    @classmethod
    def from_json_obj(cls, data: dict[str, object]) -> LogPosition:
        through = data.get("through_ns", 0)
        seen = data.get("seen", [])
        if not isinstance(through, int) or not isinstance(seen, list):
            raise ValueError("log position needs int through_ns and a list of names")
        return cls(through, {str(name) for name in seen})


async def new_segments(
    store: ObjectStore, position: LogPosition, *, lookback_s: float, until_ns: int | None = None
) -> AsyncIterator[tuple[ObjectInfo, keys.LogSegmentName]]:
    """Segments not consumed yet, oldest first: listed from ``through - lookback``
    (never from the start of history), minus the names in ``position.seen``. With
    ``until_ns``, stops before the first segment whose name time is later."""
    start_ns = position.through_ns - int(lookback_s * NS_PER_S) if position.through_ns else 0
    async for info in store.list(
        keys.INDEX_LOG_PREFIX, start_after=keys.index_log_start_after(start_ns)
    ):
        try:
            name = keys.parse_index_log_segment_key(info.key)
        except keys.KeyFormatError:
            continue  # not a segment (an operator's file): never ours to read
        if until_ns is not None and name.time_ns > until_ns:
            return
        if info.key in position.seen:
            continue
        yield info, name


async def read_segment(store: ObjectStore, key: str) -> list[IndexRow]:
    """A segment's rows. `store.errors.NotFound` when it was deleted, `IndexFileError`
    when it does not decode."""
    body, _etag = await store.get(key)
    return decode(body, source=key)


async def read_segment_table(store: ObjectStore, key: str) -> pa.Table:
    """A segment as a `index.rows.FILE_SCHEMA` table, rows not yet checked (the steady
    pass checks them column-wise), ``source`` set to the segment's key. Raises as
    `read_segment`."""
    body, _etag = await store.get(key)
    table = read_table(body, source=key)
    index = table.schema.get_field_index("source")
    return table.set_column(
        index, table.schema.field("source"), pa.repeat(pa.scalar(key, pa.string()), table.num_rows)
    )
