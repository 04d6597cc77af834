"""The reconciler's catalog (PROTOCOL §3.7): verified rows, one set of Parquet files per hour.

Reading: an hour's catalog is the union of its files, a key counted once (the row written
last, by the rank of the file it was first written in: `index.catalog_rank`). Product code reads an hour column-wise or out of core, never as one Python
object per row (PROTOCOL §3.9): `index.catalog_tables`. A listed file that is gone when
read (compaction deleted it after its grace) makes the reader list the hour again, a
bounded number of times (`RELIST_ATTEMPTS`); a file that does not decode raises
`IndexFileError`: nobody may take an unreadable catalog for "no rows".

Writing (the lease holder only): `CatalogWriter.write` creates
``<epoch:010d>-<sequence:010d>.parquet`` with If-None-Match. The sequence starts at the
store-clock second the writer was made and counts up, so names are unique per epoch
even across restarts; a 412 proves nothing about who wrote the file (unless our own
earlier attempt's answer was lost and the body read back is ours), so the writer moves
on to the next sequence. Right after the file, it creates the file's entry
``index/v1/catalog-created/<epoch:010d>-<sequence:010d>`` (`records.CatalogCreated`):
entries list every catalog file in creation order, so the GC reads the files created
since an audit started without listing history (PROTOCOL §3.5 rule 2). Each entry holds
the file's hour and its writer, which every write names (``writer``: ``steady``,
``audit-<id>``, ``compaction``, ``retraction``): re-marking after a stopped audit marks
only that audit's files (`reconciler.audit.remark`). A write whose
entry could not be made raises like one whose file could not: the caller redoes its
rows, in a file with an entry. `CatalogWriter.position` is where an audit starting now
records that the files created after its start begin.

Compaction (`index.catalog_merge.merge_files`, out of core): merges files into one whose
Parquet metadata names its inputs (and, transitively, the files they were merged from:
`compacted_from_names`), reads it back, and returns. The inputs are deleted
later by `delete_compacted_inputs`, once the merged file is older than ``grace_s`` in
store time (longer than any reader's listing-to-read time), exactly by the names the
merged file records: never a file written after the compaction listed the hour.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import structlog

from protocol import keys, records
from protocol.clock import Clock
from store.base import PUT_FILE_PART_BYTES, ObjectInfo, ObjectStore
from store.errors import (
    ConditionConflict,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    Unavailable,
)
from store.retry import Backoff

from .row_checks import decode
from .rows import IndexFileError, IndexRow, encode_table, table_of

log = structlog.get_logger(__name__)
DEFAULT_BACKOFF = Backoff(attempts=5, base_s=0.05, cap_s=1.0)
RELIST_ATTEMPTS = 3
COMPACTED_FROM = b"lightmetrics.compacted_from"
HOUR_NS = 3600 * 1_000_000_000


async def list_hour_files(store: ObjectStore, hour: keys.UtcHour) -> list[ObjectInfo]:
    prefix = keys.index_catalog_hour_prefix(hour)
    return [info async for info in store.list(prefix) if _is_catalog_file(info.key)]


async def list_all_files(
    store: ObjectStore, *, start_after: str | None = None
) -> AsyncIterator[ObjectInfo]:
    """Every catalog file of every hour (after the key ``start_after``), in key order
    (hour by hour)."""
    async for info in store.list(keys.INDEX_CATALOG_PREFIX, start_after=start_after):
        if _is_catalog_file(info.key):
            yield info


async def read_file(store: ObjectStore, key: str) -> list[IndexRow]:
    """One catalog file's rows. `NotFound` when gone, `IndexFileError` when unreadable or
    when a row's hour (of its ``time_unix_ns``: a manifest's accepted hour) is not the
    file's hour."""
    hour, _epoch, _sequence = keys.parse_index_catalog_key(key)
    body, _etag = await store.get(key)
    rows = decode(body, source=key)
    for row in rows:
        if row.hour != hour:
            raise IndexFileError(f"{key}: row {row.key!r} belongs to hour {row.hour}, not {hour}")
    return rows


