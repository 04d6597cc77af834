"""Store calls of one acceptance request, under its time budget (PROTOCOL §3.2), and
what the request can end in (`Accepted`, `IdentityConflictFound`, `AcceptanceUnavailable`;
`collector.accept` re-exports them).

`BudgetedRequest` runs each call with what is left of the request's budget, counts the
calls (``store_ops`` of the answer) and reports each one's result to the metrics
observer. A call cut short by the budget is "outcome unknown": it may have been applied.
When the budget or the retries run out, `BudgetExhausted` ends the request (503).
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from protocol import records
from protocol.batch_api import CLOCK_SKEWED
from protocol.clock import Clock
from store.base import ObjectStore
from store.errors import (
    ConditionConflict,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    Unavailable,
)
from store.retry import Backoff

T = TypeVar("T")


class FrameIdentity(Protocol):
    """What acceptance needs of a decoded frame header (`protocol.frame.FrameHeader`)."""

    @property
    def agent_id(self) -> str: ...
    @property
    def boot_id(self) -> object: ...
    @property
    def seq_start(self) -> int: ...
    @property
    def seq_end(self) -> int: ...
    @property
    def record_count(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Accepted:
    manifest: records.AcceptedManifest
    duplicate: bool
    store_ops: int


@dataclass(frozen=True, slots=True)
class IdentityConflictFound:
    accepted: records.AcceptedManifest
    submitted_frame_sha256: str
    quarantine_key: str
    store_ops: int


class AcceptanceUnavailable(Exception):
    """The store did not settle the outcome within the budget. Answer 503; nothing is known."""


class ClockSkewed(AcceptanceUnavailable):
    """This host's clock is beyond ``store.max_clock_skew_s`` off the store's (PROTOCOL
    §3.8), so this collector refuses every batch rather than stamp ``accepted_at`` with it
    (checked before its first write, and again before each manifest create). Answered 503
    `code` rather than ``store_unavailable``: the refusal is this collector's own, so an
    agent may try another collector at once instead of backing off (`agent.uploader`)."""

    code = CLOCK_SKEWED


AcceptedHook = Callable[[records.AcceptedManifest, bytes], None]
"""Called with the manifest and the frame for every `Accepted` (new or duplicate): the
live query window (`collector.query.sources.OwnBatches`). Must not block."""


StoreOpObserver = Callable[[str, str], None]


class BudgetExhausted(Exception):
    """The request's budget or retries ran out before the store settled its outcome."""


class Created(enum.Enum):
    """What an idempotent create found: it created the key, an earlier attempt whose
    answer was lost may have (then 412), or the key was already there."""

    YES = "created"
    MAYBE = "maybe"
    EXISTED = "existed"


def result_name(exc: BaseException | None) -> str:
    if exc is None:
        return "ok"
    names: dict[type[BaseException], str] = {
        PreconditionFailed: "precondition_failed",
        ConditionConflict: "conflict",
        NotFound: "not_found",
        OutcomeUnknown: "outcome_unknown",
        Unavailable: "unavailable",
    }
    return names.get(type(exc), "error")


class BudgetedRequest:
    """The store, the clock and the retry policy, with one request's deadline."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        clock: Clock,
        rng: random.Random,
        backoff: Backoff,
        observe: StoreOpObserver,
        budget_s: float,
    ) -> None:
        self.store = store
        self.clock = clock
        self._rng = rng
        self._backoff = backoff
        self._observe = observe
        self.deadline = clock.monotonic() + budget_s
        self.ops = 0

    def delays(self) -> Iterator[float]:
        """A fresh sequence of jittered retry delays (bounded)."""
        return self._backoff.delays(self._rng)

    async def call(self, op: str, key: str, call: Callable[[], Awaitable[T]]) -> T:
        remaining = self.deadline - self.clock.monotonic()
        if remaining <= 0:
            raise BudgetExhausted
        self.ops += 1
        error: BaseException | None = None
        try:
            async with asyncio.timeout(remaining):
                return await call()
        except TimeoutError:
            error = OutcomeUnknown(op, key, "request budget ran out during the call")
            raise error from None
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._observe(op, result_name(error))

    async def pause(self, delays: Iterator[float]) -> None:
        """Sleep the next jittered delay, or give up when retries or the budget run out."""
        delay = next(delays, None)
        remaining = self.deadline - self.clock.monotonic()
        if delay is None or remaining <= 0:
            raise BudgetExhausted
        await self.clock.sleep(min(float(delay), remaining))

    async def create_idempotent(self, op: str, key: str, body: bytes) -> Created:
        """Create ``key`` if absent; 412 is success. Retried: If-None-Match makes it
        idempotent (every writer of a key writes the same bytes, and a repeat of our own
        create is answered 412)."""
        created, _etag = await self.create_idempotent_etag(op, key, body)
        return created

    async def create_idempotent_etag(
        self, op: str, key: str, body: bytes
    ) -> tuple[Created, str | None]:
        """`create_idempotent`, with the ETag the store answered when the create was
        ours (`Created.YES`; ``None`` otherwise)."""
        delays = self.delays()
        maybe_ours = False
        while True:
            try:
                etag = await self.call(
                    op, key, lambda: self.store.put(key, body, if_none_match=True)
                )
                return Created.YES, etag
            except PreconditionFailed:
                return (Created.MAYBE if maybe_ours else Created.EXISTED), None
            except OutcomeUnknown:
                maybe_ours = True
            except (ConditionConflict, Unavailable):
                pass
            await self.pause(delays)
