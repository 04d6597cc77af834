"""A deterministic runtime for in-process simulations: virtual time, seeded latency.

`VirtualTimeLoop` is an asyncio event loop whose clock is virtual: when every task is
blocked on a timer (``asyncio.sleep``, ``asyncio.timeout``, a retry backoff), the loop
jumps its clock straight to the earliest timer instead of waiting. A simulation of hours
of protocol time runs in milliseconds, and, with no real I/O and one thread, the order in
which tasks run is a pure function of the program and its seeds: the same seed replays
the same interleaving, the same faults and the same outcome.

`SimClock` is the `protocol.clock.Clock` of that loop (wall time = a start plus the
virtual seconds), so protocol code reading its injected clock and asyncio timeouts agree.

`DelayedStore` gives every store operation a seeded latency, and lets a request in flight
land even if its caller gives up (is cancelled by a timeout): as a real request that was
sent cannot be called back. With ``late_rate`` it also times some mutations out on
purpose (the caller gets `OutcomeUnknown` after ``timeout_s``) while they land later,
within ``late_extra_s`` after that: the "applied after the client gave up" of a real
store, inside the bound the configuration assumes (connect plus read timeout).

`S3LikeRetries` repeats what `store.s3.S3Store` repeats (reads, unconditional puts and
deletes, on `Unavailable`, bounded) and sends conditional puts and signed deletes once, so code under
simulation sees the same error surface as against S3.

A deadlock (every task waiting on something no timer will ever deliver) raises
`SimulationDeadlock` instead of hanging.

Work handed to a thread (``asyncio.to_thread``: Parquet encoding of index files, hashing)
runs inline on the loop's own thread instead (`InlineExecutor`): a real thread would
finish at a real moment while the loop's clock jumps, so its result would land at a
virtual time that depends on the machine's speed, and the same seed would not replay.
"""

from __future__ import annotations

import asyncio
import math
import random
import selectors
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import Context
from typing import Any, TypeVar, TypeVarTuple, Unpack

from store.base import ObjectInfo, ObjectStore, SignedDelete
from store.errors import OutcomeUnknown
from store.retry import Backoff, repeat_while_unavailable

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class SimulationDeadlock(RuntimeError):
    """Every task is blocked and no timer is pending: the simulated system is stuck."""


class _VirtualSelector(selectors.DefaultSelector):
    """Never waits: a select that would block advances the loop's virtual clock instead."""

    loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if events or self.loop is None or timeout == 0:
            return events
        if timeout is None:
            raise SimulationDeadlock("every task is blocked and no timer is pending")
        self.loop.advance(timeout)
        return events


