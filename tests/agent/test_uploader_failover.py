"""Failing over between collectors (`agent.uploader`): a fault that is one collector's
alone (no connection, 503 ``clock_skewed``) sends the next attempt to a collector not yet
tried at once; a fault every collector may share is met with backoff; every attempt counts
against the round's bound."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

import pytest

from agent.producer import BatchProducer
from agent.uploader import Outcome, Uploader, UploadPolicy
from protocol.clock import ManualClock
from store.retry import Backoff
from tests.agent.conftest import make_points
from tests.agent.fake_collector import DROP, CollectorState, FakeCollectors, Reply

# Delays of a whole second, so that any wait shows on the clock.
POLICY = UploadPolicy(
    concurrency=2, request_timeout_s=10.0, backoff=Backoff(attempts=5, base_s=1.0, cap_s=1.0)
)
SKEWED = Reply(503, {"error": "clock_skewed", "detail": "+3600.0s"}, {"Retry-After": "5"})
STORE_DOWN = Reply(503, {"error": "store_unavailable"}, {"Retry-After": "1"})


class CountingClock(ManualClock):
    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await super().sleep(seconds)


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A URL on which nothing listens: its port is bound (so no one else takes it) but not
    listening, so a connection is refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{bound.getsockname()[1]}"


async def send(urls: list[str], frame: bytes, clock: CountingClock):
    async with Uploader(
        urls=urls, token="t", policy=POLICY, clock=clock, rng=random.Random(3)
    ) as uploader:
        return await uploader.send(frame)


def a_frame(producer: BatchProducer) -> bytes:
    return producer.frame(make_points(4))[0]


async def test_a_collector_that_refuses_connections_is_passed_over_without_waiting(
    producer: BatchProducer, refused_url: str
):
    state, clock = CollectorState(), CountingClock()
    async with FakeCollectors(state, 1) as collectors:
        (working,) = collectors.urls
        result = await send([refused_url, working], a_frame(producer), clock)
    assert result.outcome is Outcome.ACCEPTED and result.attempts == 2
    assert clock.sleeps == [] and result.url == working
    assert len(state.requests) == 1


async def test_a_clock_skewed_503_is_passed_over_without_waiting_despite_retry_after(
    producer: BatchProducer,
):
    state, clock = CollectorState([SKEWED]), CountingClock()
    async with FakeCollectors(state, 2) as collectors:
        result = await send(collectors.urls, a_frame(producer), clock)
    assert result.outcome is Outcome.ACCEPTED and result.attempts == 2
    assert [seen.server for seen in state.requests] == [0, 1]
    assert clock.sleeps == []
    # The re-send to the other collector is a re-send (PROTOCOL §3.2).
    assert state.requests[1].headers["X-Lightmetrics-Resend"] == "1"


@pytest.mark.parametrize("fault", [STORE_DOWN, Reply(429, {"error": "overloaded"}), DROP])
async def test_a_fault_every_collector_may_share_waits_before_the_next_collector(
    producer: BatchProducer, fault: Reply | str
):
    """A store outage, an overloaded fleet, a connection dropped after the frame may have
    reached the collector: failing over at once would multiply the load by the URLs."""
    state, clock = CollectorState([fault]), CountingClock()
    async with FakeCollectors(state, 2) as collectors:
        result = await send(collectors.urls, a_frame(producer), clock)
    assert result.outcome is Outcome.ACCEPTED and result.attempts == 2
    assert [seen.server for seen in state.requests] == [0, 1]
    assert len(clock.sleeps) == 1 and clock.sleeps[0] > 0


async def test_with_every_collector_refusing_it_waits_once_per_cycle_within_the_bound(
    producer: BatchProducer, refused_url: str
):
    state, clock = CollectorState([SKEWED] * 10), CountingClock()
    async with FakeCollectors(state, 1) as collectors:
        urls = [refused_url, *collectors.urls]
        result = await send(urls, a_frame(producer), clock)
    assert result.outcome is Outcome.DEFERRED
    assert result.attempts == POLICY.backoff.attempts  # fail-overs count: the bound holds
    # Five attempts over two URLs: two full cycles, each followed by one wait; the fifth
    # attempt ends the round. A wait after the skewed collector's answer honours its
    # Retry-After (5 s).
    assert len(clock.sleeps) == 2 and all(delay > 0 for delay in clock.sleeps)
    assert max(clock.sleeps) == 5.0
    assert len(state.requests) == 2
