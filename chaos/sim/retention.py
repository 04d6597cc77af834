"""Raw retention in the simulation (PROTOCOL §4.1): a simulated rollup, and the checks.

`SimRollup` stands in for the rollup job: every ``interval_s`` it reads the catalog's
accepted rows (`chaos.catalog_rows.read_hour`: the simulation is small) and commits, with
`rollup.table.commit.commit` under an `OwnerLease`, one snapshot whose ledger files include
the batches it has seen for at least their seeded lag (``U(0, lag_s)`` from when it first saw them). A seeded share of
batches (``withhold_rate``) is never included: their hour's ledger never matches its
catalog, so raw retention must never retire it.

`RetentionRule` holds the checks `chaos.sim.checks.WatchedStore` applies as operations
land: at the moment a raw blob is deleted, to the records that exist then, a blob may be
deleted only when no quarantine record names it (submitted or accepted hash) and every
accepted manifest naming it has its batch in the ledger of the latest rollup snapshot
and an accepted hour that ended at least ``raw_s`` earlier (sim clock); and each write of
``gc/v1/raw-retention.json`` retires only hours that ended at least ``raw_s`` earlier
(the deletion procedure alone takes long enough that the first check would miss that).

`retention_problems` checks the settled store: no open ``missing-blob`` or
``raw-retention-mismatch`` problem, and each accepted manifest whose blob is gone is
in the ledger and in a retired hour (`retired_manifest_ids`).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

from chaos.catalog_rows import read_hour
from index.catalog import list_all_files
from index.rows import IndexFileError
from protocol import keys, records
from protocol.clock import Clock
from reconciler.gc.log import read_gc_log
from reconciler.gc.raw_retention import read_state
from rollup.table.commit import LoadedSnapshot, commit, load_latest
from rollup.table.ledger import LedgerRow, read_ledger, write_ledger_files
from rollup.table.manifest import RollupManifestError
from rollup.table.owner import OwnerLease, OwnerLost
from store.base import ObjectStore
from store.errors import StoreError

NS_PER_HOUR = 3600 * keys.NS_PER_S
ROLLUP_OWNER = "sim-rollup"


def hour_end_ns(hour: keys.UtcHour) -> int:
    return hour.start_ns + NS_PER_HOUR


async def ledger_manifest_ids(store: ObjectStore) -> set[str]:
    """The manifest_ids the latest snapshot's ledger includes (empty before one)."""
    loaded = await load_latest(store)
    if loaded is None:
        return set()
    table = await read_ledger(store, loaded.snapshot)
    return set(table.column("manifest_id").to_pylist())


async def retired_manifest_ids(store: ObjectStore) -> set[str]:
    """Of the ledger's batches, those in hours raw retention retired."""
    state, _etag = await read_state(store)
    loaded = await load_latest(store)
    if state is None or loaded is None:
        return set()
    before = keys.UtcHour.parse_iso(state.retired_before)
    table = await read_ledger(store, loaded.snapshot)
    return {
        manifest_id
        for manifest_id, hour in zip(
            table.column("manifest_id").to_pylist(),
            table.column("accepted_hour").to_pylist(),
            strict=True,
        )
        if keys.UtcHour.parse_iso(hour) < before
    }


