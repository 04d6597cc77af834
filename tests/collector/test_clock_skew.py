"""PROTOCOL §3.8 in real collector processes on MiniStack: a collector whose clock is off
the store's by more than ``store.max_clock_skew_s`` answers 503 instead of stamping
``accepted_at`` with a wrong hour, fails ``/readyz`` and exports the skew; one within the
limit serves as usual, and an agent fails over to it without waiting. Clocks are skewed by `chaos.skewed_collector`."""

from __future__ import annotations

import aiohttp
import pytest

from agent.uploader import Outcome, Uploader
from protocol import keys
from protocol.clock import ManualClock
from store.open import open_store
from tests.collector.conftest import (
    CollectorLauncher,
    get,
    make_frame,
    metric_value,
    post_frame,
    store_keys,
)
from tests.s3_servers import RunningServer, fresh_bucket

SKEW_METRIC = "lm_collector_store_clock_skew_seconds"
REQUESTS_METRIC = "lm_collector_requests_total"


@pytest.mark.s3
async def test_a_collector_whose_clock_is_off_the_stores_answers_503(
    ministack_server: RunningServer, collectors: CollectorLauncher
) -> None:
    url = f"s3://{fresh_bucket(ministack_server)}/skew"
    env = {
        "LM_STORE__ENDPOINT_URL": ministack_server.endpoint_url,
        "LM_STORE__MAX_CLOCK_SKEW_S": "30",
    }
    ahead = collectors.start(store_url=url, env=env, name="ahead", clock_skew_s=3600.0)
    close = collectors.start(store_url=url, env=env, name="close", clock_skew_s=5.0)
    frame = make_frame("agent-skew")

    async with aiohttp.ClientSession() as session:
        refused = await post_frame(session, ahead.base_url, frame)
        assert refused.status == 503, refused
        # Its own refusal, told apart from a store outage: an agent fails over at once.
        assert refused.json["error"] == "clock_skewed", refused
        assert "beyond store.max_clock_skew_s" in refused.json["detail"], refused
        assert refused.headers["Retry-After"], refused
        metrics = (await get(session, f"{ahead.base_url}/metrics")).text
        assert metric_value(metrics, REQUESTS_METRIC, 'outcome="clock_skewed"') == 1
        ready = await get(session, f"{ahead.base_url}/readyz")
        assert ready.status == 503 and ready.json["clock_skewed"] is True, ready
        assert ready.json["store_clock_skew_seconds"] == pytest.approx(3600, abs=5)
        metrics = (await get(session, f"{ahead.base_url}/metrics")).text
        assert metric_value(metrics, SKEW_METRIC) == pytest.approx(3600, abs=5)
        store = open_store(url, endpoint_url=ministack_server.endpoint_url)
        try:
            assert await store_keys(store, keys.ACCEPTED_PREFIX) == []
        finally:
            await store.close()

        accepted = await post_frame(session, close.base_url, frame)
        assert accepted.status == 200 and accepted.json["duplicate"] is False, accepted
        ready = await get(session, f"{close.base_url}/readyz")
        assert ready.status == 200 and ready.json["clock_skewed"] is False, ready
        metrics = (await get(session, f"{close.base_url}/metrics")).text
        assert metric_value(metrics, SKEW_METRIC) == pytest.approx(5, abs=2)

    # An agent given both collectors passes the skewed one over without waiting.
    clock = ManualClock()
    urls = [ahead.base_url, close.base_url]
    async with Uploader(urls=urls, token=None, clock=clock) as uploader:
        sent = await uploader.send(make_frame("agent-skew-failover"))
    assert sent.outcome is Outcome.ACCEPTED and sent.attempts == 2, sent
    assert sent.url == close.base_url and clock.monotonic() == 0.0, sent

    assert ahead.stop() == 0 and close.stop() == 0
    skewed_events = [e for e in ahead.events() if e.get("event") == "store_clock_skewed"]
    assert skewed_events and skewed_events[0]["skew_s"] == pytest.approx(3600, abs=5)
    assert not [e for e in close.events() if e.get("event") == "store_clock_skewed"]


@pytest.mark.s3
async def test_a_spooling_collector_whose_clock_is_off_refuses_rather_than_spool(
    ministack_server: RunningServer, collectors: CollectorLauncher, tmp_path
) -> None:
    """In ``local_spool`` mode the stamp is made when a frame lands, which this clock
    would hold up (§3.8): the frame is refused at once, so its agent tries another
    collector, instead of being acknowledged into a spool that cannot land."""
    url = f"s3://{fresh_bucket(ministack_server)}/skew-spool"
    env = {
        "LM_STORE__ENDPOINT_URL": ministack_server.endpoint_url,
        "LM_STORE__MAX_CLOCK_SKEW_S": "30",
        "LM_INGEST__ACCEPTANCE": "local_spool",
        "LM_INGEST__SPOOL_DIR": str(tmp_path / "spool"),
    }
    ahead = collectors.start(store_url=url, env=env, name="ahead-spool", clock_skew_s=3600.0)
    async with aiohttp.ClientSession() as session:
        refused = await post_frame(session, ahead.base_url, make_frame("agent-skew-spool"))
    assert refused.status == 503 and refused.json["error"] == "clock_skewed", refused
    assert ahead.stop() == 0
    assert not list((tmp_path / "spool" / "pending").glob("*.lmbatch"))  # nothing spooled