class CatalogWriter:
    """Creates catalog files for one lease epoch."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        clock: Clock,
        rng: random.Random,
        epoch: int,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self._store = store
        self._clock = clock
        self._rng = rng
        self._epoch = epoch
        self._sequence = (clock.now_ns() // 1_000_000_000) % 10**10
        self._backoff = backoff
        self._in_flight: dict[int, int] = {}  # sequence -> writes using it (normally 1)
        self.files_written = 0

    def position(self) -> str:
        """The catalog-created entry name from which every file this writer creates from
        now on, or is creating now, is named (an audit records it at its start): the
        lowest sequence in flight, else the next one."""
        sequence = min(self._in_flight, default=(self._sequence + 1) % 10**10)
        return keys.catalog_created_key(self._epoch, sequence).removeprefix(
            keys.INDEX_CATALOG_CREATED_PREFIX
        )

    async def write(
        self,
        hour: keys.UtcHour,
        rows: Iterable[IndexRow],
        *,
        writer: str,
        metadata: dict[bytes, bytes] | None = None,
    ) -> str:
        """`write_table` for a few rows given as objects."""
        return await self.write_table(hour, table_of(list(rows)), writer=writer, metadata=metadata)

    async def write_table(
        self,
        hour: keys.UtcHour,
        table: pa.Table,
        *,
        writer: str,
        metadata: dict[bytes, bytes] | None = None,
    ) -> str:
        """Create one catalog file for ``hour`` holding ``table``'s rows (a `FILE_SCHEMA`
        table, sorted here by key); returns its key. ``writer`` is who writes it, recorded
        in its catalog-created entry (`records.CatalogCreated.writer`).

        Raises the store's error when bounded retries did not settle the create; then no
        file was written, or one whose rows are all true (a later read counts them once).
        """
        if table.num_rows:
            if pc.any(pc.equal(table.column("kind"), "blob")).as_py():
                raise ValueError("blob rows are never cataloged")
            hours = pc.unique(pc.divide(table.column("time_unix_ns"), HOUR_NS)).to_pylist()
            if hours != [hour.start_ns // HOUR_NS]:
                raise ValueError(
                    f"a row belongs to hour index {hours} (unix ns // 1 h), not {hour}"
                )
        ordered = table.take(pc.sort_indices(table, [("key", "ascending")]))
        if metadata:
            ordered = ordered.replace_schema_metadata(metadata)
        return await self.write_encoded(hour, encode_table(ordered), writer=writer)

    async def write_encoded(self, hour: keys.UtcHour, body: bytes, *, writer: str) -> str:
        """Create one catalog file for ``hour`` from an encoded body; returns its key.
        Retries as `write_table` says."""
        key, _etag = await self.create_encoded(hour, body, writer=writer)
        return key

    async def create_encoded(
        self, hour: keys.UtcHour, body: bytes, *, writer: str
    ) -> tuple[str, str | None]:
        """`write_encoded`, also returning the ETag the store answered for the create
        (``None`` when an earlier attempt's lost answer created it: read back instead)."""
        rows = pq.read_metadata(io.BytesIO(body)).num_rows
        return await self._create(
            hour,
            lambda key: self._store.put(key, body, if_none_match=True),
            lambda stored: stored == body,
            _entry(hour, rows, writer),
        )

    async def create_file(
        self, hour: keys.UtcHour, path: str, *, writer: str
    ) -> tuple[str, str | None]:
        """`create_encoded` of the encoded catalog file at ``path``, uploaded from the file
        (`ObjectStore.put_file`: never the whole body in memory; a merged hour is
        hundreds of MB)."""
        rows = (await asyncio.to_thread(pq.read_metadata, path)).num_rows
        digest: list[bytes] = []  # the file's hash, computed only if a lost answer needs it

        def same(stored: bytes) -> bool:
            if not digest:
                digest.append(file_sha256(path))
            return hashlib.sha256(stored).digest() == digest[0]

        entry = _entry(hour, rows, writer)
        return await self._create(
            hour, lambda key: self._store.put_file(key, path, if_none_match=True), same, entry
        )

    async def _create(
        self,
        hour: keys.UtcHour,
        put: Callable[[str], Awaitable[str]],
        same: Callable[[bytes], bool],
        entry: records.CatalogCreated,
    ) -> tuple[str, str | None]:
        """Create a file of ``hour`` by ``put(key)`` (If-None-Match) under the next free
        name, then its catalog-created entry (``entry`` with the name); ``same(stored)``
        says whether a body read back is this one (after a lost answer and a 412)."""
        delays = self._backoff.delays(self._rng)
        key = self._next_key(hour)
        etag: str | None = None
        self._hold(key, +1)
        try:
            maybe_ours = False
            while True:
                try:
                    etag = await put(key)
                    break
                except PreconditionFailed:
                    if maybe_ours and await self._holds(key, same):
                        break
                    self._hold(key, -1)
                    key, maybe_ours = self._next_key(hour), False
                    self._hold(key, +1)
                    continue  # a name in use is not ours: the next sequence (unique soon)
                except (OutcomeUnknown, Unavailable, ConditionConflict) as exc:
                    # Safe to repeat: If-None-Match; a 412 afterwards is checked by reading back.
                    maybe_ours = maybe_ours or isinstance(exc, OutcomeUnknown)
                    delay = next(delays, None)
                    if delay is None:
                        raise
                    await self._clock.sleep(delay)
            await self._create_entry(entry.model_copy(update={"catalog_key": key}))
        finally:
            self._hold(key, -1)
        self.files_written += 1
        return key, etag

    def _hold(self, key: str, change: int) -> None:
        sequence = keys.parse_index_catalog_key(key)[2]
        count = self._in_flight.get(sequence, 0) + change
        if count:
            self._in_flight[sequence] = count
        else:
            self._in_flight.pop(sequence, None)

    async def _create_entry(self, created: records.CatalogCreated) -> None:
        """The file's catalog-created entry. A 412 is our own entry: the name is this
        writer's (epoch, sequence), whose file we just created. Raises when bounded retries
        did not settle it."""
        _hour, epoch, sequence = keys.parse_index_catalog_key(created.catalog_key)
        entry_key = keys.catalog_created_key(epoch, sequence)
        entry = created.to_json()
        delays = self._backoff.delays(self._rng)
        while True:
            try:
                await self._store.put(entry_key, entry, if_none_match=True)
                return
            except PreconditionFailed:
                return
            except (Unavailable, ConditionConflict):  # OutcomeUnknown too: repeat, 412 = ours
                delay = next(delays, None)
                if delay is None:
                    raise
                await self._clock.sleep(delay)

    def _next_key(self, hour: keys.UtcHour) -> str:
        self._sequence = (self._sequence + 1) % 10**10
        return keys.index_catalog_key(hour, self._epoch, self._sequence)

    async def _holds(self, key: str, same: Callable[[bytes], bool]) -> bool:
        try:
            stored, _etag = await self._store.get(key)
        except NotFound:
            return False
        return same(stored)


def _entry(hour: keys.UtcHour, rows: int, writer: str) -> records.CatalogCreated:
    """A file's catalog-created entry, its name still to be chosen: built before the file is
    created, so a writer label that is not one (`records.CatalogCreated.writer`) raises
    before anything is written."""
    return records.CatalogCreated(catalog_key="-", rows=rows, hour=hour.iso, writer=writer)


@dataclass(frozen=True, slots=True)
class Compaction:
    merged_key: str
    inputs: tuple[str, ...]
    rows: int


async def delete_compacted_inputs(
    store: ObjectStore,
    hour: keys.UtcHour,
    *,
    store_now_ns: int,
    grace_s: float,
    pinned_through_ns: int | None = None,
) -> int:
    """Delete the inputs that the hour's merged files name, once those are older than
    ``grace_s`` (store time), except those a running audit pinned: last modified at or
    before ``pinned_through_ns`` (PROTOCOL §3.7). Returns how many files were deleted."""
    deleted = 0
    files = {info.key: info for info in await list_hour_files(store, hour)}
    for info in list(files.values()):
        if store_now_ns - info.last_modified_ns < grace_s * 1_000_000_000:
            continue
        try:
            inputs = await _compacted_from(store, info.key)
        except NotFound:
            continue
        for name in inputs:
            if name in files and name != info.key:
                if pinned_through_ns is not None and (
                    files[name].last_modified_ns <= pinned_through_ns
                ):
                    continue
                await store.delete(name)
                files.pop(name)
                deleted += 1
    return deleted


async def _compacted_from(store: ObjectStore, key: str) -> list[str]:
    body, _etag = await store.get(key)
    try:
        meta = pq.read_metadata(io.BytesIO(body)).metadata or {}
    except Exception as exc:
        raise IndexFileError(f"{key}: unreadable catalog file: {exc}") from None
    return compacted_from_names(meta)


def file_sha256(path: str) -> bytes:
    """SHA-256 of a local file, read a piece at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while piece := file.read(PUT_FILE_PART_BYTES):
            digest.update(piece)
    return digest.digest()


def compacted_from_names(metadata: dict[bytes, bytes] | None) -> list[str]:
    """The catalog files whose rows a merged file holds, from its Parquet key-value
    metadata (`COMPACTED_FROM`: its inputs and, transitively, theirs); empty for a file
    no merge wrote. The GC's rule-2 read relies on the transitive part: an input's input,
    deleted after the input's own merge, is vouched for by the newest merged file alone."""
    names = (metadata or {}).get(COMPACTED_FROM, b"").decode()
    return [name for name in names.split("\n") if name]


def _is_catalog_file(key: str) -> bool:
    try:
        keys.parse_index_catalog_key(key)
    except keys.KeyFormatError:
        return False
    return True


async def move_aside(store: ObjectStore, key: str) -> str:
    """Move an unreadable index file to ``index/v1/unreadable/...`` (copy, then delete),
    so that it no longer blocks the GC; its records are cataloged again by the next
    audit, which no longer finds their rows. Returns the new key."""
    body, _etag = await store.get(key)
    aside = keys.INDEX_UNREADABLE_PREFIX + key.removeprefix("index/v1/")
    await store.put(aside, body)
    await store.delete(key)
    return aside
