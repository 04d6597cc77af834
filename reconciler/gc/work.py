"""What every step of a GC run works with (`GcWork`), and the mark's reads and writes.

Deletes go through ``delete_store``, the GC role's store (`reconciler.gc.run`): blobs,
marks and vetoes, and nothing else does. Everything else (reads, marks, the log, problem
records) goes through ``store``, the reconciler's everyday role.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import structlog

from protocol import records
from reconciler.gc.delete import LeaseTerm
from reconciler.gc.policy import GcPolicy
from reconciler.gc.problems import GcProblems
from store.base import ObjectInfo, ObjectStore
from store.errors import (
    ConditionConflict,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    StoreError,
    Unavailable,
)
from store.time import StoreClock

log = structlog.get_logger("reconciler.gc")
T = TypeVar("T")


class Fence(Protocol):
    """`reconciler.context.ReconcilerContext.check_fence`: returns only while we hold the
    lease, renewing it first when it runs less than ``min_remaining_s`` longer."""

    def __call__(self, *, min_remaining_s: float = ...) -> Awaitable[None]: ...


@dataclass
class GcWork:
    store: ObjectStore
    delete_store: ObjectStore
    clock: StoreClock
    policy: GcPolicy
    fence: Fence
    lease: Callable[[], LeaseTerm]
    observe: Callable[[str, int], None]
    problems: GcProblems
    item_errors: int = 0
    vetoes: set[str] = field(default_factory=set)
    """Hashes with a veto, from the run's one listing of ``gc/v1/vetoes/``."""
    marks: set[str] = field(default_factory=set)
    """Hashes with a mark, from the run's one listing of ``gc/v1/marks/``."""

    async def per_item(self, what: str, key: str, work: Awaitable[T]) -> T | None:
        """``work`` for one candidate or mark; on a store failure, skip it (``None``).

        Safe: every step leaves a state a later run resolves, and skipping deletes nothing.
        After ``max_item_errors`` failures the store counts as unavailable: it raises."""
        try:
            return await work
        except (Unavailable, ConditionConflict) as exc:
            self.item_errors += 1
            log.warning("gc_item_skipped", step=what, key=key, error=str(exc))
            if self.item_errors > self.policy.max_item_errors:
                raise
            return None

    # --- marks -----------------------------------------------------------------------

    async def read_mark(self, key: str) -> tuple[records.GcMark | None, str | None]:
        """``(mark, etag)``; ``(None, None)`` when absent, ``(None, etag)`` when the mark
        exists but does not parse (settled as such, never acted on)."""
        try:
            body, etag = await self.store.get(key)
        except NotFound:
            return None, None
        try:
            return records.GcMark.from_json(body), etag
        except records.RecordError as exc:
            log.error("gc_mark_unreadable", key=key, error=str(exc))
            return None, etag

    async def delete_mark_if_unchanged(self, key: str, etag: str | None) -> None:
        _current, current_etag = await self.read_mark(key)
        if current_etag is not None and current_etag == etag:
            await self.delete_store.delete(key)

    async def withdraw(self, mark_key: str) -> None:
        await self.fence()
        await self.delete_store.delete(mark_key)

    async def release_unsent(self, mark_key: str, deleting_etag: str) -> None:
        """Remove our own ``deleting`` mark whose DELETE was never sent (best effort: a
        mark left behind is settled by the stale-deletion pass)."""
        try:
            await self.fence()
            await self.delete_mark_if_unchanged(mark_key, deleting_etag)
        except StoreError as exc:
            log.warning("gc_mark_release_failed", key=mark_key, error=str(exc))

    async def write_deleting(
        self, mark_key: str, deleting: records.GcMark, etag: str
    ) -> str | None:
        """Swap the mark to ``deleting``; its new ETag, or None when it did not (or may
        not) land. An unknown outcome is read back before it counts (PROTOCOL §3.5)."""
        body = deleting.to_json()
        try:
            return await self.store.put(mark_key, body, if_match=etag)
        except PreconditionFailed:
            return None
        except OutcomeUnknown:
            try:
                stored, stored_etag = await self.store.get(mark_key)
            except NotFound:
                return None
            return stored_etag if stored == body else None

    # --- small reads -----------------------------------------------------------------

    async def head(self, key: str) -> ObjectInfo | None:
        try:
            return await self.store.head(key)
        except NotFound:
            return None

    async def exists(self, key: str) -> bool:
        return await self.head(key) is not None
