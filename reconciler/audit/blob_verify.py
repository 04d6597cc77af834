"""SHA-256 verification of raw blobs while a full audit runs: `BlobVerifier`.

Raw blobs are content-addressed (``raw-blobs/v1/sha256/<hh>/<hh>/<sha256>.lmbatch``), so
a blob is verified by reading it and hashing it against its own key; no manifest is
needed. The verifier walks ``raw-blobs/v1/sha256/`` in key order from a cursor, at most
``verify_rate_per_s`` blobs per second (`TokenBucket`), with its own share of the audit's
``concurrency`` (an eighth, at least one request in flight: the walk cannot starve it),
for as long as the audit's walk runs; then it stops where it is. The walk, cursor and
round are `reconciler.verify_walk.CursorWalk`'s, shared with the bundles' verifier.

**Cursor**: ``AuditRecord.cursors[VERIFY_CURSOR]``: the last blob key up to which every
blob was verified (``""``: start from the beginning). It is saved with the
audit's progress, kept when the audit completes, and carried into the next audit's record
when that one starts, so verification resumes after a crash and continues across audits.
When the walk reaches the end of ``raw-blobs/v1/`` the round is complete: the cursor goes
back to ``""`` and this audit verifies nothing more (at most one round per audit). An
audit whose walk ends before its verifier moved at all waits for one blob (or the end of
the round), so every audit that is not stopped moves verification on.
Every blob that exists for a whole round is verified in that round; a round takes about
``<number of blobs> / verify_rate_per_s`` seconds of audit time, so it may span several
audits.

**Problems**: a blob whose SHA-256 differs from its key becomes a ``corrupt-blob`` problem
(subject: the blob key; the detail says whether the catalog references it, from the
audit's in-memory set of referenced hashes — naming the referencing record would mean
reading catalog files per corrupt blob, so ``lm-reconciler problems`` leaves that to the
operator). A blob that verifies resolves an open ``corrupt-blob`` problem. Missing blobs
are the audit's blob join's business (`reconciler.audit.blobs_act`): a blob deleted between
listing and reading is skipped. A store error stops verification for this audit (logged
and counted); it never keeps the audit from completing.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable

from protocol import keys
from reconciler import store_calls
from reconciler.audit.rate import TokenBucket
from reconciler.context import ReconcilerContext
from reconciler.problems import ProblemBook
from reconciler.verify_walk import CursorWalk
from store.base import ObjectInfo

VERIFY_CURSOR = "verify:" + keys.RAW_BLOBS_PREFIX
"""Key of the verification cursor in `AuditRecord.cursors`."""
CHUNK = 8  # blobs read concurrently; the cursor moves past a chunk once all are verified
_HASH_IN_THREAD_BYTES = 1 << 20


class BlobVerifier(CursorWalk):
    """Verifies blobs from ``cursor`` on, ``CHUNK`` at a time; `run` until cancelled or
    the round ends (`reconciler.verify_walk.CursorWalk`)."""

    PREFIX = keys.RAW_BLOBS_PREFIX
    NAME = "blob"
    CHUNK = CHUNK
    WAITS_FOR_PROGRESS = True
    """The first blob needs no wait for the rate (a new bucket starts full), so this
    costs at most one blob read, and guarantees every audit some progress."""

    def __init__(
        self,
        ctx: ReconcilerContext,
        problems: ProblemBook,
        *,
        cursor: str,
        limit: asyncio.Semaphore,
        is_referenced: Callable[[str], bool],
        after_wait: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(ctx, problems, cursor=cursor, after_wait=after_wait)
        self._limit = limit
        self._is_referenced = is_referenced
        self._bucket = TokenBucket(
            rate_per_s=ctx.reconciler_settings.verify_rate_per_s, clock=ctx.clock
        )

    async def verify(self, info: ObjectInfo) -> None:
        blob_key = info.key
        try:
            sha = keys.parse_raw_blob_key(blob_key)
        except keys.KeyFormatError:
            return  # not a blob this protocol writes: not ours to judge
        await self._bucket.acquire()
        await self.waited()
        async with self._limit:
            body = await store_calls.read(self._ctx, blob_key)
        if body is None:
            return  # deleted since it was listed
        if len(body) >= _HASH_IN_THREAD_BYTES:
            actual = await asyncio.to_thread(lambda: hashlib.sha256(body).hexdigest())
        else:
            actual = hashlib.sha256(body).hexdigest()
        self.verified += 1
        if actual == sha:
            await self._problems.resolve("corrupt-blob", blob_key)
            return
        self.problems += 1
        referenced = (
            "referenced by the catalog"
            if self._is_referenced(sha)
            else "no catalog row references it"
        )
        await self._problems.record(
            "corrupt-blob",
            blob_key,
            f"raw blob ({len(body)} bytes) hashes to {actual}; {referenced}",
        )


def split_concurrency(concurrency: int) -> tuple[asyncio.Semaphore, asyncio.Semaphore]:
    """Slots for the records' requests and for blob verification, ``concurrency`` in all.
    Verification gets its own eighth (at least one), so the walk's queue of requests cannot
    starve it; with a single slot both share it."""
    if concurrency < 2:
        shared = asyncio.Semaphore(concurrency)
        return shared, shared
    verify = max(1, concurrency // 8)
    return asyncio.Semaphore(concurrency - verify), asyncio.Semaphore(verify)
