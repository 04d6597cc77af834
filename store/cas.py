"""Read-modify-write of one object under compare-and-swap: the generic transactional object.

`update_object` knows nothing about what the object holds: the caller's ``mutate`` turns
the current body (or ``None`` when absent) into the next one. Pointers, leases and
checkpoints are built on it; their invariant checks belong in ``mutate`` (raise to
abort), so they run against every base the loop retries from.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from protocol.clock import Clock
from store.base import ObjectStore
from store.errors import (
    ConditionConflict,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    StoreError,
    Unavailable,
)
from store.retry import Backoff


class CasExhausted(StoreError):
    """Every attempt of a compare-and-swap lost a race or met a fault, and none of our
    writes can have landed. Nothing was changed by us: retry later, or report contention."""


@dataclass(frozen=True, slots=True)
class CasResult:
    """What is stored after a successful `update_object`.

    ``body``/``etag`` are the object as it now stands (``None`` for both when it is absent
    and ``mutate`` wanted no change); ``written`` tells whether this call changed it.
    """

    body: bytes | None
    etag: str | None
    written: bool
    attempts: int


async def update_object(
    store: ObjectStore,
    key: str,
    mutate: Callable[[bytes | None], bytes | None],
    *,
    backoff: Backoff,
    rng: random.Random,
    clock: Clock,
) -> CasResult:
    """Apply ``mutate`` to the object at ``key`` atomically, retrying lost races.

    Each attempt reads the object, calls ``mutate(body)`` (``None`` body: absent) and
    writes the result with ``If-Match`` on the ETag read (``If-None-Match: *`` when
    absent). ``mutate`` returning ``None`` means no change: the current state is returned
    without a write. Exceptions from ``mutate`` propagate unchanged.

    Retries, at most ``backoff.attempts`` attempts in all: `PreconditionFailed` (someone
    else changed the object: re-read at once), `ConditionConflict` and `Unavailable`
    (back off with jitter). When a write's outcome is unknown, later reads first check
    whether it landed (the stored body equals what we wrote) and if so report success.

    ``mutate`` may run several times, on different bases, and must be pure. If a lost
    answer hides a write that landed and was then overwritten by another writer, the loop
    cannot see it and applies ``mutate`` again: bodies that must not be applied twice
    should carry a unique id that ``mutate`` checks for.

    Raises `CasExhausted` when attempts run out with nothing of ours possibly stored,
    `OutcomeUnknown` when they run out while a write of ours may have landed.
    """
    delays = backoff.delays(rng)
    maybe_landed: list[bytes] = []  # bodies whose write had an unknown outcome
    last_error: StoreError | None = None
    for attempt in range(1, backoff.attempts + 1):
        # Why repeating is safe: every write is conditional on the exact state this
        # attempt read, so a stale attempt can only fail, never clobber a newer state;
        # and a write that may have landed is looked for before anything is written again.
        try:
            try:
                body, etag = await store.get(key)
            except NotFound:
                body, etag = None, None
            if body is not None and body in maybe_landed:
                return CasResult(body, etag, written=True, attempts=attempt)
            new_body = mutate(body)
            if new_body is None:
                return CasResult(body, etag, written=False, attempts=attempt)
            try:
                if etag is None:
                    new_etag = await store.put(key, new_body, if_none_match=True)
                else:
                    new_etag = await store.put(key, new_body, if_match=etag)
            except OutcomeUnknown:
                maybe_landed.append(new_body)
                raise
            return CasResult(new_body, new_etag, written=True, attempts=attempt)
        except PreconditionFailed as exc:
            last_error = exc
            sleep = False  # someone else made progress: re-read straight away
        except (ConditionConflict, Unavailable) as exc:
            last_error = exc
            sleep = True
        delay = next(delays, None)
        if delay is not None and sleep:
            await clock.sleep(delay)
    detail = f"gave up after {backoff.attempts} attempts; last: {last_error}"
    if maybe_landed:
        raise OutcomeUnknown("update", key, detail) from last_error
    raise CasExhausted("update", key, detail) from last_error
