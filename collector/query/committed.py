"""The committed part of a live query: a rollup snapshot read like ``lm-rollup query``.

`SnapshotSource` answers "which snapshot": the latest (the pointer is read again at most
every ``refresh_interval_s``; a snapshot manifest is read once per version and cached),
or a ``version`` / ``as_of`` time: a `rollup.read.chain_index.ChainIndex` remembers each
version's manifest key and time, so a request walks only the versions no earlier one
did, and never more than ``max_travel_versions`` back from the latest (400
``travel_too_far``); a version below the oldest the chain reaches is 404 without a
request. Time travel starts from the latest as cached (a ``version`` newer than it reads
the pointer again). A few whole snapshots are cached too. It also says
which of the live window's batches a snapshot includes (its ledger, `rollup.table.ledger`): the
live part leaves out exactly those ``manifest_id``\\s. A ledger hour's ``manifest_id``
column is cached per (version, hour) as an Arrow column, bounded by bytes
(`MAX_CACHED_LEDGER_BYTES`), and the window's ids are looked up in it column-wise: an hour
of millions of batches is never a Python set (PROTOCOL §3.9).

`read_committed` reads one table of a snapshot with the query's filters (metric, agent
on ``points``, the time range; labels after reading) through `rollup.read.reader`, file by
file, refusing past ``max_rows``, with the snapshot's deletes masked (tombstones,
PROTOCOL §4.1). Blocking: run it in a thread.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from protocol import keys
from rollup.read import reader
from rollup.read.chain_index import ChainIndex
from rollup.table import schemas
from rollup.table.commit import VersionNotFound, read_pointer, read_snapshot
from rollup.table.ledger import read_ledger
from rollup.table.manifest import Snapshot
from store.base import ObjectStore
from store.errors import NotFound

from .api import LiveQuery, ns_to_datetime
from .rows import TooManyRows, filter_labels

MAX_CACHED_SNAPSHOTS = 8
MAX_CACHED_LEDGER_BYTES = 256 * 1024 * 1024


class SnapshotSource:
    def __init__(
        self,
        store: ObjectStore,
        *,
        refresh_interval_s: float,
        max_travel_versions: int,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._chain = ChainIndex(max_back=max_travel_versions)
        self._refresh_s = refresh_interval_s
        self._monotonic = monotonic
        self._latest: Snapshot | None = None
        self._checked_at: float | None = None
        self._by_version: OrderedDict[int, Snapshot] = OrderedDict()
        self._ledger: OrderedDict[tuple[int, str], pa.Array] = OrderedDict()
        self._ledger_bytes = 0

    @property
    def store(self) -> ObjectStore:
        return self._store

    async def latest(self, *, refresh: bool = False) -> Snapshot | None:
        """The latest committed snapshot, at most ``refresh_interval_s`` old (``refresh``:
        read the pointer now)."""
        now = self._monotonic()
        fresh = self._checked_at is not None and now - self._checked_at < self._refresh_s
        if fresh and not refresh:
            return self._latest
        pointer = await read_pointer(self._store)
        if pointer is None:
            self._latest = None
        elif self._latest is None or self._latest.version != pointer[0].version:
            cached = self._by_version.get(pointer[0].version)
            self._latest = cached or await read_snapshot(self._store, pointer[0].manifest_key)
            self._keep(self._latest)
        self._checked_at = now
        return self._latest

    async def for_query(self, query: LiveQuery) -> Snapshot | None:
        """The snapshot a query's committed part reads. `VersionNotFound` for a version
        or time with no snapshot; `TravelTooFar` beyond ``max_travel_versions``."""
        if query.version is None and query.as_of is None:
            return await self.latest()
        if query.version is not None and query.version in self._by_version:
            return self._by_version[query.version]
        latest = await self.latest()
        if query.version is not None and (latest is None or query.version > latest.version):
            latest = await self.latest(refresh=True)  # committed since the last look?
        if latest is None:
            raise VersionNotFound("nothing has been committed yet")
        for _ in range(2):  # again once when vacuum removed a cached version's manifest
            async with self._chain.lock:
                if query.version is not None:
                    found = await self._chain.version(self._store, latest, query.version)
                else:
                    assert query.as_of is not None
                    found = await self._chain.as_of(self._store, latest, query.as_of)
            snapshot = found.snapshot or self._by_version.get(found.link.version)
            if snapshot is None or snapshot.manifest_key != found.link.manifest_key:
                try:
                    snapshot = await read_snapshot(self._store, found.link.manifest_key)
                except NotFound:
                    self._chain.forget_through(found.link.version)
                    continue
            self._keep(snapshot)
            return snapshot
        raise VersionNotFound(f"version {found.link.version} was vacuumed")

    def _keep(self, snapshot: Snapshot) -> None:
        self._by_version[snapshot.version] = snapshot
        self._by_version.move_to_end(snapshot.version)
        while len(self._by_version) > MAX_CACHED_SNAPSHOTS:
            self._by_version.popitem(last=False)

    async def included(
        self, snapshot: Snapshot | None, hours: set[str], candidates: set[str]
    ) -> set[str]:
        """Which of ``candidates`` (``manifest_id``\\s of batches accepted in ``hours``)
        the snapshot includes."""
        if snapshot is None or not candidates:
            return set()
        wanted = {h for h in hours if h in snapshot.ledger_hours}
        missing = {h for h in wanted if (snapshot.version, h) not in self._ledger}
        if missing:
            read = await read_ledger(self._store, snapshot, missing)
            hour_of = read.column("accepted_hour")
            for hour in missing:
                ids = read.filter(pc.equal(hour_of, hour)).column("manifest_id").combine_chunks()
                self._remember((snapshot.version, hour), ids)
        values = pa.array(sorted(candidates), pa.string())
        result: set[str] = set()
        for hour in wanted:
            key = (snapshot.version, hour)
            ids = self._ledger.get(key)
            if ids is None:  # evicted by a larger hour read in the same call: read again
                read = await read_ledger(self._store, snapshot, {hour})
                ids = read.column("manifest_id").combine_chunks()
            else:
                self._ledger.move_to_end(key)
            found = pc.is_in(values, value_set=ids)
            result.update(values.filter(found).to_pylist())
        return result

    async def ledger_ids(self, snapshot: Snapshot, hour: str) -> pa.Array:
        """The ``manifest_id`` column of the snapshot's ledger ``hour`` (cached as above)."""
        key = (snapshot.version, hour)
        ids = self._ledger.get(key)
        if ids is not None:
            self._ledger.move_to_end(key)
            return ids
        read = await read_ledger(self._store, snapshot, {hour})
        ids = read.column("manifest_id").combine_chunks()
        self._remember(key, ids)
        return ids

    def _remember(self, key: tuple[int, str], ids: pa.Array) -> None:
        self._ledger[key] = ids
        self._ledger_bytes += ids.nbytes
        while self._ledger_bytes > MAX_CACHED_LEDGER_BYTES and len(self._ledger) > 1:
            _old, dropped = self._ledger.popitem(last=False)
            self._ledger_bytes -= dropped.nbytes


