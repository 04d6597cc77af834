"""What remote reads hold and what happened to them (PROTOCOL §5): what the forwarding of
PromQL requests needs ("The PromQL engine"), and the byte budget of answers in flight.

- `ReadOutcomes`: every read this collector refused or failed, and every known gap of a
  read it served, with the principal that read. A forwarded request opens a watch
  (`ReadOutcomes.watch`, or `begin`/`since`/`end`) when it is sent to the engine and
  reads it when the answer is back: any ``"limit"`` outcome → 422 ``execution``, any
  ``"load"`` outcome (load or store trouble) → 503 ``unavailable``, ``"partial"`` → a
  ``partial:`` warning. Over-reporting under concurrency is allowed, under-reporting is
  not: outcomes are kept while any watch is open (up to `MAX_KEPT`; a watch that
  outlived what was kept is told so, ``complete = False``, and must assume the worst).
- `InternalPrincipals`: the engine's internal read principal(s): a random token made at
  each engine start, valid only for ``POST /api/v1/read``, never in the tokens file.
  `collector.promql.read_endpoint` authenticates such a token here first; an internal
  principal's reads take their bytes from a pool of their own (the same size as
  ``query.max_read_bytes_in_flight``) so they are never refused or starved for
  concurrency by outside readers while a forwarded query runs (no deadlock against its
  own engine).
- `ByteBudget`: ``query.max_read_bytes_in_flight``, the estimated bytes of the answers
  being built and sent (one budget for outside readers, one for internal ones).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from config.tokens import Principal

MAX_KEPT = 10_000
KINDS = ("limit", "load", "partial")


@dataclass(frozen=True, slots=True)
class ReadOutcome:
    sequence: int
    principal: str
    kind: str  # "limit" | "load" | "partial"
    status: int  # the read's HTTP status (200 for a served read with a known gap)
    message: str


@dataclass(slots=True)
class Watched:
    """What happened to reads while a watch was open."""

    outcomes: list[ReadOutcome] = field(default_factory=list)
    complete: bool = True  # False: older outcomes were forgotten; assume a failure

    def of_kind(self, kind: str) -> list[ReadOutcome]:
        return [o for o in self.outcomes if o.kind == kind]

    @property
    def failed(self) -> bool:
        return not self.complete or any(o.kind in ("limit", "load") for o in self.outcomes)


class ReadOutcomes:
    def __init__(self, *, max_kept: int = MAX_KEPT) -> None:
        self._kept: deque[ReadOutcome] = deque()
        self._max_kept = max_kept
        self._sequence = itertools.count(1)
        self._last = 0
        self._open: dict[int, int] = {}  # token -> sequence at begin
        self._tokens = itertools.count(1)
        self._forgot_through = 0

    def record(self, principal: str, kind: str, status: int, message: str) -> None:
        """One refused or failed read (``kind`` "limit" or "load"), or a gap in one served
        (``"partial"``). Kept only while some watch is open."""
        if kind not in KINDS:
            raise ValueError(f"unknown outcome kind {kind!r}")
        self._last = next(self._sequence)
        if not self._open:
            return
        self._kept.append(ReadOutcome(self._last, principal, kind, status, message))
        while len(self._kept) > self._max_kept:
            self._forgot_through = self._kept.popleft().sequence

    def begin(self) -> int:
        """Open a watch; its token for `since` and `end`."""
        token = next(self._tokens)
        self._open[token] = self._last
        return token

    def since(self, token: int, principal: str | None = None) -> Watched:
        """Outcomes recorded since `begin` returned ``token`` (of ``principal`` only,
        when given)."""
        start = self._open[token]
        found = [
            o
            for o in self._kept
            if o.sequence > start and (principal is None or o.principal == principal)
        ]
        return Watched(found, complete=self._forgot_through <= start)

    def end(self, token: int) -> None:
        self._open.pop(token, None)
        if not self._open:
            self._kept.clear()
            self._forgot_through = 0
            return
        oldest = min(self._open.values())
        while self._kept and self._kept[0].sequence <= oldest:
            self._kept.popleft()

    @contextmanager
    def watch(self, principal: str | None = None) -> Iterator[Watched]:
        """``with outcomes.watch(name) as seen:`` ... ``seen`` is filled when the block
        ends (read it after the ``with``)."""
        token = self.begin()
        seen = Watched()
        try:
            yield seen
        finally:
            result = self.since(token, principal)
            seen.outcomes, seen.complete = result.outcomes, result.complete
            self.end(token)


class InternalPrincipals:
    """Tokens of the engine's internal read principals (see the module doc)."""

    def __init__(self) -> None:
        self._by_hash: dict[str, Principal] = {}

    def add(self, name: str, token: str) -> Principal:
        """Make ``token`` a read token of the internal principal ``name`` (replacing the
        principal's previous token: one per engine start)."""
        self.remove(name)
        digest = hashlib.sha256(token.encode("utf-8")).hexdigest()
        principal = Principal(name=name, token_sha256=digest, read=True)
        self._by_hash[digest] = principal
        return principal

    def remove(self, name: str) -> None:
        for digest in [d for d, p in self._by_hash.items() if p.name == name]:
            del self._by_hash[digest]

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The internal principal a ``Bearer`` header names, or None."""
        if not authorization or not self._by_hash:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        try:
            digest = hashlib.sha256(token.strip().encode("utf-8")).hexdigest()
        except UnicodeEncodeError:
            return None
        for known, principal in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return principal
        return None

    def is_internal(self, principal: Principal) -> bool:
        return any(p.name == principal.name for p in self._by_hash.values()) and (
            principal.token_sha256 in self._by_hash
        )


class ByteBudget:
    """Bytes of answers in flight, at most ``capacity``: `acquire` waits (first come,
    first served) until its bytes are free; a request larger than the whole budget takes
    all of it, so it is served alone rather than never."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def try_acquire(self, size: int) -> int | None:
        size = min(size, self.capacity)
        if self._waiting or self.used + size > self.capacity:
            return None
        self.used += size
        return size

    async def acquire(self, size: int) -> int:
        granted = self.try_acquire(size)
        if granted is not None:
            return granted
        size = min(size, self.capacity)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, waiter)
        self._waiting.append(entry)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release(size)  # granted as we were cancelled
            else:
                self._waiting.remove(entry)
                self._wake()
            raise
        return size

    def release(self, size: int) -> None:
        self.used -= size
        self._wake()

    def _wake(self) -> None:
        while self._waiting and self.used + self._waiting[0][0] <= self.capacity:
            size, waiter = self._waiting.popleft()
            if not waiter.done():
                self.used += size
                waiter.set_result(None)
