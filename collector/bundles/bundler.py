"""The group commit of one collector process (PROTOCOL §3.10 "Writing").

One `Bundler` per process. A frame that passed its checks joins the *open bundle*
(`Bundler.place`); the open bundle is sent as soon as fewer than ``max_in_flight`` raw
writes are in flight, so a frame waits for a write slot (up to one raw write), never for
a timer; or, with ``eager_frames`` set, as soon as it holds that many frames, slots busy
or not (`BundleLimits.eager_frames`: beyond PROTOCOL §3.10's rule, see there). Sent with
one frame, it is that frame's plain frame blob, written by the caller on today's path
while it holds the slot (`Placement.wrote` gives it back): a quiet collector behaves
exactly as before, 2 PUTs a batch. Sent with more, the bundle is written by the ``write``
function (`collector.bundles.bundle_write`) and every frame learns its range in it
(`BundleSpot`), or the write's failure.

Closing and backpressure: the open bundle closes once its frames reach ``max_bytes`` or
``max_frames``; a closed bundle waits for a slot (unless it holds ``eager_frames``), and
while it waits a new frame is refused (`BundlesFull`: 429, the overloaded answer). Each
frame's share of the bundle (its bytes and its index entry, the footer with the first) is
charged to the process's in-flight bytes (`ByteAccount`, ``http.max_in_flight_bytes``)
when it joins (refused: 429) and released when the bundle's last frame is answered
(`Placement.answered`).

Deadlines: a frame's deadline is its request's (start + budget). It must leave time to
send its bundle and its manifest create: a frame that cannot join with ``send_margin_s``
left, or whose deadline less that margin passes while its bundle waits, leaves the open
bundle and is answered 503 (`BudgetExhausted`); so a bundle is never sent after the
earliest deadline of its frames (the write's own budget ends there too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from protocol.bundle import ENTRY_LEN, FOOTER_LEN
from protocol.clock import Clock

from ..store_calls import AcceptanceUnavailable, BudgetExhausted

log = structlog.get_logger(__name__)


class BundlesFull(AcceptanceUnavailable):
    """The open bundle is full and waits for a write slot, or its bytes would pass the
    in-flight cap: answer 429 (overloaded); the agent retries. A caller that does not
    tell it apart (a receiver) answers it as unavailable, also a retry."""


@dataclass(frozen=True, slots=True)
class BundleLimits:
    max_in_flight: int = 2
    max_bytes: int = 8 * 1024 * 1024
    max_frames: int = 1000
    send_margin_s: float = 5.0
    """The time a frame must have left when its bundle is sent: the bundle PUT and then
    its manifest create (`BundleLimits.margin`)."""
    eager_frames: int = 0
    """An open bundle of this many frames is sent at once, even while ``max_in_flight``
    raw writes are in flight (0: never; ``ingest.bundle_eager_frames``).

    Not in PROTOCOL §3.10, whose rule is the slots alone. Under that rule a frame at a
    busy collector waits for a slot, a fraction of a raw write, and issue 33's c32 ack
    p50 target (no worse than bundles off) failed at every slot count that met its cost
    target (bench/RESULTS.md, "Write slots"; this rule: "Eager bundles"). A write sent
    early carries at least this many frames, so it costs at most 1/eager_frames PUT a
    frame: the cost bound holds by construction, and a quiet collector (a free slot for
    every frame) is unchanged.
    The writes in flight stay bounded: at most ``max_in_flight`` plus the frames in
    flight (``http.max_in_flight_requests``, or a landing round's) / ``eager_frames``."""

    @staticmethod
    def margin(*, store_timeout_s: float, budget_s: float) -> float:
        """``send_margin_s`` for a request budget and a store call's longest time (connect
        plus read timeout). PROTOCOL §3.10 allows each of the two calls the store's
        timeout; with the default settings that is 70 s against a 10 s budget, which
        would send nothing. Every call is cut at the request's deadline anyway (an
        unknown outcome, `collector.store_calls`), so the margin only keeps a frame from
        waiting into a deadline it could not meet: at most half the budget."""
        return min(2 * store_timeout_s, budget_s / 2)


class ByteAccount(Protocol):
    """The process's in-flight bytes (`collector.in_flight.InFlight` under
    ``http.max_in_flight_bytes``)."""

    def try_charge(self, size: int) -> bool: ...
    def release(self, size: int) -> None: ...


@dataclass(frozen=True, slots=True)
class BundleSpot:
    """Where a frame is: bytes [offset, +length) of the bundle ``key`` of ``frames``
    frames, whose write took ``ops`` store requests."""

    key: str
    offset: int
    frames: int
    ops: int


@dataclass(frozen=True, slots=True)
class SentBundle:
    """What ``write`` returns: the bundle's key, each frame's offset (in order), and the
    store requests it took."""

    key: str
    offsets: Sequence[int]
    ops: int


WriteBundle = Callable[[Sequence[bytes], Sequence[str], float], Awaitable[SentBundle]]
"""``write(frames, frame_sha256s, write_by)``: step 1 for a bundle of two or more frames,
done by ``write_by`` (monotonic: half the send margin before the earliest deadline of its
frames); raises `BudgetExhausted` (every frame 503)."""


@dataclass(eq=False)
class _Member:
    frame: bytes
    sha: str
    joined: float  # monotonic: when it joined the open bundle
    send_by: float
    bundle: _Bundle
    future: asyncio.Future[BundleSpot | None]


@dataclass(eq=False)
class _Bundle:
    members: list[_Member] = field(default_factory=list)
    size: int = 0
    charged: int = 0
    unanswered: int = 0


class Placement:
    """A frame's place: ``spot`` in a bundle, or ``None``: the caller writes the frame blob
    holding a write slot, then calls `wrote`. `answered` when the frame's answer is
    decided (every path, exactly once)."""

    def __init__(self, bundler: Bundler, member: _Member, spot: BundleSpot | None) -> None:
        self.spot = spot
        self._bundler = bundler
        self._member = member
        self._holds_slot = spot is None
        self._open = True

    def wrote(self) -> None:
        if self._holds_slot:
            self._holds_slot = False
            self._bundler._slot_freed()

    def answered(self) -> None:
        self.wrote()
        if self._open:
            self._open = False
            self._bundler._answered(self._member)


class Bundler:
    def __init__(
        self,
        *,
        limits: BundleLimits,
        clock: Clock,
        write: WriteBundle,
        account: ByteAccount | None = None,
        on_raw_put: Callable[[int], None] | None = None,
        on_slot_wait: Callable[[float], None] | None = None,
    ) -> None:
        """``on_raw_put(n)``: a raw object of ``n`` frames is being written
        (``lm_collector_frames_per_raw_put``); ``on_slot_wait(s)``: a frame waited ``s``
        seconds from `place` until its raw object was being written (its write slot)."""
        self._limits = limits
        self._clock = clock
        self._write = write
        self.account = account
        self._on_raw_put = on_raw_put or (lambda _n: None)
        self._on_slot_wait = on_slot_wait or (lambda _s: None)
        self._open: _Bundle | None = None
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def waiting(self) -> int:
        """Frames in the open bundle, waiting for a write slot."""
        return 0 if self._open is None else len(self._open.members)

    @property
    def in_flight(self) -> int:
        """Raw writes of this bundler in flight (bundles, and frame blobs it handed out)."""
        return self._in_flight

    async def place(self, frame: bytes, sha: str, deadline: float) -> Placement:
        """Join the open bundle and wait until it is sent. Raises `BundlesFull` (429) or
        `BudgetExhausted` (503: the frame cannot be sent in time, or its bundle's write
        failed)."""
        send_by = deadline - self._limits.send_margin_s
        joined = self._clock.monotonic()
        if send_by <= joined:
            raise BudgetExhausted
        bundle = self._open
        if bundle is None:
            bundle = self._open = _Bundle()
        elif self._full(bundle):
            raise BundlesFull
        share = len(frame) + ENTRY_LEN + (FOOTER_LEN if not bundle.members else 0)
        if self.account is not None and not self.account.try_charge(share):
            raise BundlesFull
        future: asyncio.Future[BundleSpot | None] = asyncio.get_running_loop().create_future()
        member = _Member(frame, sha, joined, send_by, bundle, future)
        bundle.members.append(member)
        bundle.size += len(frame)
        bundle.charged += share
        bundle.unanswered += 1
        self._pump()
        timer = None
        if not future.done():
            wait = max(0.0, send_by - self._clock.monotonic())
            timer = asyncio.get_running_loop().call_later(wait, self._evict, member)
        try:
            spot = await future
        except BaseException:
            self._leave(member)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return Placement(self, member, spot)

    def _may_send(self, bundle: _Bundle) -> bool:
        if self._in_flight < self._limits.max_in_flight:
            return True
        eager = self._limits.eager_frames
        return 0 < eager <= len(bundle.members)

    def _full(self, bundle: _Bundle) -> bool:
        return (
            len(bundle.members) >= self._limits.max_frames or bundle.size >= self._limits.max_bytes
        )

    def _pump(self) -> None:
        """Send the open bundle while a write slot is free or it holds `eager_frames`."""
        while self._open is not None and self._may_send(self._open):
            bundle, self._open = self._open, None
            now = self._clock.monotonic()
            live: list[_Member] = []
            for member in bundle.members:
                if member.future.done():
                    continue  # cancelled (its request ended)
                if member.send_by <= now:  # checked again here: never sent past a deadline
                    member.future.set_exception(BudgetExhausted())
                else:
                    live.append(member)
            if not live:
                continue
            self._in_flight += 1
            self._on_raw_put(len(live))
            for member in live:
                # Observed here, when its raw object starts being written: a bundled
                # frame's `place` returns only once the bundle's write is done, and the
                # write is not a wait for a slot.
                self._on_slot_wait(now - member.joined)
            if len(live) == 1:
                live[0].future.set_result(None)  # a plain frame blob: the caller writes it
                continue
            task = asyncio.create_task(self._send(live), name="bundle-write")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, members: list[_Member]) -> None:
        try:
            # The write may take until half the margin before the earliest deadline;
            # the other half is left for that frame's manifest create.
            write_by = min(m.send_by for m in members) + self._limits.send_margin_s / 2
            sent = await self._write([m.frame for m in members], [m.sha for m in members], write_by)
        except BaseException as exc:
            # Cancelled (the worker stops): its frames are answered 503, never left waiting.
            failure = exc if isinstance(exc, Exception) else BudgetExhausted()
            log.warning("bundle_write_failed", frames=len(members), error=repr(exc))
            for member in members:
                if not member.future.done():
                    member.future.set_exception(failure)
            if failure is not exc:
                raise
        else:
            for member, offset in zip(members, sent.offsets, strict=True):
                if not member.future.done():
                    spot = BundleSpot(sent.key, offset, len(members), sent.ops)
                    member.future.set_result(spot)
        finally:
            self._slot_freed()

    def _slot_freed(self) -> None:
        self._in_flight -= 1
        self._pump()

    def _evict(self, member: _Member) -> None:
        """The frame's deadline less the margin passed while its bundle waited: it leaves
        the open bundle (503)."""
        if self._open is member.bundle and member in member.bundle.members:
            member.bundle.members.remove(member)
            member.bundle.size -= len(member.frame)
            if not member.future.done():
                member.future.set_exception(BudgetExhausted())

    def _leave(self, member: _Member) -> None:
        """`place` ends without a placement (503, 429, or its request was cancelled)."""
        future = member.future
        if self._open is member.bundle and member in member.bundle.members:
            member.bundle.members.remove(member)
            member.bundle.size -= len(member.frame)
        elif future.done() and not future.cancelled() and future.exception() is None:
            if future.result() is None:  # handed a slot for its frame blob, then cancelled
                self._slot_freed()
        self._answered(member)

    def _answered(self, member: _Member) -> None:
        bundle = member.bundle
        bundle.unanswered -= 1
        if bundle.unanswered == 0 and self.account is not None and bundle.charged:
            self.account.release(bundle.charged)
            bundle.charged = 0
