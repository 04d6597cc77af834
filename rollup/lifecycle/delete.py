"""``lm-rollup delete``: commit a tombstone (PROTOCOL §4.1) in a few small requests.

`commit_delete`:
1. the request record: ``rollup/v1/tombstones/<id>.json`` created with If-None-Match
   (one PUT; found with the same bytes, it is this request retried);
2. on the latest snapshot (2 GETs, read once before step 1 to check there is one),
   commit a snapshot that adds the tombstone (one PUT of the manifest, one conditional
   PUT of the pointer: `rollup.table.commit.commit`, here without the owner lease, see there
   why that is safe). A rollup run in flight then
   loses its pointer CAS and re-plans on the snapshot with the tombstone, so its rows are
   masked and its rewritten hours drop them;
3. on `CommitConflict` (another commit moved the pointer), repeat 2 on the new latest.
   Repeating is safe: the tombstone's id is checked against the new base first, so a
   commit whose answer was lost is found rather than made twice. At most `MAX_ATTEMPTS`,
   with jittered delays.

The cost does not depend on the data size: 2 GETs and 3 PUTs (and a few more per lost race). No
data file is touched; rows leave the files when compaction rewrites them.

`preview` (``--dry-run``) reads what the tombstone would mask in each table, as the
snapshot's readers see it now (rows earlier deletes already mask are not counted again).
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.fs as pafs
import structlog

from protocol.clock import Clock
from rollup.read import reader
from rollup.table import schemas
from rollup.table.commit import CommitConflict, LoadedSnapshot, commit, load_latest
from rollup.table.manifest import Changes, format_created_at
from rollup.table.tombstones import Tombstone, TombstoneError, matches
from store.base import ObjectStore
from store.errors import PreconditionFailed
from store.retry import Backoff
from store.time import store_clock

log = structlog.get_logger(__name__)

MAX_ATTEMPTS = 8
_BACKOFF = Backoff(attempts=MAX_ATTEMPTS, base_s=0.05, cap_s=2.0)


class NothingToDelete(LookupError):
    """There is no committed snapshot yet: no row exists that a delete could mask."""


@dataclass(frozen=True, slots=True)
class DeleteRequest:
    """What the operator asked for (``lm-rollup delete`` arguments). ``end`` None: now."""

    metric: str
    reason: str
    requested_by: str
    labels: tuple[tuple[str, str], ...] = ()
    agent_id: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    tables: tuple[str, ...] | None = None

    def tombstone(self, *, now_ns: int, tombstone_id: str | None = None) -> Tombstone:
        """The tombstone for this request at store time ``now_ns`` (`TombstoneError`)."""
        now = datetime.fromtimestamp(now_ns / 1e9, tz=UTC)
        tables = self.tables
        if tables is None:  # by default every table that can express the delete
            tables = ("points",) if self.agent_id is not None else tuple(schemas.DELETABLE_TABLES)
        return Tombstone(
            id=tombstone_id or str(uuid.uuid4()),
            metric=self.metric,
            labels=tuple(sorted(self.labels)),
            agent_id=self.agent_id,
            start=self.start,
            end=self.end if self.end is not None else now,
            tables=tables,
            requested_by=self.requested_by,
            reason=self.reason,
            created_at=format_created_at(now_ns),
        )


async def commit_delete(
    store: ObjectStore,
    tombstone: Tombstone,
    *,
    clock: Clock,
    rng: random.Random | None = None,
) -> LoadedSnapshot:
    """Write ``tombstone``'s record and commit it; the committed snapshot. Raises
    `NothingToDelete` before the first rollup commit, `CommitConflict` when every attempt
    lost the pointer race, store errors."""
    base = await load_latest(store)
    if base is None:
        raise NothingToDelete("no rollup snapshot is committed yet: there is nothing to delete")
    body = json.dumps(tombstone.file_json(), separators=(",", ":"), ensure_ascii=False).encode()
    try:
        await store.put(tombstone.key, body, if_none_match=True)
    except PreconditionFailed:
        stored, _ = await store.get(tombstone.key)
        if stored != body:  # the id names another request: never overwrite a record
            raise TombstoneError(f"{tombstone.key} exists with other content") from None
        # else: this request was written before (a retried command): go on
    delays = _BACKOFF.delays(rng or random.Random())
    while True:
        if any(t.id == tombstone.id for t in base.snapshot.tombstones):
            return base  # an earlier attempt whose answer was lost did land
        try:
            committed = await commit(
                store,
                base=base,
                changes=Changes(added_tombstones=(tombstone,)),
                owner=None,
                clock=clock,
            )
        except CommitConflict:
            delay = next(delays, None)
            if delay is None:
                raise
            await clock.sleep(delay)
            base = await load_latest(store)  # the newer snapshot that won
            assert base is not None  # the pointer is never removed once created
            continue
        log.info(
            "rollup_delete_committed",
            tombstone=tombstone.id,
            version=committed.snapshot.version,
            matcher=tombstone.describe(),
        )
        return committed


async def delete(
    store: ObjectStore, request: DeleteRequest, *, clock: Clock
) -> tuple[Tombstone, LoadedSnapshot]:
    """Build the tombstone at store time and commit it (`commit_delete`)."""
    now_ns = store_clock(store, clock).now_ns()
    tombstone = request.tombstone(now_ns=now_ns)
    committed = await commit_delete(store, tombstone, clock=clock)
    return tombstone, committed


async def preview(
    store: ObjectStore,
    tombstone: Tombstone,
    *,
    filesystem: pafs.FileSystem,
    root: str,
) -> dict[str, pa.Table]:
    """Per table of ``tombstone``: the rows of the latest snapshot it would mask."""
    loaded = await load_latest(store)
    if loaded is None:
        raise NothingToDelete("no rollup snapshot is committed yet: there is nothing to delete")
    result: dict[str, pa.Table] = {}
    for table in tombstone.tables:
        rows = await reader.scan(
            store,
            table,
            filesystem=filesystem,
            root=root,
            version=loaded.snapshot.version,
            where=[reader.Predicate("metric", "=", tombstone.metric)],
            start=tombstone.start,
            end=tombstone.end,
        )
        result[table] = rows.filter(matches([tombstone], table, rows))
    return result


def parse_labels(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``["k=v", ...]`` → sorted pairs; `TombstoneError` naming a malformed one."""
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise TombstoneError(f"label {item!r}: expected NAME=VALUE")
        if name in pairs:
            raise TombstoneError(f"label {name!r} given twice")
        pairs[name] = value
    return tuple(sorted(pairs.items()))
