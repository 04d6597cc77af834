"""The steady pass: catalog what the collectors' log segments name (PROTOCOL §3.7).

Each pass lists the log from its durable position (`index.log_reader`: from the newest
consumed segment's time minus ``reconciler.lookback_s``, skipping consumed names), reads
each new segment once, GETs each record its ``accepted``/``quarantine`` rows name once
(a key already cataloged by this process within the lookback is not read again), and
writes what it verified as catalog files with their rollup work markers
(`reconciler.cataloger`). Only then does the checkpoint (`IndexCheckpoint`, CAS under the
lease epoch) move past those segments, so a crash re-reads at most one chunk.

``blob`` rows feed `OrphanSuspects`: a blob whose hash no ``accepted``/``quarantine`` row
has named is a GC candidate once it is older than the retry horizon (the GC marks it;
only an audit's listing can prove it unreferenced, PROTOCOL §3.5). Suspects live in
memory, bounded: a restart or an overflow loses some, and the audit's listing merge
finds those orphans instead.

Requests per pass grow with the new segments and records, never with history: one LIST
from the position, one GET per segment, one GET per new record, one catalog file and
one marker per hour touched per chunk, one checkpoint write per chunk.

The position never moves past the store's present (a collector whose clock runs ahead
must not make the pass skip other collectors' segments); a segment from the future is
remembered by name instead.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

from index.log_reader import LogPosition, new_segments, read_segment
from index.rows import IndexFileError
from protocol import keys
from protocol.records import IndexCheckpoint, RecordError
from store.base import ObjectStore
from store.cas import update_object
from store.errors import NotFound, StoreError
from store.lease import LeaseLost

from .cataloger import CatalogBatch, Cataloger
from .context import ReconcilerContext
from .problems import ProblemBook

CHUNK_RECORDS = 2_000  # records read and cataloged before the checkpoint moves
MAX_SUSPECTS = 1_000_000
NS_PER_S = 1_000_000_000


@dataclass
class SteadyResult:
    accepted_rows: int = 0
    segments_read: int = 0
    records_read: int = 0
    rows_cataloged: int = 0
    catalog_files: int = 0
    missing: int = 0
    problems: int = 0
    failed: int = 0
    complete: bool = True
    checkpoint: IndexCheckpoint | None = None


class OrphanSuspects:
    """Blob hashes from ``blob`` rows that no record row has referenced yet (bounded)."""

    def __init__(self, max_entries: int = MAX_SUSPECTS) -> None:
        self._max = max_entries
        self._created: dict[str, int] = {}
        self._recent_refs: dict[str, int] = {}
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._created)

    def blob(self, sha: str, created_ns: int) -> None:
        if sha in self._recent_refs or sha in self._created:
            return
        if len(self._created) >= self._max:
            self.dropped += 1
            return
        self._created[sha] = created_ns

    def referenced(self, sha: str, at_ns: int) -> None:
        self._created.pop(sha, None)
        if len(self._recent_refs) < self._max:
            self._recent_refs[sha] = at_ns

    def forget_refs_before(self, horizon_ns: int) -> None:
        self._recent_refs = {s: t for s, t in self._recent_refs.items() if t >= horizon_ns}

    def recently_referenced(self, sha: str) -> bool:
        return sha in self._recent_refs

    def take_older_than(self, horizon_ns: int) -> list[tuple[str, int]]:
        """Hand over (and forget) the suspects created before ``horizon_ns``."""
        taken = sorted((s, t) for s, t in self._created.items() if t < horizon_ns)
        for sha, _created in taken:
            del self._created[sha]
        return taken


@dataclass
class _Chunk:
    record_keys: list[str] = field(default_factory=list)
    segments: list[tuple[str, int]] = field(default_factory=list)
    accepted_rows: int = 0


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
        self._recent_keys: dict[int, int] = {}  # digest of a cataloged key -> its row time
        self._position: LogPosition | None = None  # as last saved by this scanner

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
        async for info, name in new_segments(
            ctx.store, position, lookback_s=ctx.settings.reconciler.lookback_s
        ):
            if ctx.stopping.is_set():
                result.complete = False
                break
            if not await self._read_into(chunk, info.key, problems, result):
                result.complete = False
                break
            chunk.segments.append((info.key, name.first_time_ns))
            if len(chunk.record_keys) >= CHUNK_RECORDS:
                committed = await self._commit(chunk, position, cataloger, result, now_ns)
                chunk = _Chunk()
                if not committed:
                    break
        await self._commit(chunk, position, cataloger, result, now_ns)
        self.suspects.forget_refs_before(now_ns - self._lookback_ns)
        self._forget_keys_before(now_ns - self._lookback_ns)
        ctx.metrics.steady_passes.labels("complete" if result.complete else "incomplete").inc()
        if position.through_ns:
            ctx.metrics.log_lag.set(max(0.0, (now_ns - position.through_ns) / 1e9))
        return result

    async def _read_into(
        self, chunk: _Chunk, key: str, problems: ProblemBook, result: SteadyResult
    ) -> bool:
        try:
            rows = await read_segment(self._ctx.store, key)
        except NotFound:
            return True  # deleted after its consumption by an earlier leader: nothing new
        except IndexFileError as exc:
            await problems.record("unreadable-index-file", key, str(exc))
            result.problems += 1
            return True  # its records are the audit's to find; never block the log on it
        except StoreError as exc:
            self._ctx.log.warning("log_segment_read_failed", key=key, error=str(exc))
            self._ctx.metrics.store_failures.labels("log_segment").inc()
            result.failed += 1
            return False
        result.segments_read += 1
        self._ctx.metrics.log_segments.inc()
        accepted = sum(row.kind == "accepted" for row in rows)
        result.accepted_rows += accepted
        chunk.accepted_rows += accepted
        for row in rows:
            if row.kind == "blob":
                self.suspects.blob(row.frame_sha256, row.time_unix_ns)
                continue
            for sha in row.referenced_shas:
                self.suspects.referenced(sha, row.time_unix_ns)
            digest = _digest(row.key)
            if digest not in self._recent_keys:
                self._recent_keys[digest] = row.time_unix_ns
                chunk.record_keys.append(row.key)
        return True

    async def _commit(
        self,
        chunk: _Chunk,
        position: LogPosition,
        cataloger: Cataloger,
        result: SteadyResult,
        now_ns: int,
    ) -> bool:
        if not chunk.segments:
            return True
        try:
            batch: CatalogBatch = await cataloger.read(chunk.record_keys)
        except BaseException:
            for key in chunk.record_keys:  # not cataloged: read them again next pass
                self._recent_keys.pop(_digest(key), None)
            raise
        result.records_read += len(chunk.record_keys)
        result.missing += batch.missing
        result.problems += batch.problems
        if batch.failed:
            for key in batch.failed:  # read again next pass
                self._recent_keys.pop(_digest(key), None)
            result.failed += len(batch.failed)
            result.complete = False
        try:
            written = await cataloger.commit(batch.rows)
        except StoreError as exc:
            self._ctx.log.warning("catalog_write_failed", error=str(exc))
            self._ctx.metrics.store_failures.labels("catalog_write").inc()
            for key in chunk.record_keys:
                self._recent_keys.pop(_digest(key), None)
            result.failed += 1
            result.complete = False
            return False
        result.rows_cataloged += len(batch.rows)
        result.catalog_files += len(written)
        if batch.failed:
            return False  # the position stays before these segments: read them again
        lookback = self._lookback_ns
        for key, first_ns in chunk.segments:
            position.consumed(key, min(first_ns, now_ns), lookback)
        totals = {
            "segments": len(chunk.segments),
            "accepted_rows": chunk.accepted_rows,
            "records_read": len(chunk.record_keys),
            "catalog_files": len(written),
            "markers": len(written),
            "checkpoints": 1,
        }
        result.checkpoint = await self._save(position, totals)
        # This term's leader is the checkpoint's only writer: keep the position for the
        # next pass (no GET) unless the save failed, which leaves memory ahead of the store.
        self._position = position if result.checkpoint is not None else None
        return result.checkpoint is not None

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

    def _forget_keys_before(self, horizon_ns: int) -> None:
        self._recent_keys = {d: t for d, t in self._recent_keys.items() if t >= horizon_ns}


def _digest(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
