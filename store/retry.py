"""Bounded, jittered backoff shared by every retry loop.

Callers own the decision that repeating is safe and say why in a comment at the loop;
this module only bounds the attempts and spreads them out ("full jitter": each delay is
uniform in ``[0, min(cap, base * 2**attempt)]``) so that many clients retrying the same
hot key do not synchronise.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from store.errors import OutcomeUnknown, Unavailable

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Backoff:
    """How often and how long to retry: ``attempts`` tries in all, delays between them."""

    attempts: int = 5
    base_s: float = 0.05
    cap_s: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.base_s < 0 or self.cap_s < self.base_s:
            raise ValueError(f"need 0 <= base_s <= cap_s, got {self.base_s}, {self.cap_s}")

    def delays(self, rng: random.Random) -> Iterator[float]:
        """Yield ``attempts - 1`` jittered delays: one before each retry."""
        for attempt in range(self.attempts - 1):
            yield rng.uniform(0.0, min(self.cap_s, self.base_s * (2**attempt)))


async def repeat_while_unavailable(
    call: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff,
    rng: random.Random,
    sleep: Callable[[float], Awaitable[None]],
    repeat_unknown: bool = True,
) -> T:
    """``call()``, repeated after `Unavailable` with ``backoff``'s jittered delays; the
    last failure is raised when the attempts run out. With ``repeat_unknown=False`` an
    `OutcomeUnknown` (the attempt may still land later) is raised at once instead.

    Callers use this only where repeating the request is safe; they say why."""
    delays = backoff.delays(rng)
    while True:
        try:
            return await call()
        except Unavailable as exc:
            if isinstance(exc, OutcomeUnknown) and not repeat_unknown:
                raise
            delay = next(delays, None)
            if delay is None:
                raise
        await sleep(delay)
