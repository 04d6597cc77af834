from __future__ import annotations

import json
import random

import pytest
from structlog.testing import capture_logs

from agent.producer import BatchProducer
from agent.spool import ParkKind, Spool
from agent.uploader import Outcome, Uploader, UploadPolicy
from protocol.clock import ManualClock
from store.retry import Backoff
from tests.agent.conftest import make_points
from tests.agent.fake_collector import DROP, HANG, CollectorState, FakeCollectors, Reply

POLICY = UploadPolicy(
    concurrency=4,
    request_timeout_s=10.0,
    backoff=Backoff(attempts=3, base_s=0.01, cap_s=0.05),
    max_retry_after_s=2.0,
)


def uploader_for(urls: list[str], clock: ManualClock, policy: UploadPolicy = POLICY) -> Uploader:
    return Uploader(urls=urls, token="s3cret", policy=policy, clock=clock, rng=random.Random(5))


async def deliver_one(
    script: list,
    spool: Spool,
    producer: BatchProducer,
    *,
    servers: int = 1,
    policy: UploadPolicy = POLICY,
):
    entry = producer.submit(make_points(5))
    state = CollectorState(script)
    clock = ManualClock()
    async with FakeCollectors(state, servers) as collectors:
        async with uploader_for(collectors.urls, clock, policy) as uploader:
            result = await uploader.deliver(spool, entry)
    return entry, result, state, clock


async def test_200_deletes_and_sends_contract_headers(spool: Spool, producer: BatchProducer):
    entry, result, state, _ = await deliver_one([], spool, producer)
    assert result.outcome is Outcome.ACCEPTED and result.attempts == 1
    assert spool.pending() == [] and not entry.path.exists()
    (seen,) = state.requests
    assert seen.headers["Authorization"] == "Bearer s3cret"
    assert seen.headers["Content-Type"] == "application/x-lmbatch"
    assert "Content-Encoding" not in seen.headers
    assert seen.sha256 == entry.frame_sha256
    assert result.ack_latency_s is not None


async def test_200_duplicate_is_recorded_and_deleted(spool: Spool, producer: BatchProducer):
    entry, result, _, _ = await deliver_one(
        [Reply(200, {"accepted": True, "duplicate": True})], spool, producer
    )
    assert result.outcome is Outcome.DUPLICATE
    assert spool.pending() == [] and not entry.path.exists()


async def test_409_parks_conflict_logs_and_stops(spool: Spool, producer: BatchProducer):
    body = {"error": "identity_conflict", "accepted_frame_sha256": "a" * 64}
    with capture_logs() as logs:
        entry, result, state, _ = await deliver_one([Reply(409, body)], spool, producer)
    assert result.outcome is Outcome.CONFLICT and result.attempts == 1
    assert len(state.requests) == 1
    assert spool.pending() == []
    (parked,) = spool.parked(ParkKind.CONFLICT)
    assert parked.frame_path.read_bytes() == state.requests[0].body
    assert parked.sidecar["status"] == 409
    assert parked.sidecar["response"] == body
    assert parked.sidecar["frame_sha256"] == entry.frame_sha256
    assert any(log["event"] == "batch_parked_conflict" for log in logs)


@pytest.mark.parametrize("status", [400, 413, 415])
async def test_client_errors_park_poison_with_response(
    status: int, spool: Spool, producer: BatchProducer
):
    body = {"error": "invalid_frame", "detail": "crc32 mismatch"}
    _, result, state, _ = await deliver_one([Reply(status, body)], spool, producer)
    assert result.outcome is Outcome.POISON and len(state.requests) == 1
    assert spool.pending() == [] and spool.parked(ParkKind.CONFLICT) == []
    (parked,) = spool.parked(ParkKind.POISON)
    assert parked.sidecar["status"] == status
    assert parked.sidecar["response"] == body
    assert parked.sidecar["reason"] == "invalid_frame"
    sidecar_file = parked.frame_path.with_suffix(".json")
    assert json.loads(sidecar_file.read_text())["status"] == status


@pytest.mark.parametrize("status", [401, 403, 500, 502, 503, 404])
async def test_retryable_statuses_then_success(status: int, spool, producer):
    _, result, state, _ = await deliver_one([Reply(status, {"error": "x"})], spool, producer)
    assert result.outcome is Outcome.ACCEPTED
    assert result.attempts == 2 and result.retries == 1
    assert len(state.requests) == 2
    assert state.requests[0].body == state.requests[1].body  # the same bytes, resent


async def test_429_honours_retry_after(spool: Spool, producer: BatchProducer):
    script = [Reply(429, {"error": "overloaded"}, {"Retry-After": "1"})]
    _, result, _, clock = await deliver_one(script, spool, producer)
    assert result.outcome is Outcome.ACCEPTED and result.attempts == 2
    assert clock.monotonic() == pytest.approx(1.0)  # jitter (<= 0.01) is below it


async def test_retry_after_is_capped(spool: Spool, producer: BatchProducer):
    script = [Reply(503, {"error": "store_unavailable"}, {"Retry-After": "3600"})]
    _, result, _, clock = await deliver_one(script, spool, producer)
    assert result.outcome is Outcome.ACCEPTED
    assert clock.monotonic() == pytest.approx(POLICY.max_retry_after_s)


