"""Work the audit hands to a thread (`reconciler.audit.offload`): a cancelled caller waits
for the thread to end before the cancellation propagates, so nothing the thread still uses
(a DuckDB connection, a Spark session) is closed under it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from reconciler.audit.offload import INLINE_BYTES, in_thread, offload


async def test_a_cancelled_caller_waits_for_its_thread_to_end() -> None:
    release = threading.Event()
    started = threading.Event()
    finished: list[str] = []

    def work() -> str:
        started.set()
        release.wait(30)
        finished.append("done")
        return "done"

    task = asyncio.create_task(in_thread(work))
    assert await asyncio.to_thread(started.wait, 30)
    task.cancel()
    done, _pending = await asyncio.wait({task}, timeout=1.0)
    assert not done  # still waiting for the thread, which cannot be cancelled
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == ["done"]  # the thread had ended when the cancellation came through


async def test_small_work_runs_inline_and_big_work_in_a_thread() -> None:
    caller = threading.get_ident()
    assert await offload(INLINE_BYTES, threading.get_ident) == caller
    assert await offload(INLINE_BYTES + 1, threading.get_ident) != caller
