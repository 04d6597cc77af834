"""`agent.health`: the rows an agent records about itself each round."""

from __future__ import annotations

import uuid

from agent.health import SELF_JOB, AgentHealth
from agent.uploader import BatchResult, Outcome
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
