"""A token bucket on the injected clock: bounds how fast audits read blobs back.

``verify_rate_per_s`` objects per second on average, bursts of up to ``burst``. Waiting
goes through `Clock.sleep`, so tests with a `ManualClock` never really wait.
"""

from __future__ import annotations

import asyncio

from protocol.clock import Clock


class TokenBucket:
    def __init__(self, *, rate_per_s: float, clock: Clock, burst: float | None = None) -> None:
        if rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
        self._rate = rate_per_s
        self._burst = burst if burst is not None else max(1.0, rate_per_s / 10)
        if self._burst < 1:
            raise ValueError(f"burst must be >= 1, got {self._burst}")
        self._clock = clock
        self._tokens = self._burst
        self._last = clock.monotonic()
        self._lock = asyncio.Lock()  # waiters queue up in order; each takes one token

    async def acquire(self) -> None:
        """Take one token, waiting until one is available."""
        async with self._lock:
            self._refill()
            if self._tokens < 1:
                await self._clock.sleep((1 - self._tokens) / self._rate)
                self._refill()
            self._tokens = max(0.0, self._tokens - 1)

    def _refill(self) -> None:
        now = self._clock.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
