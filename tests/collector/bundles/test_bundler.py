"""The bundler on its own (PROTOCOL §3.10 "Writing"): slots, closing, 429 while full,
deadlines, and the in-flight byte charge; the write is a stub the test controls."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from collector.bundles.bundler import (
    BundleLimits,
    Bundler,
    BundlesFull,
    Placement,
    SentBundle,
)
from collector.store_calls import BudgetExhausted
from protocol.bundle import ENTRY_LEN, FOOTER_LEN
from protocol.clock import ManualClock
from tests.collector.bundles.harness import wait_until

FRAME = b"f" * 100


class Account:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.charged = 0

    def try_charge(self, size: int) -> bool:
        if self.charged + size > self.cap:
            return False
        self.charged += size
        return True

    def release(self, size: int) -> None:
        self.charged -= size


class Writes:
    """The bundle write stub: each call waits for `go`, then answers offsets."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float]] = []
        self.go = asyncio.Event()
        self.fail: Exception | None = None

    async def __call__(
        self, frames: Sequence[bytes], shas: Sequence[str], write_by: float
    ) -> SentBundle:
        self.calls.append((len(frames), write_by))
        await self.go.wait()
        if self.fail is not None:
            raise self.fail
        offsets = [sum(len(f) for f in frames[:i]) for i in range(len(frames))]
        return SentBundle("raw-bundles/k", offsets, 1)


def bundler(
    *,
    frames: int = 1000,
    size: int = 1 << 20,
    account: Account | None = None,
    eager: int = 0,
    waits: list[float] | None = None,
) -> tuple[Bundler, Writes, ManualClock, list[int]]:
    clock = ManualClock()
    writes = Writes()
    puts: list[int] = []
    limits = BundleLimits(
        max_in_flight=1, max_bytes=size, max_frames=frames, send_margin_s=1.0, eager_frames=eager
    )
    b = Bundler(
        limits=limits,
        clock=clock,
        write=writes,
        account=account,
        on_raw_put=puts.append,
        on_slot_wait=None if waits is None else waits.append,
    )
    return b, writes, clock, puts


async def take_slot(b: Bundler) -> Placement:
    """A first frame, handed the only slot for its frame blob (held until `wrote`)."""
    placement = await b.place(FRAME, "a" * 64, deadline=5.0)
    assert placement.spot is None and b.in_flight == 1
    return placement


async def test_frames_wait_for_the_slot_then_go_as_one_bundle() -> None:
    b, writes, _clock, puts = bundler()
    solo = await take_slot(b)
    waiting = [asyncio.create_task(b.place(FRAME, f"{i:064x}", deadline=5.0)) for i in range(3)]
    await wait_until(lambda: b.waiting == 3)
    assert writes.calls == []
    solo.wrote()
    writes.go.set()
    spots = [(await t).spot for t in waiting]
    assert [s.offset for s in spots if s] == [0, 100, 200]
    assert puts == [1, 3] and len(writes.calls) == 1
    assert writes.calls[0][1] == pytest.approx(4.5)  # half the margin before the deadline


async def test_a_bundle_of_eager_frames_goes_at_once_while_the_slots_are_busy() -> None:
    b, writes, _clock, puts = bundler(eager=3)
    solo = await take_slot(b)
    first = [asyncio.create_task(b.place(FRAME, f"{i:064x}", deadline=5.0)) for i in range(4)]
    await wait_until(lambda: len(writes.calls) == 1)
    # The third frame made the open bundle eager: sent beside the busy slot; the fourth
    # waits in a new open bundle (one frame: not eager) for a slot.
    assert b.in_flight == 2 and b.waiting == 1 and puts == [1, 3]
    more = [asyncio.create_task(b.place(FRAME, f"{i:064x}", deadline=5.0)) for i in (4, 5)]
    await wait_until(lambda: len(writes.calls) == 2)
    assert b.in_flight == 3 and b.waiting == 0 and puts == [1, 3, 3]
    writes.go.set()
    spots = [(await t).spot for t in [*first, *more]]
    assert [s.frames for s in spots if s] == [3, 3, 3, 3, 3, 3]
    solo.wrote()
    await wait_until(lambda: b.in_flight == 0)
    assert len(writes.calls) == 2


