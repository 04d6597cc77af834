"""The version registry (PROTOCOL §3.10 "Writing"): ``index/v1/versions/<role>-<id>.json``.

Every process that parses records or raw objects — collector, query collector, reconciler,
rollup job, ``lm-rollup verify``, ``lm-chaos`` — writes its `VersionEntry` at start and
every `HEARTBEAT_S` (`index.features.BundleGate` does both), each expiring `ENTRY_TTL_S`
after it was written, in store time. ``lm-reconciler enable-bundles`` reads the registry
(`read_registry`: one LIST of the prefix, one GET per entry) before it turns bundles on.

Cost: one PUT of a few dozen bytes per process per minute; the registry's LIST and GETs
only in ``enable-bundles``. An entry overwrites its own key (the process's own): nothing
else writes it, so a plain PUT is safe. A collector's id is its index writer id
(`keys.index_writer_id`), so the enable command matches log writers to entries by name;
a one-shot process (`rollup-job`, `rollup-verify`, `chaos`, ``reconciler``) deletes its
entry when it stops cleanly, so the registry does not grow by one entry per run. Entries
left behind (a collector's, a crashed process's) are deleted by the reconciler's
housekeeping once their writers' log segments are past the retention
(`reconciler.log_retention.sweep_version_registry`).
"""

from __future__ import annotations

import importlib.metadata
import os
import secrets
import socket
from dataclasses import dataclass, field

from protocol import keys
from protocol.clock import Clock
from protocol.records import RecordError, VersionEntry
from store.base import ObjectStore
from store.errors import NotFound

READS_BUNDLES = True
"""Whether this version's processes read bundled records: the one place that declares it.
True only because every record parser of this version reads ranges (PROTOCOL §3.10
"Records", `records.AcceptedManifest.from_json(..., reads_bundles=True)`, and the readers'
range checks). It must stay True only while that holds for every role above: a process
whose record parsing cannot read a range must register with it False, and
``enable-bundles`` then refuses."""

HEARTBEAT_S = 60.0
"""How often a process rewrites its entry and re-reads the feature record."""
ENTRY_TTL_S = 300.0
"""An entry expires this long after it was written: five heartbeats, so a process that
misses a few (a store outage) stays registered, and one that stopped falls out of
``enable-bundles``' check (a) after five minutes."""
COLLECTOR_ROLES = ("collector", "query-collector")
"""The roles that write index log segments, under the writer id their entry is named by."""
NS_PER_S = 1_000_000_000


def this_version() -> str:
    """The installed package's version (``lightmetrics-ingest``)."""
    try:
        return importlib.metadata.version("lightmetrics-ingest")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def process_id() -> str:
    """``<host>-<pid>-<random>``: the id of a process that is not a collector."""
    host = socket.gethostname().split(".")[0][:64] or "host"
    return f"{_safe(host)}-{os.getpid()}-{secrets.token_hex(3)}"


def reconciler_process_id(owner: str) -> str:
    """The id of a reconciler's entry: its lease owner name (`reconciler.context.
    default_owner_id`, ``reconciler-<host>-<pid>-<random>``) without the role, so the
    lease holder's entry is found by its name (``enable-bundles``' check (c))."""
    return _safe(owner).removeprefix("reconciler-")[:128] or "_"


def _safe(name: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name)


def new_entry(clock: Clock) -> VersionEntry:
    """This process's entry, expiring `ENTRY_TTL_S` from ``clock`` (a store clock)."""
    return VersionEntry(
        version=this_version(),
        reads_bundles=READS_BUNDLES,
        expires_at_unix_ns=clock.now_ns() + int(ENTRY_TTL_S * NS_PER_S),
    )


async def write_entry(store: ObjectStore, key: str, clock: Clock) -> VersionEntry:
    """One PUT of this process's entry at ``key`` (its own: a plain overwrite)."""
    entry = new_entry(clock)
    await store.put(key, entry.to_json())
    return entry


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    key: str
    role: str | None
    """None: a key under the prefix this version cannot parse (a later version's role)."""
    process_id: str | None
    entry: VersionEntry | None
    """None: the record does not parse (it proves nothing: `blocks`)."""
    error: str | None = None


@dataclass
class Registry:
    """The entries found, and when (store time) they were judged."""

    now_ns: int
    entries: list[RegistryEntry] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=lambda: {"LIST": 0, "GET": 0})

    def unexpired(self) -> list[RegistryEntry]:
        """Entries not known to have expired (an unreadable one counts as unexpired)."""
        return [
            e for e in self.entries if e.entry is None or e.entry.expires_at_unix_ns > self.now_ns
        ]

    def lacking_reads_bundles(self) -> list[RegistryEntry]:
        """Check (a): unexpired entries that do not say ``reads_bundles``."""
        return [e for e in self.unexpired() if e.entry is None or not e.entry.reads_bundles]

    def collector_writers(self) -> set[str]:
        """The writer ids with a collector entry that reads bundles, expired or not (an
        entry, once written, shows the writer's version registers; check (a) covers
        whether a live one reads bundles)."""
        return {
            e.process_id
            for e in self.entries
            if e.role in COLLECTOR_ROLES
            and e.process_id is not None
            and e.entry is not None
            and e.entry.reads_bundles
        }

    def of_role(self, role: str, process_id: str) -> RegistryEntry | None:
        for e in self.entries:
            if e.role == role and e.process_id == process_id:
                return e
        return None


async def read_registry(store: ObjectStore, clock: Clock) -> Registry:
    """Every entry under ``index/v1/versions/``: one LIST (a page per 1,000 entries) and
    one GET per entry; ``clock`` is a store clock (expiries are store time)."""
    registry = Registry(now_ns=clock.now_ns())
    infos = []
    registry.requests["LIST"] += 1
    async for info in store.list(keys.INDEX_VERSIONS_PREFIX):
        infos.append(info)
    for info in infos:
        try:
            role, pid = keys.parse_version_entry_key(info.key)
        except keys.KeyFormatError:
            role, pid = None, None
        registry.requests["GET"] += 1
        try:
            body, _etag = await store.get(info.key)
        except NotFound:
            continue  # deleted since the listing: a process that stopped
        try:
            registry.entries.append(
                RegistryEntry(info.key, role, pid, VersionEntry.from_json(body))
            )
        except RecordError as exc:
            registry.entries.append(RegistryEntry(info.key, role, pid, None, str(exc)))
    return registry
