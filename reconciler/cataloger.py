"""Cataloging records: read each once, keep only what is well-formed, write catalog files.

Used by the steady pass (keys named by log rows), the full audit (keys the anti-join found
missing) and therefore the migration of a version-1 store (the first audit finds every
key missing). PROTOCOL §3.7: a catalog row exists only for a record the reconciler read
from the store itself and found well-formed — a valid schema, an identity equal to its
key, and raw keys as PROTOCOL §3.10 says (`index.row_checks`: the frame blob of its
``frame_sha256`` with no range, or a bundle with a range; a quarantine record's both
keys frame blobs).

`Cataloger.read` GETs records, ``concurrency`` at a time (or as many as the caller's
``limit`` lets it: the audit shares its slots between its walk workers). A record that does not parse,
or names another key, becomes an ``unparseable-manifest``/``unparseable-quarantine``
problem (resolved when a later read finds it well-formed); a record that is gone is
counted (``missing``; records are never deleted, so only a log row's claim can name one);
a store error, or any other error reading one record, fails that record only (counted;
the caller keeps its cursor before it).

`Cataloger.commit` writes one catalog file per hour present, then one rollup work marker
per file (PROTOCOL §3.7: the caller advances its checkpoint or cursor only after both).
The fence is checked before the writes. The caller names itself as the files' writer
(``steady``, or ``audit-<id>``: `records.CatalogCreated.writer`).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc

from index.rows import IndexFileError, IndexRow, accepted_row, check_row, quarantine_row
from protocol import keys
from protocol.records import AcceptedManifest, IdentityConflict, RecordError, RollupWorkMarker
from reconciler import store_calls
from reconciler.context import ReconcilerContext
from reconciler.problems import ProblemBook

HOUR_NS = 3600 * 1_000_000_000


@dataclass
class CatalogBatch:
    rows: list[IndexRow] = field(default_factory=list)
    missing: int = 0
    problems: int = 0
    failed: list[str] = field(default_factory=list)

    def add(self, other: CatalogBatch) -> None:
        self.rows.extend(other.rows)
        self.missing += other.missing
        self.problems += other.problems
        self.failed.extend(other.failed)


def is_quarantine_key(key: str) -> bool:
    return key.startswith(keys.QUARANTINE_PREFIX)


class Cataloger:
    def __init__(
        self,
        ctx: ReconcilerContext,
        problems: ProblemBook,
        *,
        limit: asyncio.Semaphore | None = None,
    ) -> None:
        self._ctx = ctx
        self._problems = problems
        self._writer = ctx.catalog_writer
        self._limit = limit
        self.files_written = 0
        self.rows_written = 0

    async def read(self, record_keys: Iterable[str], *, source: str = "read-back") -> CatalogBatch:
        """Read and verify each record (GET once each, bounded concurrency); the rows carry
        the ETag the GET answered and ``source`` (``read-back``, or ``audit``)."""
        limit = self._limit or asyncio.Semaphore(self._ctx.settings.reconciler.concurrency)
        batch = CatalogBatch()

        async def one(key: str) -> None:
            async with limit:
                batch.add(await self._read_one(key, source))

        async with asyncio.TaskGroup() as group:
            for key in dict.fromkeys(record_keys):
                group.create_task(one(key))
        return batch

    async def _read_one(self, key: str, source: str) -> CatalogBatch:
        result = CatalogBatch()
        quarantine = is_quarantine_key(key)
        try:
            found = await store_calls.read_with_etag(self._ctx, key)
        except Exception as exc:
            self._ctx.metrics.store_failures.labels("catalog_read").inc()
            self._ctx.log.warning("catalog_read_failed", key=key, error=repr(exc))
            result.failed.append(key)
            return result
        if found is None:
            result.missing += 1
            self._ctx.metrics.missing_records.inc()
            return result
        self._ctx.metrics.records_read.inc()
        kind = "unparseable-quarantine" if quarantine else "unparseable-manifest"
        try:
            body, etag = found
            row = replace(_verified_row(key, body, quarantine), etag=etag, source=source)
        except RecordError as exc:
            result.problems += 1
            await self._problems.record(kind, key, str(exc))
            return result
        await self._problems.resolve(kind, key)
        result.rows.append(row)
        return result

    async def commit(self, rows: Iterable[IndexRow], *, writer: str) -> list[str]:
        """Write the rows' catalog files (one per hour) and their work markers; ``writer``
        is recorded in each file's catalog-created entry."""
        by_hour: dict[keys.UtcHour, list[IndexRow]] = defaultdict(list)
        for row in rows:
            by_hour[row.hour].append(row)
        if not by_hour:
            return []
        await self._ctx.check_fence()
        written: list[str] = []
        for hour, hour_rows in sorted(by_hour.items()):
            catalog_key = await self._writer.write(hour, hour_rows, writer=writer)
            await self.mark_work(catalog_key, hour, len(hour_rows))
            self._ctx.on_catalog_written(hour, catalog_key)
            written.append(catalog_key)
            self.files_written += 1
            self.rows_written += len(hour_rows)
            metrics = self._ctx.metrics
            metrics.catalog_files.labels("cataloged").inc()
            for row in hour_rows:
                metrics.cataloged_rows.labels(row.kind).inc()
        return written

    async def commit_table(self, table: pa.Table, *, writer: str) -> list[str]:
        """`commit` for a `index.rows.FILE_SCHEMA` table: one file per hour present (the
        hours are found column-wise; a chunk spans one or two)."""
        if table.num_rows == 0:
            return []
        hour_of = pc.divide(table.column("time_unix_ns"), HOUR_NS)
        await self._ctx.check_fence()
        written: list[str] = []
        metrics = self._ctx.metrics
        for hour_index in sorted(pc.unique(hour_of).to_pylist()):
            rows = table.filter(pc.equal(hour_of, hour_index))
            hour = keys.UtcHour.from_unix_ns(hour_index * HOUR_NS)
            catalog_key = await self._writer.write_table(hour, rows, writer=writer)
            await self.mark_work(catalog_key, hour, rows.num_rows)
            self._ctx.on_catalog_written(hour, catalog_key)
            written.append(catalog_key)
            self.files_written += 1
            self.rows_written += rows.num_rows
            metrics.catalog_files.labels("cataloged").inc()
            kinds = pc.value_counts(rows.column("kind")).to_pylist()
            for entry in kinds:
                metrics.cataloged_rows.labels(entry["values"]).inc(entry["counts"])
        return written

    async def mark_work(self, catalog_key: str, hour: keys.UtcHour, rows: int) -> None:
        marker = RollupWorkMarker(
            catalog_key=catalog_key,
            hour=hour.iso,
            rows=rows,
            written_at_unix_ns=self._ctx.clock.now_ns(),
        )
        await store_calls.create_if_absent(
            self._ctx, keys.rollup_work_marker_key(catalog_key), marker.to_json()
        )


