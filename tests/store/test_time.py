"""Store time (`store.time`): the store's clock measured from the Date header of its answers.

Pure tests feed `ClockOffset` made-up answers; the S3 tests run against MiniStack and moto
with a client whose clock is far from the server's, and check that ages and the skew come
out in the server's time.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from email.utils import formatdate

import pytest
from structlog.testing import capture_logs

from chaos.faulty_store import FaultyStore
from protocol.clock import ManualClock
from store.errors import NotFound
from store.memory import MemoryStore
from store.s3 import S3Store
from store.time import MAX_DRIFT, ClockOffset, StoreClock, store_clock
from tests.s3_servers import RunningServer, fresh_bucket

NS = 10**9
DAY_NS = 24 * 3600 * NS


def date_header(seconds: int) -> str:
    """The ``Date`` header a server sends at ``seconds`` since the epoch."""
    return formatdate(seconds, usegmt=True)


def answered(offset: ClockOffset, store_s: int, *, sent_s: float, answered_s: float) -> None:
    offset.observe(date_header(store_s), sent_ns=int(sent_s * NS), answered_ns=int(answered_s * NS))


# --- the estimate ---------------------------------------------------------------------------


def test_one_answer_bounds_the_offset_by_the_round_trip_and_the_date_resolution() -> None:
    offset = ClockOffset()
    assert offset.bounds_at(0) is None and offset.skew_s is None and not offset.skewed
    # Sent at local 500.0 s, answered at 500.2 s, the store's clock read 1000.x s.
    answered(offset, 1000, sent_s=500.0, answered_s=500.2)
    assert offset.bounds_at(int(500.2 * NS)) == (int(499.8 * NS), 501 * NS)
    assert offset.skew_s == pytest.approx(-500.4)  # this host is 500 s behind the store


def test_later_answers_narrow_the_bounds_and_drift_widens_them_with_time() -> None:
    offset = ClockOffset()
    answered(offset, 1000, sent_s=100.0, answered_s=100.1)  # offset in [899.9, 901]
    answered(offset, 1001, sent_s=100.6, answered_s=100.7)  # offset in [900.3, 901.4]
    low, high = offset.bounds_at(int(100.7 * NS)) or (0, 0)
    # The first answer's upper bound, widened by the drift over the 0.6 s between them.
    assert (low, high) == (int(900.3 * NS), 901 * NS + int(0.6 * NS * MAX_DRIFT))
    # An hour without answers: the clocks may have drifted apart by MAX_DRIFT of it.
    later = int(3700.7 * NS)
    widen = int(3600 * NS * MAX_DRIFT)
    assert offset.bounds_at(later) == (low - widen, high + widen)


def test_an_answer_outside_the_bounds_means_a_clock_was_stepped_and_starts_over() -> None:
    offset = ClockOffset()
    answered(offset, 1000, sent_s=100.0, answered_s=100.1)
    answered(offset, 1010, sent_s=50.0, answered_s=50.1)  # our clock went back 60 s
    assert offset.bounds_at(int(50.1 * NS)) == (int(959.9 * NS), 961 * NS)


def test_skew_beyond_the_limit_is_flagged_and_logged_only_when_certain() -> None:
    offset = ClockOffset(max_skew_s=30)
    with capture_logs() as logs:
        # 30.5 s behind, give or take the second of resolution: not certainly beyond 30 s.
        answered(offset, 1030, sent_s=1000.0, answered_s=1000.0)
        assert not offset.skewed
        answered(offset, 1100, sent_s=1000.0, answered_s=1000.0)  # 100 s behind
        assert offset.skewed and offset.skew_s == pytest.approx(-100.5)
        answered(offset, 1100, sent_s=1000.0, answered_s=1000.0)  # still: logged once
        answered(offset, 2000, sent_s=2000.0, answered_s=2000.0)  # fixed
        assert not offset.skewed
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("store_clock_skewed", "warning"),
        ("store_clock_skew_resolved", "info"),
    ]
    assert logs[0]["skew_s"] == -100.5 and logs[0]["max_clock_skew_s"] == 30


def test_an_unreadable_date_is_ignored() -> None:
    offset = ClockOffset()
    for bad in ("yesterday", "", "Mon, 99 Foo 2026 25:61:61 GMT"):
        offset.observe(bad, sent_ns=0, answered_ns=0)
    assert offset.bounds_at(0) is None


def test_store_clock_reads_the_local_clock_plus_the_offset() -> None:
    local = ManualClock(start_ns=500 * NS)
    offset = ClockOffset()
    clock = StoreClock(local, offset)
    assert clock.now_ns() == clock.latest_ns() == 500 * NS  # nothing measured yet
    answered(offset, 1000, sent_s=500.0, answered_s=500.0)  # offset in [500, 501] s
    assert (clock.now_ns(), clock.latest_ns()) == (1000 * NS, 1001 * NS)
    assert clock.skew_s == pytest.approx(-500.5) and clock.skewed
    local.advance(10)
    assert clock.monotonic() == 10.0
    widen = int(10 * NS * MAX_DRIFT)
    assert (clock.now_ns(), clock.latest_ns()) == (1010 * NS - widen, 1011 * NS + widen)


def test_store_clock_of_a_store_on_this_hosts_clock_is_that_clock() -> None:
    local = ManualClock()
    clock = store_clock(MemoryStore(clock=local), local)
    assert clock.now_ns() == local.now_ns() and clock.skew_s is None and not clock.skewed
    local.advance(3600)
    assert clock.now_ns() == local.now_ns()
    assert store_clock(MemoryStore(), clock) is clock  # already store time


def test_store_clock_looks_through_wrappers() -> None:
    s3 = S3Store(bucket="some-bucket")  # no request is made
    clock = store_clock(FaultyStore(FaultyStore(s3)), ManualClock())
    assert clock.offset is s3.clock_offset


# --- against S3 servers ---------------------------------------------------------------------


@pytest.fixture(params=["ministack", "moto"])
async def far_off_store(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[S3Store, ManualClock]]:
    """A store on an S3 server, and its client's clock: ten days behind the server's."""
    server: RunningServer = request.getfixturevalue(f"{request.param}_server")
    clock = ManualClock(time.time_ns() - 10 * DAY_NS)
    store = S3Store(
        bucket=fresh_bucket(server), prefix="time", endpoint_url=server.endpoint_url, clock=clock
    )
    try:
        yield store, clock
    finally:
        await store.close()


@pytest.mark.s3
async def test_ages_on_s3_are_judged_in_the_servers_time(
    far_off_store: tuple[S3Store, ManualClock],
) -> None:
    store, local = far_off_store
    await store.put("a/object", b"x")
    modified_ns = (await store.head("a/object")).last_modified_ns
    clock = store_clock(store, local)
    age_ns = clock.now_ns() - modified_ns
    assert 0 <= age_ns < 5 * NS  # seconds old, not ten days in the future
    assert clock.latest_ns() - clock.now_ns() <= NS  # known to the Date header's second
    assert clock.skew_s == pytest.approx(-10 * 24 * 3600, abs=5) and clock.skewed


@pytest.mark.s3
async def test_error_answers_measure_the_skew_too(
    far_off_store: tuple[S3Store, ManualClock],
) -> None:
    store, _ = far_off_store
    with pytest.raises(NotFound):
        await store.head("missing")  # the readiness check's question
    assert store.clock_offset.skew_s == pytest.approx(-10 * 24 * 3600, abs=5)