async def test_without_eager_frames_a_bundle_waits_for_a_slot_however_many_it_holds() -> None:
    b, writes, _clock, puts = bundler(eager=0)
    solo = await take_slot(b)
    waiting = [asyncio.create_task(b.place(FRAME, f"{i:064x}", deadline=5.0)) for i in range(50)]
    await wait_until(lambda: b.waiting == 50)
    assert writes.calls == [] and b.in_flight == 1 and puts == [1]
    solo.wrote()
    writes.go.set()
    assert {(await t).spot.frames for t in waiting} == {50}  # type: ignore[union-attr]


async def test_a_full_bundle_refuses_new_frames_429_until_a_slot_frees() -> None:
    b, writes, _clock, _puts = bundler(frames=2)
    solo = await take_slot(b)
    waiting = [asyncio.create_task(b.place(FRAME, f"{i:064x}", deadline=5.0)) for i in range(2)]
    await wait_until(lambda: b.waiting == 2)
    with pytest.raises(BundlesFull):
        await b.place(FRAME, "c" * 64, deadline=5.0)
    solo.wrote()
    writes.go.set()
    assert all(spot is not None for spot in [(await t).spot for t in waiting])


async def test_a_bundle_closes_at_max_bytes() -> None:
    b, _writes, _clock, _puts = bundler(size=150)
    await take_slot(b)
    first = asyncio.create_task(b.place(FRAME, "1" * 64, deadline=5.0))
    second = asyncio.create_task(b.place(FRAME, "2" * 64, deadline=5.0))  # reaches 200 >= 150
    await wait_until(lambda: b.waiting == 2)
    with pytest.raises(BundlesFull):
        await b.place(FRAME, "3" * 64, deadline=5.0)
    for task in (first, second):
        task.cancel()


async def test_bundle_bytes_are_charged_until_the_last_frame_is_answered() -> None:
    account = Account(cap=10_000)
    b, writes, _clock, _puts = bundler(account=account)
    solo = await take_slot(b)
    waiting = [asyncio.create_task(b.place(FRAME, f"{i:064x}", deadline=5.0)) for i in range(2)]
    await wait_until(lambda: b.waiting == 2)
    solo.wrote()
    writes.go.set()
    placements = [await t for t in waiting]
    share = 2 * (len(FRAME) + ENTRY_LEN) + FOOTER_LEN
    assert account.charged == share + len(FRAME) + ENTRY_LEN + FOOTER_LEN  # + the solo's
    solo.answered()
    placements[0].answered()
    assert account.charged == share  # the bundle's last frame is not answered yet
    placements[1].answered()
    assert account.charged == 0


async def test_a_frame_over_the_in_flight_byte_cap_is_refused_429() -> None:
    account = Account(cap=200)  # the first frame's share is 156 bytes
    b, _writes, _clock, _puts = bundler(account=account)
    await take_slot(b)
    with pytest.raises(BundlesFull):
        await b.place(FRAME, "b" * 64, deadline=5.0)


async def test_a_frame_without_time_to_be_sent_is_503_at_once() -> None:
    b, _writes, clock, _puts = bundler()
    with pytest.raises(BudgetExhausted):
        await b.place(FRAME, "a" * 64, deadline=clock.monotonic() + 0.5)  # margin is 1 s
    assert b.in_flight == 0


async def test_a_waiting_frame_whose_deadline_nears_leaves_the_bundle_with_503() -> None:
    b, writes, _clock, puts = bundler()
    solo = await take_slot(b)
    leaving = asyncio.create_task(b.place(FRAME, "b" * 64, deadline=1.02))  # 20 ms to wait
    staying = asyncio.create_task(b.place(FRAME, "c" * 64, deadline=5.0))
    await wait_until(lambda: b.waiting == 2)
    with pytest.raises(BudgetExhausted):
        await leaving
    solo.wrote()
    assert (await staying).spot is None  # alone now: a frame blob, not a bundle
    assert puts == [1, 1] and writes.calls == []