def _verified_row(key: str, body: bytes, quarantine: bool) -> IndexRow:
    """The catalog row of a well-formed record at ``key``; `RecordError` otherwise. The
    record's identity must be the one its key names, in either agent form (PROTOCOL §3:
    a store written before the segment rule may hold the long form)."""
    try:
        if quarantine:
            conflict = IdentityConflict.from_json(body)
            named, sha = keys.parse_quarantine_key(key)
            if not keys.identity_matches_key(conflict.identity, named) or (
                sha != conflict.submitted_frame_sha256
            ):
                raise RecordError(f"content names {conflict.quarantine_key!r}, not its own key")
            if conflict.accepted_raw_blob_key != keys.raw_blob_key(conflict.accepted_frame_sha256):
                # PROTOCOL §3.10: both raw keys of a quarantine record are frame blobs (the
                # submitted one is checked with the row); the row keeps only the hash.
                raise RecordError("accepted_raw_blob_key is not the frame blob of its hash")
            row = quarantine_row(conflict, key=key)
        else:
            manifest = AcceptedManifest.from_json(body, reads_bundles=True)
            if not keys.identity_matches_key(
                manifest.identity, keys.parse_accepted_manifest_key(key)
            ):
                raise RecordError(f"content names {manifest.manifest_key!r}, not its own key")
            row = accepted_row(manifest, key=key)
    except keys.KeyFormatError as exc:
        raise RecordError(f"not a record key: {exc}") from None
    try:
        check_row(row, source=key)
    except IndexFileError as exc:
        raise RecordError(str(exc)) from None
    return row