class SimRollup:
    """The simulated rollup job (see the module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        clock: Clock,
        rng: random.Random,
        interval_s: float,
        lag_s: float,
        withhold_rate: float,
        stats: Counter[str],
    ) -> None:
        self._store = store
        self._clock = clock
        self._rng = rng
        self._interval_s = interval_s
        self._lag_s = lag_s
        self._withhold_rate = withhold_rate
        self._stats = stats
        self._first_seen: dict[str, tuple[int, float]] = {}  # manifest_id -> (ns, lag_s)
        self._withheld: set[str] = set()
        self.included: set[str] = set()

    async def run(self, stop: asyncio.Event) -> None:
        owner = await OwnerLease.acquire(
            self._store, ROLLUP_OWNER, 10 * 24 * 3600.0, self._clock, rng=self._rng
        )
        while not stop.is_set():
            try:
                await self.run_once(owner)
            except (StoreError, IndexFileError, RollupManifestError, OwnerLost) as exc:
                self._stats[f"rollup_failed_{type(exc).__name__}"] += 1
            try:
                await asyncio.wait_for(stop.wait(), self._interval_s)
            except TimeoutError:
                pass

    async def run_once(self, owner: OwnerLease) -> LoadedSnapshot | None:
        """Include what is due; the new snapshot, or None when nothing was."""
        due = [row async for row in self._due_rows()]
        if not due:
            return None
        changes = await write_ledger_files(
            self._store,
            due,
            new_id=lambda: str(uuid.UUID(int=self._rng.getrandbits(128))),
            if_none_match=True,
        )
        base = await load_latest(self._store)
        loaded = await commit(
            self._store, base=base, changes=changes, owner=owner, clock=self._clock, rng=self._rng
        )
        self.included.update(row.manifest_id for row in due)
        self._stats["rollup_commits"] += 1
        self._stats["rollup_batches_included"] += len(due)
        return loaded

    async def _due_rows(self) -> AsyncIterator[LedgerRow]:
        now_ns = self._clock.now_ns()
        hours = sorted(
            {
                keys.parse_index_catalog_key(info.key)[0]
                async for info in list_all_files(self._store)
            }
        )
        for hour in hours:
            for row in (await read_hour(self._store, hour)).accepted():
                manifest_id = row.manifest_id
                if manifest_id in self.included or manifest_id in self._withheld:
                    continue
                if manifest_id not in self._first_seen:
                    if self._rng.random() < self._withhold_rate:
                        self._withheld.add(manifest_id)
                        self._stats["rollup_batches_withheld"] += 1
                        continue
                    self._first_seen[manifest_id] = (now_ns, self._rng.uniform(0, self._lag_s))
                seen_ns, lag_s = self._first_seen[manifest_id]
                if now_ns - seen_ns >= lag_s * keys.NS_PER_S:
                    yield LedgerRow(manifest_id, row.frame_sha256, row.record_count or 0, hour.iso)


class RetentionRule:
    """When raw retention may delete a blob (see the module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        raw_s: float,
        now_ns: Callable[[], int],
        ledger_ids: Callable[[], Awaitable[set[str]]] | None = None,
    ) -> None:
        """``ledger_ids``: the latest ledger's manifest_ids (default: read whole each time,
        `ledger_manifest_ids`; a long world passes a cached reader)."""
        self._store = store
        self._raw_ns = int(raw_s * keys.NS_PER_S)
        self._now_ns = now_ns
        self._ledger_ids = ledger_ids or (lambda: ledger_manifest_ids(store))

    async def why_not(
        self, raw_key: str, manifests: Iterable[records.AcceptedManifest]
    ) -> str | None:
        """Why deleting the raw object ``raw_key`` (a frame blob, or a bundle: deleted only
        whole, PROTOCOL §3.10), which ``manifests`` name, now breaks raw retention's rule,
        or None if it may go."""
        now_ns = self._now_ns()
        ledger = await self._ledger_ids()
        for manifest in manifests:
            if manifest.identity.manifest_id not in ledger:
                return f"{manifest.manifest_key} is not in the latest rollup ledger"
            ended_ns = hour_end_ns(manifest.accepted_hour)
            if now_ns - ended_ns < self._raw_ns - 1_000:  # float days → ns rounding
                return (
                    f"{manifest.manifest_key}'s hour {manifest.accepted_hour.iso} ended only "
                    f"{(now_ns - ended_ns) / 1e9:.3f}s ago (raw retention {self._raw_ns / 1e9}s)"
                )
        return None

    def why_not_retire(self, body: bytes) -> str | None:
        """Why the raw-retention state ``body``, written now, retires an hour too early
        (one that did not end ``raw_s`` ago), or None."""
        state = records.RawRetention.from_json(body)
        last_end_ns = keys.UtcHour.parse_iso(state.retired_before).start_ns
        if self._now_ns() - last_end_ns < self._raw_ns - 1_000:
            return (
                f"raw retention retired hours before {state.retired_before}, which ended "
                f"{(self._now_ns() - last_end_ns) / 1e9:.3f}s ago (raw retention "
                f"{self._raw_ns / 1e9}s)"
            )
        return None


async def retention_problems(store: ObjectStore) -> list[str]:
    """Problems the final audit must not report once raw retention deleted blobs."""
    problems = []
    for kind in ("missing-blob", "raw-retention-mismatch"):
        prefix = f"{keys.RECONCILER_PROBLEMS_PREFIX}{kind}/"
        async for info in store.list(prefix):
            record = records.ProblemRecord.from_json((await store.get(info.key))[0])
            problems.append(f"the final audit reports {kind}: {record.subject_key} {record.detail}")
    return problems


async def gc_deletions_by_reason(store: ObjectStore) -> Counter[str]:
    """GC log entries by ``reason`` (``orphan``, ``raw-retention``)."""
    return Counter(entry.reason for entry in await read_gc_log(store))
