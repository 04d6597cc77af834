"""Problem records: things the reconciler cannot repair and a human must look at.

One record per (kind, subject) at ``problem_key(kind, subject_key)`` (`ProblemRecord`):
created with If-None-Match on first sight; later sightings move ``last_seen`` forward
(best effort, If-Match). When a subject later checks out fine (the blob reappeared, the
manifest parses), its record is removed, so the set of records is the set of problems
as of each subject's latest check.

Kinds (``PROBLEM_KINDS``): ``missing-blob`` (subject: the raw-blob key; the detail names
a record that references it) and ``corrupt-blob`` (the detail says whether the catalog
references it), ``unparseable-manifest`` and ``unparseable-quarantine`` (subject: the
record's key), ``unreadable-index-file`` (subject: a log segment that does not decode, or
a catalog file, which is then moved aside), ``raw-retention-mismatch`` (subject: a
retired accepted hour's catalog prefix whose batches no longer match the rollup ledger,
so its raw blobs are kept: `reconciler.gc.raw_retention`), ``catalog-mismatch`` (subject:
a record whose catalog row differed from the store's record, until the audit's
superseding row is written: `reconciler.audit.records_act`), ``phantom-row`` (subject: a
cataloged record the store does not hold; closed by a later audit that lists it or by
``lm-reconciler retract``: `reconciler.retractions`). The rollup records
``identity-mismatch`` and ``overlapping-identity`` (subject: the raw blob; batches it left
out, PROTOCOL §3.7) and ``bad-range`` (subject: the bundle; a record whose range does
not hold its frame and whose bundle's index has no good entry of its hash, PROTOCOL
§3.10; the full audit records it too for a range past the bundle's listed size,
`reconciler.audit.blobs_act`). ``gc-guard`` and
``unreadable-gc-mark`` (subject: a GC mark that does not parse; collectors wait on it
as on a deletion under way, and the GC removes it after the settle time: nothing to do
unless it stays) belong to the GC (`reconciler.gc.problems`). `ADVICE` says what an
operator does about each kind (``lm-reconciler problems``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

from protocol import keys
from protocol.records import ProblemRecord, RecordError
from reconciler import store_calls
from reconciler.context import ReconcilerContext
from store.base import ObjectStore
from store.errors import NotFound, StoreError

ADVICE = {
    "missing-blob": "a record references a raw blob that does not exist: restore it from a "
    "backup if there is one; resolved when an audit sees the blob again",
    "corrupt-blob": "a raw blob fails its hash: restore it from a backup; it is never deleted",
    "unparseable-manifest": "the GC deletes nothing meanwhile: repair or restore the manifest; "
    "resolved when a read finds it well-formed",
    "unparseable-quarantine": "the GC deletes nothing meanwhile: repair or restore the "
    "quarantine record; resolved when a read finds it well-formed",
    "gc-guard": "the GC refused a run deleting more than gc.max_delete_fraction: check the "
    "audit's orphan file, then delete this record to let the GC go on",
    "unreadable-index-file": "the file was moved aside (index/v1/unreadable/) and the next "
    "audit catalogs its records again; keep it for diagnosis, then delete this record",
    "raw-retention-mismatch": "the hour's catalog and the rollup ledger disagree: run "
    "lm-rollup verify and rebuild the hour; its raw blobs are kept until they agree",
    "malformed-log-row": "a collector wrote a bad index log row (a bug: report it); the next "
    "audit catalogs the record itself; delete this record once the collector is fixed",
    "catalog-mismatch": "the GC deletes nothing meanwhile: the next audit writes the store's "
    "record as a superseding row and resolves this; if the rollup ledger holds the old "
    "fields, lm-rollup verify names the hour to rebuild",
    "phantom-row": "the GC deletes nothing meanwhile: the catalog holds a row for a record the "
    "store does not have (a collector bug, or a deleted record). Find out why; restore the "
    "record (the next audit lists it) or run lm-reconciler retract KEY --reason TEXT",
    "identity-mismatch": "the rollup left a batch out: its catalog row names a frame whose "
    "header is another batch (a phantom row naming a real frame?). Look at the key; retract "
    "it if the store does not hold it (lm-reconciler retract KEY --reason TEXT)",
    "bad-range": "a reader left a batch out: its record names a range of a bundle that does "
    "not hold its frame, and the bundle's index has no good entry of its hash (a collector "
    "bug, or a damaged bundle); its hour stays unsealed. If the frame is nowhere else, "
    "lm-rollup acknowledge-lost MANIFEST_KEY records it as lost",
    "overlapping-identity": "the rollup left a batch out: its seq range overlaps an included "
    "batch of the same agent and boot under another identity (an agent bug?); its points "
    "are not counted until this is understood and the batch retracted or the hour rebuilt",
}
"""What to do about each kind of problem (shown by ``lm-reconciler problems``)."""

# Problems are meant to be few; past this many, records are still written but no longer
# all remembered, so some fixed ones wait for a human to clear them.
MAX_REMEMBERED = 100_000


class ProblemBook:
    """Records and resolves problems for one pass or audit. The existing records are
    listed once, when first needed (`load`): a pass that reads no record lists nothing."""

    def __init__(self, ctx: ReconcilerContext) -> None:
        self._ctx = ctx
        self._known: set[str] = set()
        self._loaded = False
        self._loading = asyncio.Lock()  # records are read concurrently: list them once
        self.found: Counter[str] = Counter()

    async def load(self) -> None:
        """Remember which problem records exist, so `resolve` costs nothing when none does."""
        self._known.clear()
        async for info in self._ctx.store.list(keys.RECONCILER_PROBLEMS_PREFIX):
            if len(self._known) >= MAX_REMEMBERED:
                break
            self._known.add(info.key)
        self._loaded = True

    async def _load_once(self) -> bool:
        """Whether the records are known (listed now or before). A listing that fails is
        logged and tried again at the next need: resolving is cleanup, and must never fail
        the check of a record (the record is cataloged all the same)."""
        async with self._loading:
            if not self._loaded:
                try:
                    await self.load()
                except StoreError as exc:
                    self._ctx.metrics.store_failures.labels("problem").inc()
                    self._ctx.log.warning("problem_list_failed", error=str(exc))
                    return False
        return True

    async def record(self, kind: str, subject_key: str, detail: str) -> None:
        """Report a problem (store errors are logged and swallowed: it is found again later)."""
        ctx = self._ctx
        self.found[kind] += 1
        ctx.metrics.problems.labels(kind).inc()
        ctx.log.warning("reconciler_problem", kind=kind, subject=subject_key, detail=detail)
        key = keys.problem_key(kind, subject_key)
        now = ctx.clock.now_ns()
        record = ProblemRecord(
            kind=kind,
            subject_key=subject_key,
            detail=detail,
            first_seen_unix_ns=now,
            last_seen_unix_ns=now,
        )
        await ctx.check_fence()
        try:
            outcome = await store_calls.create_if_absent(ctx, key, record.to_json())
            self._known.add(key)
            if outcome is store_calls.Created.EXISTED:
                await self._touch(key, detail, now)
        except StoreError as exc:
            ctx.metrics.store_failures.labels("problem").inc()
            ctx.log.warning("problem_record_failed", key=key, error=str(exc))

    async def resolve(self, kind: str, subject_key: str) -> None:
        """The subject checked out fine: remove its record of ``kind``, if there is one."""
        key = keys.problem_key(kind, subject_key)
        if not await self._load_once() or key not in self._known:
            return
        ctx = self._ctx
        await ctx.check_fence()
        try:
            await ctx.store.delete(key)
        except StoreError as exc:
            ctx.log.warning("problem_resolve_failed", key=key, error=str(exc))
            return
        self._known.discard(key)
        ctx.metrics.problems_resolved.labels(kind).inc()
        ctx.log.info("reconciler_problem_resolved", kind=kind, subject=subject_key)

    async def subjects(self, kind: str) -> AsyncIterator[str]:
        """The subjects of the open problems of ``kind`` (reads only when any exist)."""
        prefix = f"{keys.RECONCILER_PROBLEMS_PREFIX}{kind}/"
        if not await self._load_once() or not any(key.startswith(prefix) for key in self._known):
            return
        async for _key, record in list_problems(self._ctx.store, kind):
            if record is not None:
                yield record.subject_key

    async def _touch(self, key: str, detail: str, now: int) -> None:
        # One attempt: a lost race means another sighting just updated it.
        store = self._ctx.store
        try:
            body, etag = await store.get(key)
            current = ProblemRecord.from_json(body)
            updated = current.model_copy(update={"last_seen_unix_ns": now, "detail": detail})
            await store.put(key, updated.to_json(), if_match=etag)
        except (RecordError, StoreError):
            pass  # NotFound (resolved meanwhile), PreconditionFailed (lost the race), ...


async def list_problems(
    store: ObjectStore, kind: str | None = None
) -> AsyncIterator[tuple[str, ProblemRecord | None]]:
    """Every problem record (key, record; ``None`` when unreadable), in key order."""
    prefix = keys.RECONCILER_PROBLEMS_PREFIX + (f"{kind}/" if kind else "")
    async for info in store.list(prefix):
        try:
            body, _etag = await store.get(info.key)
        except NotFound:
            continue  # resolved while we listed
        try:
            yield info.key, ProblemRecord.from_json(body)
        except RecordError:
            yield info.key, None


async def count_problems(store: ObjectStore) -> Counter[str]:
    """Problem records by kind (from their keys; no bodies are read)."""
    counts: Counter[str] = Counter()
    async for info in store.list(keys.RECONCILER_PROBLEMS_PREFIX):
        kind = info.key[len(keys.RECONCILER_PROBLEMS_PREFIX) :].split("/", 1)[0]
        counts[kind] += 1
    return counts
