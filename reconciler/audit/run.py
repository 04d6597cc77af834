"""Full audit of ``accepted/v1/``, ``quarantine/v1/``, ``raw-blobs/v1/`` and ``raw-bundles/v1/``
against the catalog, as out-of-core joins (PROTOCOL §3.7, §3.9, §3.10); resumable.

1. **Catalog**: the catalog files are listed and copied into the audit's spill directory
   (`fetch_catalog`: only files the audit pinned, ``pin_expires_at_unix_ns`` in its
   record, renewed at each save; compaction deletes no pinned file, PROTOCOL §3.7). A
   pinned file that is gone stops the audit incomplete (never "no rows"); one that is not
   an index file is moved aside and reported (``unreadable-index-file``): its rows then
   count as missing, so this audit catalogs its records again.
2. **Listing** (`reconciler.audit.listing`): every range of the four prefixes into Parquet
   listing parts in the store (``keys.audit_listing_prefix``), or, with an S3 Inventory,
   the records' parts from the report and the raw objects listed; copied to the spill.
3. **Joins** (`reconciler.audit.engines.duckdb_joins`, SQL in `reconciler.audit.engines.sql`), DuckDB under
   half of ``audit_memory_limit_mb`` (the process needs the rest), spilling to disk:
   the record join first, acted on in bounded batches (`reconciler.audit.records_act`:
   records to read and catalog, ETag differences and keys in two hours or with two hashes
   read and superseded, phantom-row candidates); then the blob join, which counts the
   rows just written as references, by raw key (`reconciler.audit.blobs_act`: missing
   blobs, bad ranges, bundles' dead bytes, the orphan file for the GC). Accepted rows of
   hours raw retention retired (`reconciler.gc.raw_retention`, `reconciler.audit.retired`)
   keep no raw object alive: orphans flagged ``raw_retention``, never missing.
4. A listing audit then reports ``phantom-row``s (an inventory may lack recent objects).
SHA-256 verification (`reconciler.audit.blob_verify`) runs alongside in rate-limited rounds.

**What a completed audit promises** (what the GC's rules 1, 2 and 5 rely on, PROTOCOL
§3.5): every accepted manifest and quarantine record that existed when the audit started
(``started_at_unix_ns``, the original start if it was resumed) is in the catalog — it was
in the catalog files the audit read, or this audit cataloged it; every blob the listing
showed unreferenced and older than the horizon is in its orphan file; the listing was
taken after the start. A listed record that is unreadable or not well-formed is a problem
record, and the GC deletes nothing while such problems exist.

**Cost**: the catalog's files (one GET each), the listings (one LIST per 1,000 keys, one
PUT per listing part of 250k keys and one GET of it), and one GET per record the catalog
lacks or holds otherwise: known records cost nothing more. Disk: the spill directory
(``reconciler.audit_spill_dir``, removed when the audit ends).

**Resume** (`audit_records.resume_or_start`: same ``audit_id``, same original start): the
listing resumes by ranges (a range with its final part is never listed again by the same
audit); the catalog is copied again (rows this audit cataloged before the crash are then
known, so nothing is read twice) and the joins run again over all the parts: they cost
minutes of one machine's CPU where the listing costs hours of requests at scale. It is
marked ``completed`` only if every record the join named was read and cataloged and the
blob join finished; otherwise it stays ``running`` and the next call resumes it.

**Progress** in the record: ``manifests_seen``/``quarantines_seen`` count the listed
records checked so far (those the join found in order at once, then the others as they
are acted on), ``cataloged`` the rows written; `AuditProgress.groups_done` is the
listing's ranges done.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import ParamSpec, TypeVar

from index import catalog
from protocol import keys
from protocol.records import AuditRecord, CatalogCreated
from reconciler.audit import blobs_act
from reconciler.audit.audit_inputs import (
    CatalogCopy,
    PinnedCatalog,
    copy_parts,
    fetch_pinned_catalog,
)
from reconciler.audit.blob_verify import VERIFY_CURSOR
from reconciler.audit.engines.duckdb_joins import (
    AuditJoins,
    JoinLimits,
    JoinResults,
    iter_batches,
)
from reconciler.audit.engines.engine import EngineJoins
from reconciler.audit.inventory import InventorySource
from reconciler.audit.listing import (
    ListingParts,
    list_for_audit,
    parts_from_inventory,
    with_inventory,
)
from reconciler.audit.offload import offload
from reconciler.audit.progress import PROGRESS_INTERVAL_S as PROGRESS_INTERVAL_S
from reconciler.audit.progress import PROGRESS_RECORDS as PROGRESS_RECORDS
from reconciler.audit.progress import AuditProgress as AuditProgress
from reconciler.audit.progress import ProgressCallback as ProgressCallback
from reconciler.audit.ranges import KINDS, RAW_KINDS, ListingKind, previous_keys
from reconciler.audit.records import (
    latest_audit,
    latest_completed_audit,
    resume_or_start,
)
from reconciler.audit.records_act import CHUNK, ChunkResult, RecordActs, retraction_rows
from reconciler.audit.retired import settle_retired
from reconciler.audit.run_state import AuditState
from reconciler.audit.spill import spill_directory
from reconciler.cataloger import CatalogBatch
from reconciler.context import ReconcilerContext
from reconciler.gc.raw_retention import Retired, retired_for_audit
from store.errors import StoreError

P = ParamSpec("P")
T = TypeVar("T")

__all__ = [
    "VERIFY_CURSOR",
    "AuditProgress",
    "AuditRun",
    "latest_audit",
    "latest_completed_audit",
    "run_full_audit",
]


async def run_full_audit(
    ctx: ReconcilerContext,
    *,
    progress: ProgressCallback | None = None,
    inventory: InventorySource | None = None,
    progress_interval_s: float = PROGRESS_INTERVAL_S,
) -> AuditRecord:
    """Run (or resume) a full audit and return its final record.

    ``status == "completed"`` only when it finished with every catalog write done; otherwise
    ``running`` (call again to resume). This is the local engine (``audit_engine =
    "local"``; the daemon's scheduled audits run here whatever the setting, the Spark
    engine is `reconciler.audit.engines.spark_run`). Raises `LeaseLost` (stop: no longer the
    leader), `InventoryError`, and store errors met while creating the record."""
    record, resumed = await resume_or_start(ctx, inventory)
    run = AuditRun(ctx, record, resumed, progress, progress_interval_s, inventory)
    return await run.perform()


class AuditRun(AuditState):
    """The phases of one run (see module); the Spark engine's run
    (`reconciler.audit.engines.spark_run.SparkAuditRun`) lists and joins otherwise and shares the
    rest: `perform`, the acts on the join results, `finish`."""

    async def perform(self) -> AuditRecord:
        """The whole run: pin, `execute` in a spill directory while progress is saved, then
        the final record."""
        ctx = self._ctx
        ctx.metrics.audit_running.set(1)
        try:
            await self.problems.load()
            if not await self.pin():
                return await self.finish()
            with spill_directory(ctx.settings.reconciler.audit_spill_dir) as spill:
                async with self.saving():
                    await self.execute(spill)
            return await self.finish()
        finally:
            ctx.metrics.audit_running.set(0)

    async def _work(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """A join or a result file's work: in a thread when its inputs are big enough
        (`offload`)."""
        return await offload(self._input_bytes, fn, *args, **kwargs)

    async def execute(self, spill: str) -> None:
        """Catalog, then (blob verification alongside) listing, joins, acts (see module);
        sets ``failed``/``stopped``."""
        ctx = self._ctx
        try:
            names = await self.list_catalog()
            self.spill_dir = spill
            pinned = await self.run_phase(
                fetch_pinned_catalog(ctx, self.problems, names, spill, self._streams)
            )
            self.count_requests("GET", len(names))
        except StoreError as exc:
            self._store_failure("audit_catalog", exc)
            return
        if pinned is None:
            self.failed = not self.stopped  # a pinned file is gone: incomplete
            return
        if not self._going():
            return
        memory_mb = max(64, ctx.settings.reconciler.audit_memory_limit_mb // 2)
        with AuditJoins({}, pinned.copies, spill, memory_limit_mb=memory_mb) as joins:
            self._joins = joins
            try:
                async with self.verifier.running(), self.bundle_verifier.running():
                    await self._list_join_and_act(joins, pinned, spill)
            finally:
                self._joins = None

    async def list_catalog(self) -> list[str]:
        """The catalog's files (the pin covers them all, `pin`), then the pin narrowed to
        the files last modified by now plus the clock skew allowed (saved at the next
        checkpoint); the LIST requests counted. Either engine's first step. Raises
        `StoreError`."""
        ctx = self._ctx
        names = [info.key async for info in catalog.list_all_files(ctx.store)]
        self._pinned_through = ctx.clock.now_ns() + int(ctx.settings.store.max_clock_skew_s * 1e9)
        self._last_save = float("-inf")  # save the narrowed pin at the next checkpoint
        self.count_requests("LIST", 1 + len(names) // 1000)
        return names

    async def _list_join_and_act(
        self, joins: AuditJoins, pinned: PinnedCatalog, spill: str
    ) -> None:
        ctx = self._ctx
        try:
            listing = await self.run_phase(self._list())
            if listing is None or not self._going():
                return
            self._keys_listed = {kind: int(n) for kind, n in listing.keys_listed.items()}
            self.count_requests("LIST", listing.list_requests)
            local = await self.run_phase(copy_parts(ctx.store, listing, spill, self._streams))
            if local is None or not self._going():
                return
            self.count_requests("GET", sum(len(paths) for paths in local.values()))
            retired = await retired_for_audit(ctx.store)
        except StoreError as exc:
            self._store_failure("audit_listing", exc)
            return
        self._input_bytes = _total_size(
            [*(c.path for c in pinned.copies), *(p for paths in local.values() for p in paths)]
        )
        joins.set_listing(local)
        await self._join_and_act(joins, pinned.copies, pinned.unreadable, retired, spill)

    async def _list(self) -> ListingParts:
        ctx = self._ctx
        audit_dir = keys.audit_listing_prefix(
            self._record.started_at_unix_ns, self._record.audit_id
        )
        kinds: tuple[ListingKind, ...] = KINDS if self._inventory is None else RAW_KINDS
        listed = await list_for_audit(
            ctx.store,
            audit_dir,
            concurrency=self._streams,
            progress=self._listed,
            kinds=kinds,
            previous=previous_keys(self._cursors),
        )
        if self._inventory is None:
            return listed
        return with_inventory(
            listed, await parts_from_inventory(ctx.store, audit_dir, self._inventory)
        )

    async def _listed(self, done: int, total: int) -> None:
        self._ranges_done, self.ranges_total = done, total
        self._report()
        await self.checkpoint()

    async def _join_and_act(
        self,
        joins: EngineJoins,
        copies: list[CatalogCopy],
        unreadable: list[tuple[str, str]],
        retired: Retired,
        spill: str,
    ) -> None:
        ctx = self._ctx
        start = self._record.started_at_unix_ns
        margin = int(ctx.settings.settle_margin_s() * keys.NS_PER_S)
        horizon = int(ctx.settings.gc.retry_horizon_s * keys.NS_PER_S)
        # An inventory's records all existed at its creation (the audit's start): none is
        # left to the steady pass as younger.
        born_before = start + margin if self._inventory is None else 2**63 - 1
        limits = JoinLimits(
            born_before,
            start - margin,
            ctx.clock.now_ns() - horizon,
            reread_repeated=bool(self._record.reread_ranks),
        )
        acts = RecordActs(ctx, self._cataloger, self.problems, os.path.join(spill, "added"))
        try:
            aside = [name for name, _why in unreadable]
            await settle_retired(joins, copies, aside, retired, self.problems)
            results = await self.run_phase(self._work(joins.run_records, limits), joins.interrupt)
            if results is None or not self._going():
                return
            pending = joins.pending(results)
            self._manifests = results.listed_old.get("accepted", 0) - pending.get("accepted", 0)
            self._quarantines = results.listed_old.get("quarantine", 0) - pending.get(
                "quarantine", 0
            )
            self._report()
            if not await self._act_on_records(acts, results):
                return
            limits = replace(limits, orphan_before_ns=ctx.clock.now_ns() - horizon)
            blobs = self._work(joins.run_blobs, limits, results, acts.added)
            if await self.run_phase(_done(blobs), joins.interrupt) is None or not self._going():
                return
            await self._act_on_blobs(joins, acts, results, spill)
            if self._blobs is not None and self._inventory is None:
                self._phantoms = await acts.finish_phantoms()
                self._problem_count += self._phantoms
                await self._write_retractions(joins, acts.retracted_candidates)
        except StoreError as exc:
            self._store_failure("audit_acts", exc)

    async def _act_on_records(self, acts: RecordActs, results: JoinResults) -> bool:
        chunk: list[dict[str, object]] = []
        for batch in iter_batches(results.records):
            for entry in batch.to_pylist():
                chunk.append(entry)
                if len(chunk) >= CHUNK and not await self._act_chunk(acts, chunk):
                    return False
                if len(chunk) >= CHUNK:
                    chunk = []
        return await self._act_chunk(acts, chunk)

    async def _act_chunk(self, acts: RecordActs, chunk: list[dict[str, object]]) -> bool:
        """Read and write what ``chunk`` names; False when the audit cannot go on."""
        if not chunk:
            return self._going()
        result = await acts.process(chunk)  # each GET takes one of our slots
        batch = result.batch
        if not await self._commit(result):
            return False
        await acts.written_ok(result)
        self._manifests += result.seen.get("accepted", 0)
        self._quarantines += result.seen.get("quarantine", 0)
        self._problem_count += batch.problems
        self._report()
        if batch.failed:
            self.failed = True
            return False
        await self.checkpoint()
        return self._going()

    async def _write_retractions(self, joins: EngineJoins, retracted: list[str]) -> None:
        """The retracted rows of the retracted phantom candidates (PROTOCOL §3.7), in this
        audit's files (its markers, re-marked like its other files after a kill)."""
        if not retracted:
            return
        rows = await retraction_rows(self._ctx, joins, retracted)
        if rows and await self._commit(ChunkResult(CatalogBatch(rows), [])):
            self._ctx.log.info("retractions_written", keys=len(set(retracted)), rows=len(rows))

    async def _commit(self, result: ChunkResult) -> bool:
        rows = result.batch.rows
        try:
            async with self._limit:
                await self._cataloger.commit(
                    rows, writer=CatalogCreated.audit_writer(self._record.audit_id)
                )
        except StoreError as exc:
            self._ctx.metrics.store_failures.labels("catalog_write").inc()
            self._ctx.log.warning("audit_catalog_write_failed", error=str(exc))
            self.failed = True
            return False
        self._cataloged += len(rows)
        return True

    async def _act_on_blobs(
        self, joins: EngineJoins, acts: RecordActs, results: JoinResults, spill: str
    ) -> None:
        """Missing blobs (confirmed, superseded where the record names another hash,
        recorded), then the orphan file (`reconciler.audit.blobs_act`)."""
        ctx = self._ctx
        missing = await blobs_act.confirm_missing(ctx, results)
        batch, mismatched = await blobs_act.supersede_for_missing(
            acts, self._cataloger, joins, missing
        )
        result = ChunkResult(batch, mismatched)
        if not await self._commit(result):
            return
        await acts.written_ok(result)
        kept = {raw_key for row in batch.rows for raw_key in row.referenced_raw_keys}
        path = os.path.join(spill, "orphans.parquet")
        orphans = await self._work(joins.write_orphans, results, path, keep=kept)
        body = await self._work(_read_bytes, path)
        await ctx.check_fence()
        record = self._record
        await ctx.store.put(
            keys.audit_orphans_key(record.started_at_unix_ns, record.audit_id), body
        )
        self._problem_count += await blobs_act.record_missing_blobs(
            ctx.store, self.problems, missing
        )
        self._problem_count += await blobs_act.record_bad_ranges(self.problems, results)
        self._blobs = {"blobs_listed": results.blobs_listed, "orphans": orphans}
        self._blobs.update(await self._work(blobs_act.blob_counts, joins, results))
        ctx.log.info(
            "audit_blobs_joined", missing=len(missing), reasons=results.reasons, **self._blobs
        )


async def _done(work: Awaitable[None]) -> bool:
    await work
    return True


def _total_size(paths: list[str]) -> int:
    return sum(os.path.getsize(path) for path in paths)


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()
