"""`agent.health`: the rows an agent records about itself each round."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from agent.health import SELF_JOB, AgentHealth
from agent.scrape import ScrapeAgent
from agent.spool import Spool
from agent.uploader import BatchResult, Outcome, Uploader
from config import ScrapeSettings
from protocol.keys import BatchIdentity

STATS = {
    "scrapes": 7,
    "failed_scrapes": 2,
    "frames_spooled": 3,
    "points_spooled": 40,
    "points_dropped": 5,
}


def result(outcome: Outcome, attempts: int) -> BatchResult:
    identity = BatchIdentity("a", uuid.UUID(int=1), 0, 9)
    return BatchResult(identity, "0" * 64, outcome, attempts, None, None, None, None, None, 0.0)


def test_a_round_records_the_backlog_the_counters_and_every_outcome() -> None:
    health = AgentHealth("node-1")
    health.delivered(result(Outcome.ACCEPTED, 1))
    health.delivered(result(Outcome.DEFERRED, 3))
    health.delivered(result(Outcome.ACCEPTED, 2))
    table = health.points(
        1_760_000_000_000_000_000,
        stats=STATS,
        pending_frames=4,
        pending_bytes=4096,
        buffered_points=12,
    )
    rows = {
        (metric, labels.get("outcome")): value
        for metric, labels, value in zip(
            table.column("metric").to_pylist(),
            [dict(labels) for labels in table.column("labels").to_pylist()],
            table.column("value").to_pylist(),
            strict=True,
        )
    }
    assert rows[("lm_agent_spool_pending_frames", None)] == 4
    assert rows[("lm_agent_spool_pending_bytes", None)] == 4096
    assert rows[("lm_agent_buffered_points", None)] == 12
    assert rows[("lm_agent_scrapes_total", None)] == 7
    assert rows[("lm_agent_scrapes_failed_total", None)] == 2
    assert rows[("lm_agent_points_dropped_total", None)] == 5
    assert rows[("lm_agent_delivery_attempts_total", None)] == 6
    deliveries = {o: v for (m, o), v in rows.items() if m == "lm_agent_deliveries_total"}
    assert deliveries == {
        "accepted": 2,
        "duplicate": 0,
        "conflict": 0,
        "poison": 0,
        "deferred": 1,
    }
    labels = [dict(labels) for labels in table.column("labels").to_pylist()]
    assert all(row["job"] == SELF_JOB and row["instance"] == "node-1" for row in labels)
    assert set(table.column("ts").cast("int64").to_pylist()) == {1_760_000_000_000_000_000}


async def test_a_round_the_spool_disk_failed_is_counted_deferred(tmp_path: Path) -> None:
    """`agent.scrape.ScrapeAgent`'s delivery: a round that fails on the local disk (the
    uploader raises OSError reading or retiring the frame) is a ``deferred`` round in the
    agent's own rows, like a round no collector answered."""

    class DiskFailing:
        async def deliver(self, spool: object, entry: object) -> BatchResult:
            raise OSError(5, "Input/output error")

    settings = ScrapeSettings(
        agent_id="node-2", collector_urls=["http://127.0.0.1:9"], spool_dir=tmp_path / "spool"
    )
    agent = ScrapeAgent(settings=settings, token=None)
    entry = SimpleNamespace(identity=BatchIdentity("node-2", uuid.UUID(int=2), 0, 0))
    outcome = await agent._deliver(cast(Spool, None), cast(Uploader, DiskFailing()), entry)
    assert outcome is Outcome.DEFERRED
    assert agent._health is not None
    table = agent._health.points(
        0, stats=STATS, pending_frames=1, pending_bytes=1, buffered_points=0
    )
    deferred = [
        value
        for metric, labels, value in zip(
            table.column("metric").to_pylist(),
            table.column("labels").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        )
        if metric == "lm_agent_deliveries_total" and dict(labels)["outcome"] == "deferred"
    ]
    assert deferred == [1.0]
