"""What one worker holds right now: batch POSTs in flight and the bytes charged to them.

The caps (``http.max_in_flight_requests``, ``http.max_in_flight_bytes``) turn load into
429s instead of memory; `InFlight` is their single account, exported as gauges, and what
the graceful stop waits on.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from prometheus_client import Gauge


class InFlightLimits(Protocol):
    @property
    def max_in_flight_requests(self) -> int: ...
    @property
    def max_in_flight_bytes(self) -> int: ...


class InFlight:
    def __init__(self, *, requests_gauge: Gauge, bytes_gauge: Gauge) -> None:
        self.requests = 0
        self.bytes = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._requests_gauge = requests_gauge
        self._bytes_gauge = bytes_gauge

    def try_reserve(
        self, requests: int, size: int, limits: InFlightLimits, *, always_if_alone: bool
    ) -> bool:
        """Charge ``requests`` and ``size`` bytes if both stay within the caps. With
        ``always_if_alone`` a caller that is the only request in flight is admitted
        whatever ``size`` is (the caps bound concurrency, not one frame)."""
        alone = always_if_alone and self.requests <= 1
        if not alone and (
            self.requests + requests > limits.max_in_flight_requests
            or self.bytes + size > limits.max_in_flight_bytes
        ):
            return False
        self._change(requests, size)
        return True

    def release(self, requests: int, size: int) -> None:
        self._change(-requests, -size)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no batch POST is in flight; False if ``timeout_s`` passed first."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def _change(self, requests: int, size: int) -> None:
        self.requests += requests
        self.bytes += size
        if self.requests:
            self._idle.clear()
        else:
            self._idle.set()
        self._requests_gauge.set(self.requests)
        self._bytes_gauge.set(self.bytes)