class InlineExecutor(ThreadPoolExecutor):
    """Runs each submitted call at once, on the caller's thread (see the module doc)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting task, as a thread would
            future.set_exception(exc)
        return future


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (seconds from 0). Real I/O still works but never
    makes the loop wait; simulations should do none."""

    def __init__(self) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = 0.0
        self.set_default_executor(InlineExecutor(max_workers=1))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += max(0.0, seconds)

    def call_later(
        self,
        delay: float,
        callback: Callable[[Unpack[Ts]], object],
        *args: *Ts,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        # A positive delay below the float resolution of the clock (``now + delay == now``:
        # a loop waiting for "the rest" of an interval, 1.0 - 0.9999999999999998 s) is due
        # one representable instant later, so time moves when it fires (see `call_at`).
        if delay > 0:
            now = self.time()
            when = max(now + delay, math.nextafter(now, math.inf))
            return self.call_at(when, callback, *args, context=context)
        return super().call_later(delay, callback, *args, context=context)

    def call_at(
        self,
        when: float,
        callback: Callable[[Unpack[Ts]], object],
        *args: *Ts,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        return super().call_at(when, self._timer_due, when, callback, args, context=context)

    def _timer_due(
        self, when: float, callback: Callable[[Unpack[Ts]], object], args: tuple[*Ts]
    ) -> None:
        # asyncio runs a timer that is due within its clock resolution (~1 ns) early; on a
        # real loop time then moves by itself, here it would not, and a waiter that loops
        # until its interval has passed would spin forever. Time is the timer's when.
        self._virtual_now = max(self._virtual_now, when)
        callback(*args)


def run_virtual(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` to completion on a fresh `VirtualTimeLoop` and close it."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


class SimClock:
    """`Clock` on the running loop's time: ``now_ns`` = ``start_ns`` + virtual seconds."""

    def __init__(self, start_ns: int = 1_760_000_000_000_000_000) -> None:
        self.start_ns = start_ns

    def now_ns(self) -> int:
        return self.start_ns + int(asyncio.get_running_loop().time() * 1_000_000_000)

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class DelayedStore:
    """Wraps ``inner``: every operation lands after a seeded delay in
    ``[0, max_latency_s]``; a mutation whose caller is cancelled still lands (in flight).

    `drain` waits for every operation still in flight (call it before checking)."""

    def __init__(
        self,
        inner: ObjectStore,
        *,
        rng: random.Random,
        max_latency_s: float,
        late_rate: float = 0.0,
        timeout_s: float = 1.0,
        late_extra_s: float = 0.0,
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self._rng = rng
        self._max = max_latency_s
        self._late_rate = late_rate
        self._timeout_s = timeout_s
        self._late_extra_s = late_extra_s
        self._in_flight: set[asyncio.Task[Any]] = set()
        self.late_landings = 0
        self.late_by_kind: Counter[str] = Counter()
        """Late landings by ``"<op> <first key segment>"``, e.g. ``"delete raw-blobs"``."""

    async def _landing(self, call: Callable[[], Awaitable[T]], *, op: str = "", key: str = "") -> T:
        late = op in ("put", "delete") and self._rng.random() < self._late_rate
        if late:
            delay = self._timeout_s + self._rng.uniform(0.0, self._late_extra_s)
        else:
            delay = self._rng.uniform(0.0, self._max)

        async def after() -> T:
            await asyncio.sleep(delay)
            return await call()

        task: asyncio.Task[T] = asyncio.ensure_future(after())
        self._in_flight.add(task)
        task.add_done_callback(self._settled)
        if late:
            self.late_landings += 1
            self.late_by_kind[f"{op} {key.split('/', 1)[0]}"] += 1
            await asyncio.sleep(self._timeout_s)
            raise OutcomeUnknown(op, key, "simulated read timeout; the request is still in flight")
        return await asyncio.shield(task)

    def _settled(self, task: asyncio.Task[Any]) -> None:
        self._in_flight.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: an abandoned request's error is nobody's to see

    async def drain(self) -> None:
        while self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)

    async def get(self, key: str) -> tuple[bytes, str]:
        return await self._landing(lambda: self.inner.get(key))

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        return await self._landing(lambda: self.inner.get_range(key, offset, length))

    async def head(self, key: str) -> ObjectInfo:
        return await self._landing(lambda: self.inner.head(key))

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        return await self._landing(
            lambda: self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match),
            op="put",
            key=key,
        )

    async def put_file(
        self, key: str, path: str, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        return await self._landing(
            lambda: self.inner.put_file(key, path, if_none_match=if_none_match, if_match=if_match),
            op="put",
            key=key,
        )

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        await asyncio.sleep(self._rng.uniform(0.0, self._max))
        async for info in self.inner.list(prefix, start_after):
            yield info

    async def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        await asyncio.sleep(self._rng.uniform(0.0, self._max))
        async for folder in self.inner.common_prefixes(prefix):
            yield folder

    async def delete(self, key: str) -> None:
        await self._landing(lambda: self.inner.delete(key), op="delete", key=key)

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        return await self.inner.sign_delete(key, expires_in_s=expires_in_s)  # local: no latency

    async def send_signed_delete(self, request: SignedDelete) -> None:
        # A late landing meets the store's expiry check when it lands, as on S3.
        await self._landing(
            lambda: self.inner.send_signed_delete(request), op="delete", key=request.key
        )

    async def close(self) -> None:
        await self.drain()


class S3LikeRetries:
    """Retries as `store.s3.S3Store` does: reads and unconditional puts are repeated on
    `Unavailable` (bounded, jittered); deletes only when the attempt provably did not
    apply (not on `OutcomeUnknown`); conditional puts are sent once."""

    def __init__(self, inner: ObjectStore, *, rng: random.Random, backoff: Backoff) -> None:
        self.inner = inner
        self.url = inner.url
        self._rng = rng
        self._backoff = backoff

    async def _retrying(
        self, call: Callable[[], Awaitable[T]], *, repeat_unknown: bool = True
    ) -> T:
        return await repeat_while_unavailable(
            call,
            backoff=self._backoff,
            rng=self._rng,
            sleep=asyncio.sleep,
            repeat_unknown=repeat_unknown,
        )

    async def get(self, key: str) -> tuple[bytes, str]:
        return await self._retrying(lambda: self.inner.get(key))

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        return await self._retrying(lambda: self.inner.get_range(key, offset, length))

    async def head(self, key: str) -> ObjectInfo:
        return await self._retrying(lambda: self.inner.head(key))

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if if_none_match or if_match is not None:
            return await self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)
        return await self._retrying(lambda: self.inner.put(key, body))

    async def put_file(
        self, key: str, path: str, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if if_none_match or if_match is not None:
            return await self.inner.put_file(
                key, path, if_none_match=if_none_match, if_match=if_match
            )
        return await self._retrying(lambda: self.inner.put_file(key, path))

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        # Pages are not re-requested here (S3Store retries per page): a failed listing
        # surfaces, as it does when every attempt at a page fails.
        async for info in self.inner.list(prefix, start_after):
            yield info

    def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        return self.inner.common_prefixes(prefix)

    async def delete(self, key: str) -> None:
        await self._retrying(lambda: self.inner.delete(key), repeat_unknown=False)

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        return await self.inner.sign_delete(key, expires_in_s=expires_in_s)

    async def send_signed_delete(self, request: SignedDelete) -> None:
        await self.inner.send_signed_delete(request)  # sent once, as `S3Store` does

    async def close(self) -> None:
        await self.inner.close()
