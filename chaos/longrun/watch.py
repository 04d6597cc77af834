"""What the long simulation (`chaos.longrun.run`) sees happen, and when: a timeline kept
from the store operations as they are applied (`LongRunWatch`, hooked into
`chaos.sim.checks.WatchedStore`), and samples of what must stay bounded (`sample_bounds`).

Times are virtual seconds from the world's start (`chaos.sim.runtime.SimClock`); the store's
LastModified is the same clock, so "deletable" (LastModified + the GC's horizon) is too.

- an accepted manifest: when it was created, its hash and accepted hour;
- a log segment: for each ``accepted`` row in it, when the first segment naming that key
  landed (a re-send's or a duplicate's row lands later under the same key: only the first
  counts);
- a catalog file (the steady pass's, an audit's or a merge): for each key, when it was
  first cataloged and by whom (the row's ``source``: ``audit``, or a segment or
  ``read-back``: the steady pass);
- ``gc/v1/raw-retention.json``: when raw retention moved its ``retired_before``;
- a raw blob: every creation and deletion.

Decoding reads two or three columns of each index file (Arrow); the worlds' files are small.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from index.catalog import compacted_from_names
from protocol import keys, records
from store.memory import MemoryStore


@dataclass(frozen=True, slots=True)
class PlantedOrphan:
    sha: str
    planted_s: float
    """Also its LastModified (the blob was put then, with no faults)."""
    logged: bool
    """Its ``blob`` log row was flushed (the steady pass nominates it); else only an
    audit's listing finds it."""


@dataclass(frozen=True, slots=True)
class BoundSample:
    """Counts of what must stay bounded, and the age of the oldest of each."""

    at_s: float
    segments: int
    oldest_segment_age_s: float
    entries: int
    """``index/v1/catalog-created/`` entries."""
    oldest_entry_age_s: float
    catalog_files: int
    work_markers: int
    gc_marks: int


@dataclass
class LongRunWatch:
    now_s: Callable[[], float]
    created_s: dict[str, float] = field(default_factory=dict)
    """Accepted manifest key -> when it was created."""
    manifest_sha: dict[str, str] = field(default_factory=dict)
    manifest_hour: dict[str, keys.UtcHour] = field(default_factory=dict)
    row_landed_s: dict[str, float] = field(default_factory=dict)
    """Accepted manifest key -> when the first log segment with its row landed."""
    cataloged: dict[str, tuple[float, str]] = field(default_factory=dict)
    """Key -> (when first cataloged, ``"steady"`` or ``"audit"``)."""
    retirements: list[tuple[float, int]] = field(default_factory=list)
    """(when, ``retired_before`` as ns): each move of raw retention's state."""
    blob_created_s: dict[str, list[float]] = field(default_factory=dict)
    blob_deleted_s: dict[str, list[float]] = field(default_factory=dict)
    orphans: list[PlantedOrphan] = field(default_factory=list)
    samples: list[BoundSample] = field(default_factory=list)
    segments_landed: int = 0
    catalog_files_landed: int = 0
    segments_deleted: int = 0
    entries_deleted: int = 0

    def on_put(self, key: str, body: bytes) -> None:
        now = self.now_s()
        if key.startswith(keys.ACCEPTED_PREFIX):
            if key not in self.created_s:
                manifest = records.AcceptedManifest.from_json(body, reads_bundles=True)
                self.created_s[key] = now
                self.manifest_sha[key] = manifest.frame_sha256
                self.manifest_hour[key] = manifest.accepted_hour
        elif key.startswith(keys.INDEX_LOG_PREFIX):
            self.segments_landed += 1
            table = _columns(body, ["kind", "key"])
            accepted = table.filter(pc.equal(table.column("kind"), "accepted"))
            for name in accepted.column("key").to_pylist():
                self.row_landed_s.setdefault(name, now)
        elif key.startswith(keys.INDEX_CATALOG_PREFIX):
            self.catalog_files_landed += 1
            parquet = pq.ParquetFile(pa.BufferReader(body))
            if compacted_from_names(parquet.schema_arrow.metadata):
                return  # a merge: its rows are those of files already seen
            table = parquet.read(columns=["key", "source"])
            for name, source in zip(
                table.column("key").to_pylist(), table.column("source").to_pylist(), strict=True
            ):
                if name not in self.cataloged:
                    self.cataloged[name] = (now, "audit" if source == "audit" else "steady")
        elif key == keys.RAW_RETENTION_KEY:
            state = records.RawRetention.from_json(body)
            before = keys.UtcHour.parse_iso(state.retired_before).start_ns
            if not self.retirements or before > self.retirements[-1][1]:
                self.retirements.append((now, before))
        elif key.startswith(keys.RAW_BLOBS_PREFIX):
            self.blob_created_s.setdefault(keys.parse_raw_blob_key(key), []).append(now)

    def on_delete(self, key: str) -> None:
        if key.startswith(keys.INDEX_LOG_PREFIX):
            self.segments_deleted += 1
        elif key.startswith(keys.INDEX_CATALOG_CREATED_PREFIX):
            self.entries_deleted += 1
        elif key.startswith(keys.RAW_BLOBS_PREFIX):
            sha = keys.parse_raw_blob_key(key)
            self.blob_deleted_s.setdefault(sha, []).append(self.now_s())

    def first_deleted_after(self, sha: str, after_s: float) -> float | None:
        return next((t for t in self.blob_deleted_s.get(sha, []) if t >= after_s), None)

    def retired_at(self, hour: keys.UtcHour) -> float | None:
        """When raw retention first retired ``hour`` (None: not yet)."""
        return next((t for t, before in self.retirements if hour.start_ns < before), None)


def _columns(body: bytes, names: list[str]) -> pa.Table:
    return pq.read_table(pa.BufferReader(body), columns=names)


async def sample_bounds(memory: MemoryStore, *, at_s: float, now_ns: int) -> BoundSample:
    """Count what must stay bounded (segments, catalog-created entries) and what else
    accumulates (catalog files, work markers, GC marks), straight from the bucket."""

    async def count(prefix: str) -> tuple[int, float]:
        n, oldest = 0, now_ns
        async for info in memory.list(prefix):
            n += 1
            oldest = min(oldest, info.last_modified_ns)
        return n, (now_ns - oldest) / keys.NS_PER_S

    segments, segment_age = await count(keys.INDEX_LOG_PREFIX)
    entries, entry_age = await count(keys.INDEX_CATALOG_CREATED_PREFIX)
    catalog_files, _ = await count(keys.INDEX_CATALOG_PREFIX)
    markers, _ = await count(keys.ROLLUP_WORK_PREFIX)
    marks, _ = await count(keys.GC_MARKS_PREFIX)
    return BoundSample(
        at_s, segments, segment_age, entries, entry_age, catalog_files, markers, marks
    )