async def test_retries_are_bounded_and_frame_stays_pending(spool: Spool, producer: BatchProducer):
    script = [Reply(503, {"error": "store_unavailable"})] * 10
    entry, result, state, clock = await deliver_one(script, spool, producer)
    assert result.outcome is Outcome.DEFERRED
    assert result.attempts == POLICY.backoff.attempts == len(state.requests)
    assert result.status == 503
    assert spool.pending() == [entry] and entry.path.exists()
    # Two backoff delays, each within full jitter of base * 2**attempt.
    assert 0 <= clock.monotonic() <= 0.01 + 0.02


async def test_connection_drop_is_retried(spool: Spool, producer: BatchProducer):
    _, result, state, _ = await deliver_one([DROP], spool, producer)
    assert result.outcome is Outcome.ACCEPTED and result.attempts == 2
    assert len(state.requests) == 2


async def test_drops_only_leave_it_pending_with_the_error(spool: Spool, producer: BatchProducer):
    entry, result, _, _ = await deliver_one([DROP] * 3, spool, producer)
    assert result.outcome is Outcome.DEFERRED and result.status is None
    assert result.error is not None
    assert spool.pending() == [entry]


async def test_timeout_is_retried(spool: Spool, producer: BatchProducer):
    policy = UploadPolicy(
        concurrency=1, request_timeout_s=0.2, backoff=Backoff(attempts=2, base_s=0.0, cap_s=0.0)
    )
    _, result, state, _ = await deliver_one([HANG], spool, producer, policy=policy)
    assert result.outcome is Outcome.ACCEPTED and result.attempts == 2
    assert len(state.requests) == 2


async def test_retries_rotate_over_urls(spool: Spool, producer: BatchProducer):
    _, result, state, _ = await deliver_one(
        [Reply(503, {"error": "store_unavailable"})], spool, producer, servers=2
    )
    assert result.outcome is Outcome.ACCEPTED
    assert [seen.server for seen in state.requests] == [0, 1]


async def test_send_without_spool(producer: BatchProducer):
    frame, identity = producer.frame(make_points(3))
    state = CollectorState()
    async with FakeCollectors(state) as collectors:
        async with uploader_for(collectors.urls, ManualClock()) as uploader:
            first = await uploader.send(frame)
            again = await uploader.send(frame, identity, "x" * 64)
    assert (first.outcome, again.outcome) == (Outcome.ACCEPTED, Outcome.DUPLICATE)
    assert first.identity == identity
    assert first.frame_sha256 == state.requests[0].sha256


# --- the resend header (PROTOCOL §3.2) ------------------------------------------------


async def test_a_retry_carries_the_resend_header_the_first_attempt_does_not(
    spool: Spool, producer: BatchProducer
):
    _, result, state, _ = await deliver_one([Reply(503, {"error": "x"})], spool, producer)
    assert result.outcome is Outcome.ACCEPTED and len(state.requests) == 2
    first, retry = state.requests
    assert "X-Lightmetrics-Resend" not in first.headers
    assert retry.headers["X-Lightmetrics-Resend"] == "1"
    assert retry.body == first.body


async def test_a_deferred_frame_is_a_resend_from_the_first_attempt_of_its_next_round(
    spool: Spool, producer: BatchProducer
):
    entry = producer.submit(make_points(5))
    state = CollectorState([Reply(503, {"error": "store_unavailable"})] * POLICY.backoff.attempts)
    async with FakeCollectors(state, 1) as collectors:
        async with uploader_for(collectors.urls, ManualClock()) as uploader:
            deferred = await uploader.deliver(spool, entry)
            assert deferred.outcome is Outcome.DEFERRED
            sent_in_round_one = len(state.requests)
            delivered = await uploader.deliver(spool, entry)
    assert delivered.outcome is Outcome.ACCEPTED
    next_round = state.requests[sent_in_round_one]
    assert next_round.headers["X-Lightmetrics-Resend"] == "1"
    assert "X-Lightmetrics-Resend" not in state.requests[0].headers


async def test_frames_remembered_for_the_header_are_bounded(producer: BatchProducer):
    policy = UploadPolicy(
        concurrency=1,
        request_timeout_s=10.0,
        backoff=Backoff(attempts=1, base_s=0.0, cap_s=0.0),
        remembered_frames=2,
    )
    frames = [producer.submit(make_points(2)).read() for _ in range(3)]
    state = CollectorState([Reply(503, {"error": "x"})] * 3)  # all deferred, all remembered
    async with FakeCollectors(state, 1) as collectors:
        async with uploader_for(collectors.urls, ManualClock(), policy) as uploader:
            for frame in frames:
                await uploader.send(frame)
            # Remembered: frames 1 and 2. Re-sending 0 (forgotten) evicts 1, so only 2 is
            # still remembered when its turn comes (0 and 1 are settled by their 200).
            for frame in frames:
                await uploader.send(frame)
    again = [seen.headers.get("X-Lightmetrics-Resend") for seen in state.requests[3:]]
    assert again == [None, None, "1"]