async def test_a_bundle_is_never_sent_past_the_deadline_of_a_frame() -> None:
    b, writes, clock, _puts = bundler()
    solo = await take_slot(b)
    waiting = [asyncio.create_task(b.place(FRAME, f"{i:064x}", deadline=3.0)) for i in range(2)]
    await wait_until(lambda: b.waiting == 2)
    clock.advance(2.5)  # past deadline - margin, before the timers fire
    solo.wrote()
    for task in waiting:
        with pytest.raises(BudgetExhausted):
            await task
    assert writes.calls == [] and b.in_flight == 0


async def test_a_failed_bundle_write_fails_every_frame_and_frees_the_slot() -> None:
    b, writes, _clock, _puts = bundler()
    solo = await take_slot(b)
    waiting = [asyncio.create_task(b.place(FRAME, f"{i:064x}", deadline=5.0)) for i in range(2)]
    await wait_until(lambda: b.waiting == 2)
    writes.fail = BudgetExhausted()
    solo.wrote()
    writes.go.set()
    for task in waiting:
        with pytest.raises(BudgetExhausted):
            await task
    await wait_until(lambda: b.in_flight == 0)


async def test_a_cancelled_frame_handed_the_slot_gives_it_back() -> None:
    b, _writes, _clock, _puts = bundler()
    solo = await take_slot(b)
    task = asyncio.create_task(b.place(FRAME, "b" * 64, deadline=5.0))
    await wait_until(lambda: b.waiting == 1)
    solo.wrote()  # the slot goes to the waiting frame ...
    task.cancel()  # ... whose request ends before it runs
    with pytest.raises(asyncio.CancelledError):
        await task
    assert b.in_flight == 0


async def test_a_bundle_write_cancelled_at_shutdown_answers_its_frames_503() -> None:
    b, writes, _clock, _puts = bundler()
    solo = await take_slot(b)
    waiting = [asyncio.create_task(b.place(FRAME, f"{i:064x}", deadline=5.0)) for i in range(2)]
    await wait_until(lambda: b.waiting == 2)
    solo.wrote()
    await wait_until(lambda: len(writes.calls) == 1)
    for task in b._tasks:
        task.cancel()
    for frame in waiting:
        with pytest.raises(BudgetExhausted):
            await frame
    await wait_until(lambda: b.in_flight == 0)


async def test_the_slot_wait_is_observed_per_frame_on_the_injected_clock() -> None:
    waits: list[float] = []
    b, writes, clock, _puts = bundler(waits=waits)
    solo = await take_slot(b)
    assert waits == [0.0]  # a free slot: no wait
    waiting = asyncio.create_task(b.place(FRAME, "b" * 64, deadline=5.0))
    await wait_until(lambda: b.waiting == 1)
    clock.advance(0.25)
    solo.wrote()
    writes.go.set()
    await waiting
    assert waits == [0.0, pytest.approx(0.25)]


async def test_the_slot_wait_of_bundled_frames_ends_when_their_bundle_is_sent() -> None:
    """Not when its write returns: the write is the raw PUT, not a wait for a slot."""
    waits: list[float] = []
    b, writes, clock, _puts = bundler(waits=waits)
    solo = await take_slot(b)
    first = asyncio.create_task(b.place(FRAME, "b" * 64, deadline=5.0))
    await wait_until(lambda: b.waiting == 1)
    clock.advance(0.1)
    second = asyncio.create_task(b.place(FRAME, "c" * 64, deadline=5.0))
    await wait_until(lambda: b.waiting == 2)
    clock.advance(0.25)
    solo.wrote()  # the slot frees: the bundle of two is sent
    await wait_until(lambda: len(writes.calls) == 1)
    clock.advance(2.0)  # the bundle's write takes this long
    writes.go.set()
    placements = await asyncio.gather(first, second)
    assert [p.spot is not None and p.spot.frames for p in placements] == [2, 2]
    assert waits == [0.0, pytest.approx(0.35), pytest.approx(0.25)]