def read_committed(
    snapshot: Snapshot | None,
    table: str,
    query: LiveQuery,
    filesystem: pafs.FileSystem,
    root: str,
    *,
    max_rows: int,
    range_ns: tuple[int, int] | None = None,
    series: Sequence[str] | None = None,
    masked: bool = True,
) -> pa.Table:
    """Rows of ``table`` in ``snapshot`` matching ``query`` (``range_ns``: another range
    on the table's time column; ``series``: only these; ``masked=False``: deleted rows
    too). `TooManyRows` past ``max_rows``."""
    schema = schemas.table_schema(table)
    if snapshot is None:
        return schema.empty_table()
    low, high = range_ns if range_ns is not None else (query.from_ns, query.to_ns)
    start, end = ns_to_datetime(-((-low) // 1000) * 1000), ns_to_datetime(-((-high) // 1000) * 1000)
    where = [reader.Predicate("metric", "=", query.metric)]
    if query.agent is not None and "agent_id" in schema.names:
        where.append(reader.Predicate("agent_id", "=", query.agent))
    files = reader.plan_files(snapshot, table, where=where, start=start, end=end)
    parts: list[pa.Table] = []
    total = 0
    for data_file in files:
        part = reader.read_files(
            [data_file],
            table,
            filesystem,
            root,
            where=where,
            start=start,
            end=end,
            # Deleted rows never come back (PROTOCOL §4.1).
            tombstones=snapshot.tombstones if masked else (),
        )
        part = filter_labels(part, query.labels)
        if series is not None:
            part = part.filter(pc.is_in(part.column("series"), pa.array(list(series), pa.string())))
        total += part.num_rows
        if total > max_rows:
            raise TooManyRows(total)
        parts.append(part)
    return pa.concat_tables(parts) if parts else schema.empty_table()


def accepted_hour(accepted_ns: int) -> str:
    return keys.UtcHour.from_unix_ns(accepted_ns).iso
