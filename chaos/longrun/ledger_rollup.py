"""The long simulation's rollup stand-in (`IndexRollup`) and a cached read of the rollup
ledger for raw retention's deletion rule (`LedgerIds`).

`IndexRollup` does what the rollup job does for the ledger, and nothing for the tables:
every ``interval_s`` it lists the rollup work markers (PROTOCOL §3.7), reads each hour
they name with `index.catalog_tables.read_hour_table` — the index's one definition of
which row of a key counts, so the stand-in follows that rule wherever it goes — and
includes every accepted batch of those hours it has not included yet (its
``manifest_id``, from `index.catalog_tables.manifest_ids`, with the counting row's hash
and record count), in one commit (`rollup.table.commit.commit`, under an `OwnerLease`).
Only after the commit does it delete the markers it listed: a marker goes once a committed
pointer's ledger includes its file's rows. Its cost per run grows with the hours that
changed, not with history, so a world of days stays fast.

A batch it included whose counting row later names another hash is counted
(``rollup_superseded``), never silently re-included: in these worlds nothing supersedes.

`LedgerIds` is the manifest_ids the latest snapshot's ledger includes, re-read only when
the pointer's ETag moved and then only the ledger files it has not read: the long run
checks raw retention's rule (`chaos.sim.retention.RetentionRule`) at every one of
thousands of deletions, and reading the whole ledger each time would grow with history.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc

from index.catalog_tables import HourTable, manifest_ids, read_hour_table
from index.rows import IndexFileError
from protocol import keys
from protocol.clock import Clock
from rollup.table.commit import commit, load_latest, read_pointer
from rollup.table.ledger import LedgerRow, decode_ledger, write_ledger_files
from rollup.table.manifest import RollupManifestError
from rollup.table.owner import OwnerLease, OwnerLost
from store.base import ObjectStore
from store.errors import NotFound, StoreError

ROLLUP_OWNER = "sim-index-rollup"
HOUR_COLUMNS = [
    "key",
    "kind",
    "frame_sha256",
    "record_count",
    "agent_id",
    "boot_id",
    "seq_start",
    "seq_end",
]


class IndexRollup:
    """The rollup stand-in (see the module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        clock: Clock,
        rng: random.Random,
        interval_s: float,
        stats: Counter[str],
    ) -> None:
        self._store = store
        self._clock = clock
        self._rng = rng
        self._interval_s = interval_s
        self._stats = stats
        self.included: dict[str, str] = {}
        """manifest_id -> the frame_sha256 it was included with."""
        self.failures: list[str] = []
        """The first few runs that failed (the next run starts over), and why."""

    async def run(self, stop: asyncio.Event) -> None:
        owner = await OwnerLease.acquire(
            self._store, ROLLUP_OWNER, 10 * 24 * 3600.0, self._clock, rng=self._rng
        )
        while not stop.is_set():
            try:
                await self.run_once(owner)
            except (StoreError, IndexFileError, RollupManifestError, OwnerLost) as exc:
                self._stats[f"rollup_failed_{type(exc).__name__}"] += 1
                if len(self.failures) < 10:
                    self.failures.append(f"t={self._clock.monotonic():.0f}s {exc}")
            try:
                await asyncio.wait_for(stop.wait(), self._interval_s)
            except TimeoutError:
                pass

    async def run_once(self, owner: OwnerLease) -> int:
        """Include what the marked hours hold and is not included yet; the batches
        included. The markers listed are deleted after the commit (or at once when
        nothing was new)."""
        markers = [info.key async for info in self._store.list(keys.ROLLUP_WORK_PREFIX)]
        hours = sorted(
            {
                keys.parse_index_catalog_key(keys.parse_rollup_work_marker_key(marker))[0]
                for marker in markers
            }
        )
        due: list[LedgerRow] = []
        for hour in hours:
            due += self._new_rows(await read_hour_table(self._store, hour, HOUR_COLUMNS))
        if due:
            changes = await write_ledger_files(
                self._store,
                due,
                new_id=lambda: str(uuid.UUID(int=self._rng.getrandbits(128))),
                if_none_match=True,
            )
            base = await load_latest(self._store)
            await commit(
                self._store,
                base=base,
                changes=changes,
                owner=owner,
                clock=self._clock,
                rng=self._rng,
            )
            self.included.update((row.manifest_id, row.frame_sha256) for row in due)
            self._stats["rollup_commits"] += 1
            self._stats["rollup_batches_included"] += len(due)
        for marker in markers:  # their files' rows are in the committed ledger now
            try:
                await self._store.delete(marker)
            except StoreError:
                self._stats["rollup_marker_delete_failed"] += 1  # read again next run
        self._stats["rollup_markers_consumed"] += len(markers)
        return len(due)

    def _new_rows(self, hour_table: HourTable) -> list[LedgerRow]:
        accepted = hour_table.accepted()
        if accepted.num_rows == 0:
            return []
        ids = manifest_ids(accepted).to_pylist()
        shas = accepted.column("frame_sha256").to_pylist()
        counts = pc.fill_null(accepted.column("record_count"), 0).to_pylist()
        rows = []
        for manifest_id, sha, count in zip(ids, shas, counts, strict=True):
            held = self.included.get(manifest_id)
            if held is None:
                rows.append(LedgerRow(manifest_id, sha, count, hour_table.hour.iso))
            elif held != sha:
                self._stats["rollup_superseded"] += 1
        return rows


class LedgerIds:
    """The manifest_ids of the latest snapshot's ledger, cached by the pointer's ETag
    (see the module docstring)."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self._etag: str | None = None
        self._files: set[str] = set()
        self._ids: set[str] = set()

    async def __call__(self) -> set[str]:
        pointer = await read_pointer(self._store)
        if pointer is None:
            return set()
        if pointer[1] == self._etag:
            return self._ids
        loaded = await load_latest(self._store)
        if loaded is None:
            return set()
        files = set(loaded.snapshot.ledger_files)
        if not self._files <= files:  # a file left the ledger: read it all again
            self._files, self._ids = set(), set()
        for key in sorted(files - self._files):
            try:
                body, _etag = await self._store.get(key)
            except NotFound:
                raise RollupManifestError(
                    f"ledger file {key} of the latest snapshot is gone"
                ) from None
            table: pa.Table = decode_ledger(body, key=key)
            self._ids.update(table.column("manifest_id").to_pylist())
            self._files.add(key)
        self._etag = loaded.pointer_etag
        return self._ids
