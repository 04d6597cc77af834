"""`update_object`: the compare-and-swap loop, on real backends and under scripted faults."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from protocol.clock import ManualClock
from store.base import ObjectStore
from store.cas import CasExhausted, CasResult, update_object
from store.errors import ConditionConflict, OutcomeUnknown, PreconditionFailed, StoreError
from store.memory import MemoryStore
from store.retry import Backoff


class ScriptedPuts(MemoryStore):
    """A memory store whose next puts fail as scripted.

    Each script entry is an error class to raise instead of writing, or
    ``("landed", OutcomeUnknown)`` to write and then lose the answer. When the script runs
    out, ``then`` (if set) is raised forever; otherwise puts succeed.
    """

    def __init__(self, script: list[object], then: type[StoreError] | None = None) -> None:
        super().__init__(clock=ManualClock())
        self.script = list(script)
        self.then = then
        self.puts = 0

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        self.puts += 1
        fault = self.script.pop(0) if self.script else self.then
        if fault == ("landed", OutcomeUnknown):
            await super().put(key, body, if_none_match=if_none_match, if_match=if_match)
            raise OutcomeUnknown("put", key, "answer lost")
        if isinstance(fault, type) and issubclass(fault, StoreError):
            raise fault("put", key, "scripted")
        return await super().put(key, body, if_none_match=if_none_match, if_match=if_match)


def _increment(body: bytes | None) -> bytes:
    return str(int(body or b"0") + 1).encode()


async def _update(
    store: ObjectStore,
    mutate: Callable[[bytes | None], bytes | None] = _increment,
    attempts: int = 5,
    clock: ManualClock | None = None,
) -> CasResult:
    return await update_object(
        store,
        "obj",
        mutate,
        backoff=Backoff(attempts=attempts, base_s=0.1, cap_s=1.0),
        rng=random.Random(7),
        clock=clock or ManualClock(),
    )


async def test_creates_when_absent_then_updates(store: ObjectStore) -> None:
    seen: list[bytes | None] = []

    def mutate(body: bytes | None) -> bytes:
        seen.append(body)
        return _increment(body)

    first = await _update(store, mutate)
    second = await _update(store, mutate)
    assert seen == [None, b"1"]
    assert (first.body, first.written, first.attempts) == (b"1", True, 1)
    assert await store.get("obj") == (b"2", second.etag)


async def test_no_change_wanted_writes_nothing(store: ObjectStore) -> None:
    etag = await store.put("obj", b"5")
    result = await _update(store, lambda body: None)
    assert (result.body, result.etag, result.written) == (b"5", etag, False)
    absent = await update_object(
        store,
        "absent",
        lambda body: None,
        backoff=Backoff(),
        rng=random.Random(1),
        clock=ManualClock(),
    )
    assert (absent.body, absent.etag, absent.written) == (None, None, False)


async def test_concurrent_updates_lose_nothing(concurrent_store: ObjectStore) -> None:
    updates = 24
    await asyncio.gather(*(_update(concurrent_store, attempts=updates + 1) for _ in range(updates)))
    assert (await concurrent_store.get("obj"))[0] == str(updates).encode()


async def test_mutate_errors_propagate_and_nothing_is_written() -> None:
    store = ScriptedPuts([])

    def refuse(body: bytes | None) -> bytes:
        raise RuntimeError("invariant violated")

    with pytest.raises(RuntimeError, match="invariant"):
        await _update(store, refuse)
    assert store.puts == 0


async def test_lost_races_are_retried_at_once() -> None:
    store = ScriptedPuts([PreconditionFailed, PreconditionFailed])
    clock = ManualClock()
    result = await _update(store, clock=clock)
    assert (result.body, result.attempts) == (b"1", 3)
    assert clock.monotonic() == 0.0  # no backoff after a 412: someone made progress


async def test_conflicts_back_off() -> None:
    store = ScriptedPuts([ConditionConflict, ConditionConflict])
    clock = ManualClock()
    result = await _update(store, clock=clock)
    assert result.attempts == 3
    assert 0.0 < clock.monotonic() <= 0.1 + 0.2


@pytest.mark.parametrize("error", [PreconditionFailed, ConditionConflict])
async def test_exhausted_when_every_attempt_loses(error: type[StoreError]) -> None:
    store = ScriptedPuts([], then=error)
    calls: list[bytes | None] = []

    def mutate(body: bytes | None) -> bytes:
        calls.append(body)
        return b"x"

    with pytest.raises(CasExhausted) as caught:
        await _update(store, mutate, attempts=4)
    assert store.puts == 4 and len(calls) == 4
    assert isinstance(caught.value.__cause__, error)
    assert caught.value.key == "obj"


async def test_a_write_that_landed_despite_a_lost_answer_is_not_repeated() -> None:
    store = ScriptedPuts([("landed", OutcomeUnknown)])
    result = await _update(store)
    assert (result.body, result.written, result.attempts) == (b"1", True, 2)
    assert store.puts == 1
    assert (await store.get("obj"))[0] == b"1"


async def test_a_write_that_did_not_land_is_retried() -> None:
    store = ScriptedPuts([OutcomeUnknown])
    result = await _update(store)
    assert (result.body, result.attempts) == (b"1", 2)
    assert store.puts == 2


async def test_exhausted_with_unknown_outcomes_says_unknown() -> None:
    store = ScriptedPuts([OutcomeUnknown], then=ConditionConflict)
    with pytest.raises(OutcomeUnknown):
        await _update(store, attempts=3)
