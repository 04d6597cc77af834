"""Problem records the GC writes (``reconciler/v1/problems/``, `protocol.records.ProblemRecord`).

The GC works on a store, not on a `reconciler.context.ReconcilerContext`, so it keeps this
small book of its own: ``record`` creates the record once (If-None-Match) and returns when
the problem was first seen (store time), which is what the GC's waits count from; later
sightings leave the record as it is. ``resolve`` removes it. Kinds: ``gc-guard``,
``unreadable-gc-mark``, ``corrupt-blob``, ``unparseable-manifest``,
``unparseable-quarantine`` (`keys.PROBLEM_KINDS`; `reconciler.problems` describes them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from protocol import keys, records
from store.base import ObjectStore
from store.errors import NotFound, PreconditionFailed

log = structlog.get_logger("reconciler.gc")


class GcProblems:
    def __init__(
        self, store: ObjectStore, now_ns: Callable[[], int], fence: Callable[[], Awaitable[None]]
    ) -> None:
        self._store = store
        self._now_ns = now_ns
        self._fence = fence

    async def record(self, kind: str, subject_key: str, detail: str) -> int:
        """Record the problem unless it is recorded; when it was first seen (store time).
        Store errors propagate (the caller skips the item: nothing is decided)."""
        key = keys.problem_key(kind, subject_key)
        now = self._now_ns()
        problem = records.ProblemRecord(
            kind=kind,
            subject_key=subject_key,
            detail=detail,
            first_seen_unix_ns=now,
            last_seen_unix_ns=now,
        )
        await self._fence()
        try:
            await self._store.put(key, problem.to_json(), if_none_match=True)
        except PreconditionFailed:
            try:
                body, _etag = await self._store.get(key)
                return records.ProblemRecord.from_json(body).first_seen_unix_ns
            except (NotFound, records.RecordError):
                return now  # resolved meanwhile, or replaced by hand: count from now
        log.warning("gc_problem", kind=kind, subject=subject_key, detail=detail)
        return now

    async def resolve(self, kind: str, subject_key: str) -> None:
        await self._fence()
        await self._store.delete(keys.problem_key(kind, subject_key))
