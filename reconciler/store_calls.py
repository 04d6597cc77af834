"""The reconciler's store calls, each retried a bounded number of times with jitter.

Only calls that are safe to repeat are retried here: reads, and If-None-Match creates
(a repeat either creates the object or finds it: 412). Errors left after the retries
propagate as the store raised them; callers count them and leave the work for next time.

An exception from the store that is not a `StoreError` (a key an implementation cannot
take, a bug in a store or a wrapper) becomes `StoreCallFailed`, a `StoreError`: the
caller's handling of store errors then fails the one record whose call it was (counted,
logged, redone later), instead of the exception ending the whole steady pass or audit.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import TypeVar

from reconciler.context import ReconcilerContext
from store.errors import (
    ConditionConflict,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    StoreError,
    Unavailable,
)

T = TypeVar("T")


class Created(enum.Enum):
    """Outcome of `create_if_absent`."""

    CREATED = "created"
    EXISTED = "existed"
    MAYBE = "maybe"
    """412 after an attempt whose answer was lost: ours may have landed."""


class StoreCallFailed(StoreError):
    """The store raised something other than a `StoreError` for this call (in ``detail``).
    Not retried: nothing says a repeat would go differently."""


async def _retrying(
    ctx: ReconcilerContext, op: str, key: str, call: Callable[[], Awaitable[T]]
) -> T:
    delays = ctx.backoff.delays(ctx.rng)
    while True:
        try:
            return await call()
        except (Unavailable, ConditionConflict):
            delay = next(delays, None)
            if delay is None:
                raise
            await ctx.clock.sleep(delay)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreCallFailed(op, key, repr(exc)) from exc


async def read(ctx: ReconcilerContext, key: str) -> bytes | None:
    """The body at ``key``, or ``None`` when absent."""
    found = await read_with_etag(ctx, key)
    return None if found is None else found[0]


async def read_with_etag(ctx: ReconcilerContext, key: str) -> tuple[bytes, str] | None:
    """The body at ``key`` and its ETag, or ``None`` when absent."""

    async def call() -> tuple[bytes, str] | None:
        try:
            return await ctx.store.get(key)
        except NotFound:
            return None

    return await _retrying(ctx, "get", key, call)  # safe to repeat: a read


async def create_if_absent(ctx: ReconcilerContext, key: str, body: bytes) -> Created:
    """Create ``key`` with If-None-Match. The caller checked the fence for this batch."""
    lost_answer = False

    async def call() -> Created:
        nonlocal lost_answer
        try:
            await ctx.store.put(key, body, if_none_match=True)
        except PreconditionFailed:
            return Created.MAYBE if lost_answer else Created.EXISTED
        except OutcomeUnknown:
            lost_answer = True
            raise
        return Created.CREATED

    # Safe to repeat: If-None-Match turns a repeat of a create that landed into a 412.
    return await _retrying(ctx, "put", key, call)
