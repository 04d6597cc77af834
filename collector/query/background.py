"""`BackgroundRead`: one background task of a query process (catalog reads that grow with
history, `collector.query.coverage`, `collector.query.late`), which answers wait for only
so long. A failure reaches the answer that waits for it, or else the next one, once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any


class BackgroundRead:
    def __init__(self, name: str) -> None:
        self._name = name
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def wait(
        self, start: Callable[[], Coroutine[Any, Any, None]] | None, timeout_s: float
    ) -> None:
        """Raise the failure of a task that ended since the last wait; then start one with
        ``start`` if none runs (and ``start`` is given), and wait for the running one at
        most ``timeout_s``, raising its failure if it ended."""
        task = self._task
        if task is not None and task.done():
            self._task = None
            if not task.cancelled():
                task.result()  # its failure, if it failed
        if self._task is None and start is not None:
            self._task = asyncio.get_running_loop().create_task(start(), name=self._name)
        task = self._task
        if task is None:
            return
        await asyncio.wait([task], timeout=timeout_s)
        if task.done():
            if self._task is task:  # (another answer may have started the next)
                self._task = None
            if not task.cancelled():
                task.result()

    async def close(self) -> None:
        """Stop the task (the process is stopping)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
