"""The steady pass: catalog what the collectors' log segments name (PROTOCOL §3.7, §3.9).

Each pass lists the log from its durable position (`index.log_reader`: from the newest
consumed segment's time minus ``reconciler.lookback_s``, skipping consumed names), reads
the new segments ``reconciler.concurrency`` at a time as Arrow tables, and sorts each
chunk's rows column-wise (`reconciler.steady_rows`):

- rows of a collector's own create answered 200 (``own_create`` with the store's
  ``etag``) are cataloged as they are, **with no request**; a sample of them
  (``reconciler.verify_sample_rate``) is read back and compared field by field, and a
  difference is cataloged from the store's record as a superseding row (a
  ``catalog-mismatch`` event: a collector bug);
- rows from a read (duplicates, re-sends, unknown outcomes, conflicts; ~1 % of batches)
  and rows written before ``own_create`` existed are read back once unless their key was
  cataloged lately;
- malformed rows are a ``malformed-log-row`` problem (subject: the segment), never
  cataloged: the audit finds their records;
- ``blob`` rows feed `OrphanSuspects` (columns too).

Catalog rows carry ``source`` (the segment's key, or ``read-back``) and the batch's point
times from the log row. The catalog files of a chunk and their rollup work markers are
written (`reconciler.cataloger`) before the checkpoint (`IndexCheckpoint`, CAS under the
lease epoch) moves past its segments, so a crash re-reads at most one chunk.

When the store's ETags cannot attest a record (PROTOCOL §3.6: PUT, HEAD and LIST disagree;
``ReconcilerContext.etags_attest``), every record row is read back, as before this change.

Requests per pass grow with the new segments and the read-derived rows, never with history:
one LIST from the position, one GET per segment, one GET per read-derived key and per
sampled row, one catalog file and one marker per hour touched per chunk, one checkpoint
write per chunk. CPU per batch: a few microseconds (Arrow), plus a BLAKE2b of each key.

The position never moves past the store's present (a collector whose clock runs ahead
must not make the pass skip other collectors' segments); a segment from the future is
remembered by name instead.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from index.log_reader import LogPosition, new_segments, read_segment_table
from index.row_checks import first_problems, raw_object_hashes
from index.rows import FILE_SCHEMA, IndexFileError
from protocol import keys
from protocol.records import IndexCheckpoint, RecordError
from reconciler.cataloger import Cataloger
from reconciler.context import ReconcilerContext
from reconciler.gc.suspects import OrphanSuspects
from reconciler.log_lag import LogLag
from reconciler.problems import ProblemBook
from reconciler.retractions import RetractedKeys
from reconciler.steady_rows import (
    RecentKeys,
    compare_sample,
    digest_words,
    read_back_table,
    sort_chunk,
)
from store.base import ObjectStore
from store.cas import update_object
from store.errors import NotFound, StoreError
from store.lease import LeaseLost

CHUNK_ROWS = 50_000  # log rows cataloged before the checkpoint moves
READ_AHEAD = 64  # segments listed before they are read (concurrently) as one group
NS_PER_S = 1_000_000_000

__all__ = ["OrphanSuspects", "SteadyResult", "SteadyScanner", "read_checkpoint"]


@dataclass
class SteadyResult:
    accepted_rows: int = 0
    segments_read: int = 0
    records_read: int = 0
    rows_attested: int = 0
    rows_cataloged: int = 0
    catalog_files: int = 0
    mismatches: int = 0
    malformed: int = 0
    missing: int = 0
    problems: int = 0
    failed: int = 0
    complete: bool = True
    checkpoint: IndexCheckpoint | None = None


@dataclass
class _Chunk:
    tables: list[pa.Table] = field(default_factory=list)
    segments: list[tuple[str, int]] = field(default_factory=list)
    rows: int = 0


async def read_checkpoint(store: ObjectStore) -> IndexCheckpoint | None:
    """The stored checkpoint, ``None`` when there is none. Raises `RecordError`."""
    try:
        body, _etag = await store.get(keys.RECONCILER_INDEX_CHECKPOINT_KEY)
    except NotFound:
        return None
    return IndexCheckpoint.from_json(body)


class SteadyScanner:
    def __init__(self, ctx: ReconcilerContext, suspects: OrphanSuspects | None = None) -> None:
        self._ctx = ctx
        self.suspects = suspects if suspects is not None else OrphanSuspects()
        self._recent = RecentKeys()  # keys cataloged within the lookback
        self._retracted = RetractedKeys(ctx.store, ctx.clock)  # read back their rows
        self._position: LogPosition | None = None  # as last saved by this scanner
        self._rng = random.Random(ctx.rng.getrandbits(64))
        self.lag = LogLag(ctx.clock)  # what the lag gauge reads at each scrape
        ctx.metrics.log_lag.set_function(self.lag.seconds)

    @property
    def _lookback_ns(self) -> int:
        return int(self._ctx.settings.reconciler.lookback_s * NS_PER_S)

    async def run_pass(self) -> SteadyResult:
        ctx = self._ctx
        result = SteadyResult()
        position = await self._position_at_start()
        problems = ProblemBook(ctx)  # lists the problem records only if a record is read
        cataloger = Cataloger(ctx, problems)
        chunk = _Chunk()
        now_ns = ctx.clock.now_ns()
        group: list[tuple[str, int]] = []
        going = True
        listed_all = True
        self.lag.listing_started(now_ns)

        async def read_group() -> bool:
            """Read the listed group into the chunk, committing full chunks; False stops."""
            nonlocal chunk
            tables = await self._read_segments([key for key, _ in group], problems, result)
            for (key, first_ns), table in zip(group, tables, strict=False):
                chunk.segments.append((key, first_ns))  # None: consumed, without rows
                if table is not None:
                    chunk.tables.append(table)
                    chunk.rows += table.num_rows
                if chunk.rows >= CHUNK_ROWS:
                    committed = await self._commit(
                        chunk, position, cataloger, problems, result, now_ns
                    )
                    chunk = _Chunk()
                    if not committed:
                        return False
            if len(tables) < len(group):
                result.complete = False
                return False
            return True

        async for info, name in new_segments(
            ctx.store, position, lookback_s=ctx.settings.reconciler.lookback_s
        ):
            if ctx.stopping.is_set():
                result.complete = False
                listed_all = False
                break
            group.append((info.key, name.time_ns))
            self.lag.listed(info.key, name.time_ns)
            if len(group) >= READ_AHEAD:
                going = await read_group()
                group = []
                if not going:
                    listed_all = False
                    break
        if listed_all:
            self.lag.listing_complete()
        if going and group and not ctx.stopping.is_set():
            await read_group()
        await self._commit(chunk, position, cataloger, problems, result, now_ns)
        self.suspects.forget_refs_before(now_ns - self._lookback_ns)
        self._recent.forget_before(now_ns - self._lookback_ns)
        ctx.metrics.steady_passes.labels("complete" if result.complete else "incomplete").inc()
        return result

    async def _read_segments(
        self, segment_keys: list[str], problems: ProblemBook, result: SteadyResult
    ) -> list[pa.Table | None]:
        """The segments' tables, in order, up to the first that could not be read (a store
        error: the position stays before it). ``None``: consumed without rows (deleted
        after an earlier leader consumed it, or undecodable: a problem)."""
        limit = asyncio.Semaphore(self._ctx.settings.reconciler.concurrency)

        async def one(key: str) -> pa.Table | BaseException | None:
            async with limit:
                try:
                    return await read_segment_table(self._ctx.store, key)
                except NotFound:
                    return None
                except IndexFileError as exc:
                    await problems.record("unreadable-index-file", key, str(exc))
                    result.problems += 1
                    return None  # its records are the audit's to find: never block the log
                except StoreError as exc:
                    return exc

        answers = await asyncio.gather(*(one(key) for key in segment_keys))
        tables: list[pa.Table | None] = []
        for key, answer in zip(segment_keys, answers, strict=True):
            if isinstance(answer, BaseException):
                self._ctx.log.warning("log_segment_read_failed", key=key, error=str(answer))
                self._ctx.metrics.store_failures.labels("log_segment").inc()
                result.failed += 1
                break
            if answer is not None:
                result.segments_read += 1
                self._ctx.metrics.log_segments.inc()
            tables.append(answer)
        return tables

    async def _commit(
        self,
        chunk: _Chunk,
        position: LogPosition,
        cataloger: Cataloger,
        problems: ProblemBook,
        result: SteadyResult,
        now_ns: int,
    ) -> bool:
        if not chunk.segments:
            return True
        ctx = self._ctx
        # One chunk per column, not one per segment: every compute kernel below pays a
        # fixed cost per chunk, and a chunk holds up to READ_AHEAD x hundreds of segments.
        table = (
            pa.concat_tables(chunk.tables).combine_chunks()
            if chunk.tables
            else FILE_SCHEMA.empty_table()
        )
        accepted = int(pc.sum(pc.equal(table.column("kind"), "accepted")).as_py() or 0)
        result.accepted_rows += accepted
        sorted_rows = sort_chunk(
            table,
            self._recent,
            sample_rate=ctx.settings.reconciler.verify_sample_rate,
            rng=self._rng,
            attest=ctx.etags_attest,
            retracted=await self._retracted.current(),
        )
        await self._report_malformed(sorted_rows.malformed, problems, result)
        self._note_references(table, sorted_rows.blobs)
        to_read = pa.concat_tables([sorted_rows.read_back, sorted_rows.sample])
        read_keys = to_read.column("key").to_pylist()
        batch = await cataloger.read(read_keys)
        result.records_read += len(read_keys)
        result.missing += batch.missing
        result.problems += batch.problems
        if batch.failed:
            result.failed += len(batch.failed)
            result.complete = False
        superseding, mismatched = compare_sample(self._ctx, sorted_rows.sample, batch.rows)
        result.mismatches += len(mismatched)
        attested = sorted_rows.attested
        if mismatched:
            keep = pc.invert(pc.is_in(attested.column("key"), value_set=pa.array(mismatched)))
            attested = attested.filter(keep)
        sampled = set(sorted_rows.sample.column("key").to_pylist())
        read_rows = [row for row in batch.rows if row.key not in sampled]
        catalog = pa.concat_tables(
            [attested, read_back_table(read_rows, sorted_rows.read_back), superseding]
        )
        try:
            written = await cataloger.commit_table(catalog, writer="steady")
        except StoreError as exc:
            ctx.log.warning("catalog_write_failed", error=str(exc))
            ctx.metrics.store_failures.labels("catalog_write").inc()
            result.failed += 1
            result.complete = False
            return False
        result.rows_attested += attested.num_rows
        result.rows_cataloged += catalog.num_rows
        result.catalog_files += len(written)
        self._recent.add(
            digest_words(catalog), catalog.column("time_unix_ns").to_numpy(zero_copy_only=False)
        )
        if batch.failed:
            return False  # the position stays before these segments: read them again
        lookback = self._lookback_ns
        for key, first_ns in chunk.segments:
            position.consumed(key, min(first_ns, now_ns), lookback)
        totals = {
            "segments": len(chunk.segments),
            "accepted_rows": accepted,
            "records_read": len(read_keys),
            "catalog_files": len(written),
            "markers": len(written),
            "checkpoints": 1,
        }
        result.checkpoint = await self._save(position, totals)
        # This term's leader is the checkpoint's only writer: keep the position for the
        # next pass (no GET) unless the save failed, which leaves memory ahead of the store.
        self._position = position if result.checkpoint is not None else None
        if result.checkpoint is not None:
            self.lag.consumed([key for key, _first_ns in chunk.segments])
        return result.checkpoint is not None

    def _note_references(self, table: pa.Table, blobs: pa.Table) -> None:
        """Blob rows become suspects unless a record row of the chunk names the raw object:
        by the hash in its ``raw_blob_key`` (PROTOCOL §3.10: a bundled frame's row names
        the bundle, whose ``blob`` row carries the bundle's hash), never ``frame_sha256``."""
        records = table.filter(pc.not_equal(table.column("kind"), "blob"))
        times = records.column("time_unix_ns")
        self.suspects.add_references(raw_object_hashes(records), times)
        quarantine = records.filter(pc.is_valid(records.column("accepted_frame_sha256")))
        self.suspects.add_references(
            quarantine.column("accepted_frame_sha256"), quarantine.column("time_unix_ns")
        )
        self.suspects.add_blobs(
            blobs.column("frame_sha256"), blobs.column("time_unix_ns"), blobs.column("key")
        )

    async def _report_malformed(
        self, malformed: pa.Table, problems: ProblemBook, result: SteadyResult
    ) -> None:
        if malformed.num_rows == 0:
            return
        result.malformed += malformed.num_rows
        self._ctx.metrics.malformed_log_rows.inc(malformed.num_rows)
        for segment in pc.unique(malformed.column("source")).to_pylist():
            rows = malformed.filter(pc.equal(malformed.column("source"), segment))
            detail = "; ".join(first_problems(rows, pa.repeat(False, rows.num_rows), 3))
            await problems.record(
                "malformed-log-row", segment, f"{rows.num_rows} malformed row(s): {detail}"
            )
            result.problems += 1

    async def _position_at_start(self) -> LogPosition:
        """Where the log was consumed through: the stored checkpoint, read once a term."""
        if self._position is None:
            stored = await read_checkpoint(self._ctx.store)
            self._position = (
                LogPosition(stored.log_through_ns, set(stored.log_seen))
                if stored
                else LogPosition()
            )
        return self._position

    async def _save(self, position: LogPosition, added: dict[str, int]) -> IndexCheckpoint | None:
        ctx = self._ctx
        epoch = ctx.epoch
        now = ctx.clock.now_ns()

        def mutate(body: bytes | None) -> bytes:
            through, seen = position.through_ns, set(position.seen)
            totals = Counter(added)
            if body is not None:
                current = IndexCheckpoint.from_json(body)
                if current.owner_epoch > epoch:
                    # A newer leader wrote it: we are stale even if our clock disagrees.
                    raise LeaseLost(
                        keys.RECONCILER_LEASE_KEY,
                        epoch,
                        f"checkpoint of epoch {current.owner_epoch}",
                    )
                totals.update(current.totals)  # cumulative since the store began
            return IndexCheckpoint(
                log_through_ns=through,
                log_seen=sorted(seen),
                updated_at_unix_ns=now,
                owner_epoch=epoch,
                totals=dict(totals),
                etags_attest=ctx.etags_attest,
            ).to_json()

        await ctx.check_fence()
        try:
            stored = await update_object(
                ctx.store,
                keys.RECONCILER_INDEX_CHECKPOINT_KEY,
                mutate,
                backoff=ctx.backoff,
                rng=ctx.rng,
                clock=ctx.clock,
            )
        except StoreError as exc:
            ctx.metrics.store_failures.labels("checkpoint").inc()
            ctx.log.warning("checkpoint_update_failed", error=str(exc))
            return None
        except RecordError as exc:
            ctx.log.error("checkpoint_unreadable", error=str(exc))
            raise
        assert stored.body is not None
        checkpoint = IndexCheckpoint.from_json(stored.body)
        ctx.metrics.note_checkpoint(checkpoint.updated_at_unix_ns)
        return checkpoint
