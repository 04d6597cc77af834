"""The cursor walk both SHA verifications of a full audit share: `CursorWalk`.

Frame blobs (`reconciler.audit.blob_verify`) and bundles (`reconciler.bundle_verify`,
PROTOCOL §3.10: "with its own cursor") are each verified by walking their prefix in key
order from a cursor kept in `AuditRecord.cursors`. A subclass names its prefix and says
how one listed object is verified (its pacing, its read, its problem); the walk here:

- lists the prefix after ``cursor`` (the listing is closed when the walk stops early) and
  verifies ``CHUNK`` objects at a time concurrently; the cursor follows the objects done
  in key order, so it never passes one that was not verified;
- at the end of the prefix the round is complete: the cursor goes back to ``""`` and
  this walk verifies nothing more (at most one round per audit);
- a store error ends the walk for this audit (counted as ``<NAME>_verify`` in
  ``store_failures``, logged as ``<NAME>_verify_failed``); it never keeps the audit from
  completing. `LeaseLost` propagates;
- `running` walks while the audit's body runs and logs ``audit_<NAME>s_verified`` with
  `summary` when it stops; with ``WAITS_FOR_PROGRESS`` it first waits until the cursor
  moved once or the round ended, so every audit that is not stopped moves it on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import ClassVar

from reconciler.audit.partitions import closing
from reconciler.context import ReconcilerContext
from reconciler.problems import ProblemBook
from store.base import ObjectInfo
from store.errors import StoreError


class CursorWalk:
    """Verifies the objects under ``PREFIX`` from ``cursor`` on; `run` until cancelled or
    the round ends."""

    PREFIX: ClassVar[str]
    NAME: ClassVar[str]
    """``blob`` or ``bundle``: the metric label's and the log events' word."""
    CHUNK: ClassVar[int] = 1
    """Objects verified concurrently; the cursor moves past a chunk's objects once done."""
    WAITS_FOR_PROGRESS: ClassVar[bool] = False

    def __init__(
        self,
        ctx: ReconcilerContext,
        problems: ProblemBook,
        *,
        cursor: str,
        after_wait: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``after_wait``: called after each wait for the rate (the audit saves its
        progress and renews its pin there when due: a wait may be long)."""
        self._ctx = ctx
        self._problems = problems
        self._after_wait = after_wait
        self.cursor = cursor
        self.verified = 0
        self.problems = 0
        self.round_complete = False
        self._moved = asyncio.Event()

    async def verify(self, info: ObjectInfo) -> None:
        """Verify one listed object (record or resolve its problem)."""
        raise NotImplementedError

    def summary(self) -> dict[str, object]:
        """What the ``audit_<NAME>s_verified`` log line says."""
        return {
            "verified": self.verified,
            "problems": self.problems,
            "round_complete": self.round_complete,
        }

    async def waited(self) -> None:
        """Call after each wait for the rate (``after_wait``)."""
        if self._after_wait is not None:
            await self._after_wait()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Verify (`run`) while the body runs; stop when it ends."""
        task = asyncio.create_task(self.run())
        try:
            yield
            if self.WAITS_FOR_PROGRESS and not self._ctx.stopping.is_set():
                await self.moved_or_ended(task)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # LeaseLost propagates
            self._ctx.log.info(f"audit_{self.NAME}s_verified", **self.summary())

    async def moved_or_ended(self, task: asyncio.Task[None]) -> None:
        """Wait until the cursor moved at least once or ``task`` (this `run`) ended."""
        if self._moved.is_set() or task.done():
            return
        moved = asyncio.ensure_future(self._moved.wait())
        try:
            await asyncio.wait({moved, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            moved.cancel()

    async def run(self) -> None:
        """Verify in key order until the end of the round (or cancellation). Store errors
        end the run early; `LeaseLost` propagates."""
        ctx = self._ctx
        chunk: list[ObjectInfo] = []
        try:
            async with closing(ctx.store.list(self.PREFIX, self.cursor or None)) as listed:
                async for info in listed:
                    chunk.append(info)
                    if len(chunk) >= self.CHUNK:
                        await self._verify_chunk(chunk)
                        chunk = []
            if chunk:
                await self._verify_chunk(chunk)
        except StoreError as exc:
            ctx.metrics.store_failures.labels(f"{self.NAME}_verify").inc()
            ctx.log.warning(f"{self.NAME}_verify_failed", after=self.cursor, error=str(exc))
            return
        self.cursor = ""
        self.round_complete = True
        self._moved.set()
        ctx.log.info(f"{self.NAME}_verify_round_complete")

    async def _verify_chunk(self, chunk: list[ObjectInfo]) -> None:
        """Verify ``chunk`` concurrently; the cursor follows the objects done in key order."""
        if len(chunk) == 1:
            await self.verify(chunk[0])
            self._advance(chunk[0].key)
            return
        done = [False] * len(chunk)
        ahead = 0

        async def one(index: int, info: ObjectInfo) -> None:
            nonlocal ahead
            await self.verify(info)
            done[index] = True
            while ahead < len(chunk) and done[ahead]:
                self._advance(chunk[ahead].key)
                ahead += 1

        await asyncio.gather(*(one(i, info) for i, info in enumerate(chunk)))

    def _advance(self, key: str) -> None:
        self.cursor = key
        self._moved.set()
