"""Errors raised by every `ObjectStore`, grouped by what the caller should do.

Every error carries the operation (``get``, ``put``, ...) and the key it was about, so a
log line or a traceback names the object without further context.

What to do with each:

- `NotFound`: the object does not exist. Final for this key at this moment.
- `PreconditionFailed`: HTTP 412. An ``If-None-Match: *`` create found the key present, or
  an ``If-Match`` found a different ETag (or no object). Final: re-read and decide.
- `ConditionConflict`: HTTP 409 ConditionalRequestConflict: a concurrent conditional
  write to the same key was in progress. Not evidence of anything; retry with backoff.
- `Unavailable`: 5xx, throttling, timeouts, refused connections *before* the request
  could have been applied. Back off and retry, or answer 503.
- `OutcomeUnknown` (a kind of `Unavailable`): the request may or may not have been
  applied (the answer was lost). For a conditional create, only a later read decides.
- `RequestExpired`: a signed request (`store.base.SignedDelete`) reached the store after
  its expiry and was refused; nothing was applied. Final: never send it again.
- `StoreConfigError`: the store URL or options are wrong. Fix the configuration.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every store error; ``op`` and ``key`` name what failed."""

    def __init__(self, op: str, key: str, detail: str = "") -> None:
        self.op = op
        self.key = key
        self.detail = detail
        message = f"{op} {key!r}"
        if detail:
            message += f": {detail}"
        super().__init__(message)


class NotFound(StoreError):
    """The object does not exist."""


class PreconditionFailed(StoreError):
    """412: the condition of a conditional write (or read) did not hold. Re-read."""


class ConditionConflict(StoreError):
    """409: a concurrent conditional write is in progress. Retry with backoff."""


class Unavailable(StoreError):
    """The store could not be reached or refused for load; nothing was applied. Back off."""


class OutcomeUnknown(Unavailable):
    """The request may have been applied; only a later read tells."""


class RequestExpired(StoreError):
    """A signed request arrived after its expiry and was refused: nothing was applied.
    Never re-send or re-sign it blindly; whoever signed it decides afresh."""


class StoreConfigError(ValueError):
    """The store URL or its options are invalid."""
