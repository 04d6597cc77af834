"""Backoff bounds and the shared repeat loop: how many tries, and which failures repeat."""

from __future__ import annotations

import random

import pytest

from store.errors import NotFound, OutcomeUnknown, Unavailable
from store.retry import Backoff, repeat_while_unavailable


def test_delays_are_bounded_jittered_and_capped() -> None:
    backoff = Backoff(attempts=8, base_s=0.1, cap_s=0.5)
    delays = list(backoff.delays(random.Random(3)))
    assert len(delays) == 7
    assert all(0.0 <= d <= min(0.5, 0.1 * 2**i) for i, d in enumerate(delays))
    assert len(set(delays)) == 7  # jittered, not a fixed schedule
    with pytest.raises(ValueError):
        Backoff(attempts=0)


class Failing:
    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


async def run(call: Failing, **kwargs: bool) -> str:
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    try:
        return await repeat_while_unavailable(
            call, backoff=Backoff(attempts=3), rng=random.Random(1), sleep=sleep, **kwargs
        )
    finally:
        assert len(slept) == max(0, call.calls - 1)


async def test_unavailable_is_repeated_until_success_or_the_attempts_run_out() -> None:
    recovering = Failing(Unavailable("get", "k"), OutcomeUnknown("put", "k"))
    assert await run(recovering) == "done" and recovering.calls == 3
    exhausted = Failing(*[Unavailable("get", "k")] * 3)
    with pytest.raises(Unavailable):
        await run(exhausted)
    assert exhausted.calls == 3


async def test_an_unknown_outcome_is_not_repeated_when_the_caller_says_so() -> None:
    once = Failing(OutcomeUnknown("delete", "k"))
    with pytest.raises(OutcomeUnknown):
        await run(once, repeat_unknown=False)
    assert once.calls == 1
    refused_first = Failing(Unavailable("delete", "k"))  # not applied: safe to repeat
    assert await run(refused_first, repeat_unknown=False) == "done"


async def test_other_errors_are_not_repeated() -> None:
    missing = Failing(NotFound("get", "k"))
    with pytest.raises(NotFound):
        await run(missing)
    assert missing.calls == 1
