"""Readiness (``GET /readyz``): the probe passed, the object store answered recently, and
this host's clock agrees with the store's (PROTOCOL §3.8: within ``max_clock_skew_s``).

A background loop asks the store a cheap question (HEAD of a key that need not exist: a
404 is an answer) every ``interval_s``; successful acceptances count as answers too. Every
answer also refreshes the measured clock skew (`store.time`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from protocol import keys
from protocol.clock import Clock
from store.base import ObjectStore
from store.errors import NotFound, StoreConfigError, StoreError
from store.time import StoreClock

log = structlog.get_logger(__name__)
READINESS_KEY = keys.probe_key("readiness")


class Readiness:
    def __init__(
        self,
        *,
        store: ObjectStore,
        clock: Clock,
        window_s: float = 15.0,
        interval_s: float = 5.0,
        on_answer: Callable[[], None] | None = None,
        store_clock: StoreClock | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._store_clock = store_clock
        self._window_s = window_s
        self._interval_s = interval_s
        self._last_answer: float | None = None
        self.probe_passed = False
        self._on_answer = on_answer or (lambda: None)

    def store_answered(self) -> None:
        self._last_answer = self._clock.monotonic()
        self._on_answer()

    def state(self) -> dict[str, Any]:
        age = None if self._last_answer is None else self._clock.monotonic() - self._last_answer
        recent = age is not None and age <= self._window_s
        skew_s = None if self._store_clock is None else self._store_clock.skew_s
        skewed = self._store_clock is not None and self._store_clock.skewed
        return {
            "ready": self.probe_passed and recent and not skewed,
            "probe_passed": self.probe_passed,
            "store_answered_seconds_ago": None if age is None else round(age, 3),
            "clock_skewed": skewed,
            "store_clock_skew_seconds": None if skew_s is None else round(skew_s, 3),
        }

    async def check_once(self) -> bool:
        try:
            async with asyncio.timeout(self._interval_s):
                await self._store.head(READINESS_KEY)
        except NotFound:
            pass
        except (StoreError, TimeoutError) as exc:
            log.warning("store_not_answering", error=repr(exc))
            return False
        except StoreConfigError as exc:  # e.g. 403: credentials or bucket policy
            log.error("store_refuses_access", error=str(exc))
            return False
        self.store_answered()
        return True

    async def run(self) -> None:
        """Check forever; cancel to stop."""
        while True:
            await self.check_once()
            await self._clock.sleep(self._interval_s)
