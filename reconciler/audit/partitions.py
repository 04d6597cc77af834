"""Closing a store listing that a loop leaves early (`closing`).

What else lived here (finding agent groups by skipping through one listing) served the
in-memory audit's walk; the ranged listing (`reconciler.audit.ranges`) uses delimiter
listings instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

T = TypeVar("T")


@asynccontextmanager
async def closing(iterator: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """Close an async iterator (a store listing) even when the loop over it stops early, so
    its connection or open directory is released now rather than by garbage collection."""
    try:
        yield iterator
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
