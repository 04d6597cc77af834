"""`FaultyStore`: a seeded fault-injecting wrapper around any `ObjectStore`.

Local S3 servers never produce 409 ConditionalRequestConflict, 503 SlowDown, resets or
"applied but the answer was lost"; this wrapper does, deterministically from a seed or
from an explicit script, so every branch of the acceptance protocol can be exercised.

Faults (`Fault`):
- ``CONFLICT``: raise `ConditionConflict` without applying (409).
- ``UNAVAILABLE``: raise `Unavailable` without applying (503 / refused connection).
- ``LOST_REPLY``: apply the operation, then raise `OutcomeUnknown` (the answer was lost).
- ``UNKNOWN_NOT_APPLIED``: raise `OutcomeUnknown` without applying (timeout before arrival).
- ``HANG``: never answer (sleeps on the clock until cancelled): drives callers' timeouts.

Scripted faults (``script(op, prefix, *faults)``) are consumed first, in order, by the next
matching operations; random faults follow ``rates`` per operation from a seeded RNG.
``ignore_conditions=True`` turns the store into one that silently ignores If-None-Match
and If-Match: an invalid acceptance authority, for the start-up probe's tests.
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from store.base import ObjectInfo, ObjectStore, SignedDelete
from store.counting import put_operation
from store.errors import ConditionConflict, OutcomeUnknown, Unavailable

T = TypeVar("T")


class Fault(enum.Enum):
    CONFLICT = "conflict"
    UNAVAILABLE = "unavailable"
    LOST_REPLY = "lost_reply"
    UNKNOWN_NOT_APPLIED = "unknown_not_applied"
    HANG = "hang"


@dataclass
class _Script:
    op: str
    prefix: str
    faults: deque[Fault]


class FaultyStore:
    """Wraps ``inner``; ops: ``get``, ``head``, ``put``, ``put_if_none_match``,
    ``put_if_match``, ``list``, ``delete``."""

    def __init__(
        self,
        inner: ObjectStore,
        *,
        seed: int = 0,
        rates: dict[str, dict[Fault, float]] | None = None,
        ignore_conditions: bool = False,
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self.rng = random.Random(seed)
        self.rates = rates or {}
        self.ignore_conditions = ignore_conditions
        self.injected: Counter[tuple[str, Fault]] = Counter()
        self.calls: Counter[str] = Counter()
        self._scripts: list[_Script] = []

    def script(self, op: str, prefix: str, *faults: Fault) -> None:
        """Make the next operations ``op`` on keys starting with ``prefix`` fail so."""
        self._scripts.append(_Script(op, prefix, deque(faults)))

    def set_rates(self, rates: dict[str, dict[Fault, float]]) -> None:
        self.rates = rates

    def _pick(self, op: str, key: str) -> Fault | None:
        for script in self._scripts:
            if script.op == op and key.startswith(script.prefix) and script.faults:
                return script.faults.popleft()
        for fault, rate in self.rates.get(op, {}).items():
            if self.rng.random() < rate:
                return fault
        return None

    async def _run(self, op: str, key: str, action: Callable[[], Awaitable[T]]) -> T:
        self.calls[op] += 1
        fault = self._pick(op, key)
        if fault is None:
            return await action()
        self.injected[(op, fault)] += 1
        if fault is Fault.CONFLICT:
            raise ConditionConflict(op, key, "injected 409 ConditionalRequestConflict")
        if fault is Fault.UNAVAILABLE:
            raise Unavailable(op, key, "injected 503 SlowDown")
        if fault is Fault.UNKNOWN_NOT_APPLIED:
            raise OutcomeUnknown(op, key, "injected timeout before the request arrived")
        if fault is Fault.HANG:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")
        await action()
        raise OutcomeUnknown(op, key, "injected: applied, then the answer was lost")

    async def get(self, key: str) -> tuple[bytes, str]:
        return await self._run("get", key, lambda: self.inner.get(key))

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        """Faulted as a ``get`` (a ranged GET is a GET)."""
        return await self._run("get", key, lambda: self.inner.get_range(key, offset, length))

    async def head(self, key: str) -> ObjectInfo:
        return await self._run("head", key, lambda: self.inner.head(key))

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        return await self._put(
            key,
            if_none_match,
            if_match,
            lambda none_match, match: self.inner.put(
                key, body, if_none_match=none_match, if_match=match
            ),
        )

    async def put_file(
        self, key: str, path: str, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        """Faulted as the `put` of the same conditions."""
        return await self._put(
            key,
            if_none_match,
            if_match,
            lambda none_match, match: self.inner.put_file(
                key, path, if_none_match=none_match, if_match=match
            ),
        )

    async def _put(
        self,
        key: str,
        if_none_match: bool,
        if_match: str | None,
        send: Callable[[bool, str | None], Awaitable[str]],
    ) -> str:
        """Fault the put named by its conditions (`store.counting.put_operation`), then
        ``send`` it with them, or with none under ``ignore_conditions``."""
        op = put_operation(if_none_match, if_match)
        if self.ignore_conditions:
            if_none_match, if_match = False, None
        return await self._run(op, key, lambda: send(if_none_match, if_match))

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        self.calls["list"] += 1
        fault = self._pick("list", prefix)
        if fault is not None:
            self.injected[("list", fault)] += 1
            raise Unavailable("list", prefix, f"injected {fault.value}")
        async for info in self.inner.list(prefix, start_after):
            yield info

    async def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        self.calls["list"] += 1
        fault = self._pick("list", prefix)
        if fault is not None:
            self.injected[("list", fault)] += 1
            raise Unavailable("list", prefix, f"injected {fault.value}")
        async for folder in self.inner.common_prefixes(prefix):
            yield folder

    async def delete(self, key: str) -> None:
        await self._run("delete", key, lambda: self.inner.delete(key))

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        return await self.inner.sign_delete(key, expires_in_s=expires_in_s)  # local: no faults

    async def send_signed_delete(self, request: SignedDelete) -> None:
        # Faulted as a "delete": a lost reply here leaves a request that may still land.
        await self._run("delete", request.key, lambda: self.inner.send_signed_delete(request))

    async def close(self) -> None:
        await self.inner.close()
