"""Work the audit hands to a thread only when it is big enough to be worth one.

A thread costs a hand-off and lets every other task of the event loop run meanwhile; for
a small store's Parquet part or join (milliseconds) that costs more than it saves, as
`reconciler.audit.blob_verify` does for small blobs. Work on inputs of at most
`INLINE_BYTES` runs inline."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

INLINE_BYTES = 4 * 1024 * 1024
"""Inputs this small are worked on inline (about a millisecond per 100 kB)."""


async def offload(size: int, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)``, in a thread (`in_thread`) when ``size`` (bytes of input)
    exceeds `INLINE_BYTES`."""
    if size <= INLINE_BYTES:
        return fn(*args, **kwargs)
    return await in_thread(fn, *args, **kwargs)


async def in_thread(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in the default executor's thread. A thread cannot be
    cancelled: a cancellation waits for it to end (whoever cancels stops it first, e.g.
    `AuditJoins.interrupt`) and then propagates, so the caller never closes what the
    thread still uses (a DuckDB connection closed under a running query can abort the
    process)."""
    future = asyncio.get_running_loop().run_in_executor(
        None, functools.partial(fn, *args, **kwargs)
    )
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait({future})
        raise
