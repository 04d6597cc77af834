"""Injected time: every process reads the wall clock and sleeps through a `Clock`.

Production uses `SystemClock`; tests and seeded simulations use `ManualClock`, whose time
moves only when the test says so, so time-dependent protocol steps (GC grace, lease
expiry, retry horizons) are driven without real sleeps.

Object ages and lease expiries are judged in the *store's* time: `store.time.store_clock`
turns a clock into a `store.time.StoreClock` (PROTOCOL §3.8).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int:
        """Wall-clock time, nanoseconds since the Unix epoch (UTC)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for budgets and timeouts)."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now_ns(self) -> int:
        return time.time_ns()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that only moves when told; ``sleep`` advances it instead of waiting."""

    def __init__(self, start_ns: int = 1_760_000_000_000_000_000) -> None:
        self._now_ns = start_ns
        self._mono = 0.0

    def now_ns(self) -> int:
        return self._now_ns

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes backwards")
        self._now_ns += int(seconds * 1_000_000_000)
        self._mono += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)
