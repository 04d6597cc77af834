"""The feature gate (PROTOCOL §3.10 "Writing"): the store's feature record
``index/v1/features.json`` and this process's place in the version registry.

`BundleGate` is what a process holds: `start` reads the feature record (a feature this
version does not implement → `UnknownFeature`: the process refuses to start, or to take
a lease) and writes the process's version entry; `refresh` — run every `HEARTBEAT_S` by
`run` — rewrites the entry and re-reads the record with a conditional GET (ETag: a 304
carries no body). ``bundles_enabled`` is what the collector's bundler consults: False
until the record says ``bundles: true``; it never goes back (a feature is never turned
off), and a refresh that fails keeps the last answer.

Requests per process: one PUT and one conditional GET per minute (`requests` counts
them), plus one DELETE of a one-shot process's entry when it stops cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable

import structlog

from protocol import keys
from protocol.clock import Clock
from protocol.records import FeatureRecord, RecordError
from store.base import ObjectStore, get_if_changed
from store.errors import NotFound, StoreError
from store.time import store_clock

from .versions import COLLECTOR_ROLES, HEARTBEAT_S, write_entry

log = structlog.get_logger(__name__)

IMPLEMENTED_FEATURES = frozenset({"bundles"})
"""The features this version implements; any other a feature record turns on stops it."""


class UnknownFeature(Exception):
    """The feature record turns on a feature this version does not implement: the process
    must not start (nor take a lease). No downgrade below a feature (PROTOCOL §3.10)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        super().__init__(
            f"the store's feature record {keys.INDEX_FEATURES_KEY} turns on "
            f"{', '.join(repr(n) for n in names)}, which this version does not implement "
            f"(it implements {', '.join(sorted(IMPLEMENTED_FEATURES))}): run a version that "
            "does; a feature is never turned off"
        )


class FeatureRecordError(Exception):
    """``index/v1/features.json`` exists but is not a feature record: an operator must look
    (a process must not guess which features are on)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"unreadable feature record {keys.INDEX_FEATURES_KEY}: {detail}")


def unimplemented(record: FeatureRecord | None) -> list[str]:
    """The features ``record`` turns on that this version does not implement."""
    if record is None:
        return []
    return sorted(n for n, on in record.features().items() if on and n not in IMPLEMENTED_FEATURES)


class FeatureReader:
    """The feature record, re-read with a conditional GET on the last ETag seen."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self._etag: str | None = None
        self.record: FeatureRecord | None = None
        self.etag: str | None = None
        """The ETag of `record` (None: absent): what a writer's If-Match names."""

    async def read(self) -> FeatureRecord | None:
        """The record now (None: absent). `FeatureRecordError` when it does not parse
        (the last good one stays in `record`); store errors as they come."""
        try:
            changed = await get_if_changed(self._store, keys.INDEX_FEATURES_KEY, self._etag)
        except NotFound:
            self._etag = self.etag = None
            self.record = None
            return None
        if changed is None:
            return self.record
        body, etag = changed
        try:
            record = FeatureRecord.from_json(body)
        except RecordError as exc:
            raise FeatureRecordError(str(exc)) from None
        self._etag = self.etag = etag
        self.record = record
        return record


class BundleGate:
    """One process's feature gate and version entry (module doc)."""

    def __init__(
        self,
        store: ObjectStore,
        clock: Clock,
        *,
        role: str,
        process_id: str,
        rng: random.Random | None = None,
        on_unknown_feature: Callable[[UnknownFeature], None] | None = None,
    ) -> None:
        """``clock``: the process's clock (turned into the store's: expiries are store
        time). ``on_unknown_feature``: called when a refresh finds a feature this version
        does not implement (a long-running process's chance to stop); by default logged."""
        self._store = store
        self._clock = store_clock(store, clock)
        self.role = role
        self.key = keys.version_entry_key(role, process_id)
        self._rng = rng or random.Random()
        self._reader = FeatureReader(store)
        self._bundles = False
        self.on_unknown_feature = on_unknown_feature
        self.unknown_feature: UnknownFeature | None = None
        """What a refresh found that this version does not implement (None: nothing)."""
        self.requests: Counter[str] = Counter()
        """Store requests made, by kind (``PUT``, ``GET``, ``DELETE``)."""

    @property
    def bundles_enabled(self) -> bool:
        """Whether the store's feature record said ``bundles: true`` at the last read."""
        return self._bundles

    async def start(self) -> None:
        """Read the feature record, refuse an unknown feature, then write this process's
        entry. Raises `UnknownFeature`, `FeatureRecordError` and store errors."""
        await self._read_features()
        await self._write_entry()

    async def refresh(self) -> None:
        """Rewrite the entry, re-read the record (one PUT, one conditional GET). Raises
        `UnknownFeature`, `FeatureRecordError` and store errors; the answer is kept."""
        await self._write_entry()
        await self._read_features()

    async def run(self) -> None:
        """`refresh` every `HEARTBEAT_S` (jittered ±5 %) until cancelled. A failed refresh
        is logged and the next one tries again: a PUT of the same entry and a GET are
        safe to repeat, and the entry outlives five missed heartbeats."""
        while True:
            await self._clock.sleep(HEARTBEAT_S * self._rng.uniform(0.95, 1.05))
            try:
                await self.refresh()
            except UnknownFeature as exc:
                log.error("unknown_feature", error=str(exc), key=self.key)
                self.unknown_feature = exc
                if self.on_unknown_feature is not None:
                    self.on_unknown_feature(exc)
            except (StoreError, FeatureRecordError) as exc:
                log.warning("feature_gate_refresh_failed", error=str(exc), key=self.key)

    async def stop(self) -> None:
        """A one-shot process's entry goes when it stops cleanly; a collector's stays (its
        id is its log writer's name, which ``enable-bundles`` checks until the writer's
        segments are past retention)."""
        if self.role in COLLECTOR_ROLES:
            return
        self.requests["DELETE"] += 1
        with contextlib.suppress(StoreError):
            await self._store.delete(self.key)

    async def _read_features(self) -> None:
        self.requests["GET"] += 1
        record = await self._reader.read()
        if names := unimplemented(record):
            raise UnknownFeature(names)
        self._bundles = self._bundles or (record is not None and record.bundles)

    async def _write_entry(self) -> None:
        self.requests["PUT"] += 1
        await write_entry(self._store, self.key, self._clock)


@contextlib.asynccontextmanager
async def registered(
    store: ObjectStore,
    clock: Clock,
    *,
    role: str,
    process_id: str,
    on_unknown_feature: Callable[[UnknownFeature], None] | None = None,
    daemon: bool = False,
) -> AsyncIterator[BundleGate]:
    """A process's gate for the duration of the block: started (raising `UnknownFeature`
    before any of the block runs), refreshed every minute beside it, stopped after.
    ``daemon``: a store that does not answer at start is logged, not raised (a daemon
    waits out an outage, as before the gate); the first heartbeat reads and writes then."""
    gate = BundleGate(
        store, clock, role=role, process_id=process_id, on_unknown_feature=on_unknown_feature
    )
    try:
        await gate.start()
    except StoreError as exc:
        if not daemon:
            raise
        log.warning("feature_gate_unavailable", error=str(exc), key=gate.key)
    task = asyncio.create_task(gate.run(), name=f"feature-gate-{role}")
    try:
        yield gate
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await gate.stop()
