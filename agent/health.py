"""``lm-agent scrape``'s own health as series, recorded with every scrape round.

An agent that cannot deliver is otherwise seen only in its own logs. With
``[scrape] self_metrics`` (on by default) each round adds these rows, labelled
``job="lm-agent"`` and ``instance`` = the agent_id, to what it scraped; they are framed,
spooled and delivered with the rest, so they reach the same store and dashboards, with
nothing more to run or scrape. While delivery fails they wait in the spool too and land
when it recovers, so the backlog's history is kept; their absence is itself the alert
(agents heard from ten minutes ago and not in the last five: ``group by (instance)
(lm_agent_spool_pending_frames offset 10m) unless group by (instance)
(lm_agent_spool_pending_frames)``).

| series | kind | what |
|---|---|---|
| ``lm_agent_spool_pending_frames`` / ``_bytes`` | gauge | frames spooled, not yet answered 200 |
| ``lm_agent_buffered_points`` | gauge | scraped rows in memory, not yet spooled |
| ``lm_agent_scrapes_total`` / ``lm_agent_scrapes_failed_total`` | counter | target scrapes |
| ``lm_agent_frames_spooled_total``, ``lm_agent_points_spooled_total`` | counter | framed and spooled |
| ``lm_agent_points_dropped_total`` | counter | scraped rows dropped (memory buffer full) |
| ``lm_agent_deliveries_total{outcome}`` | counter | rounds of delivery per frame, by outcome (a round the spool's disk failed is ``deferred``) |
| ``lm_agent_delivery_attempts_total`` | counter | POSTs to collectors (retries included) |

Counters count from the process's start (a restart resets them; ``rate`` and ``increase``
handle that). Every outcome is recorded, 0 included, so a rate is defined from the first
round.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import pyarrow as pa

from agent.uploader import BatchResult, Outcome
from protocol.frame_encode import points_table

SELF_JOB = "lm-agent"
PREFIX = "lm_agent_"

_STATS_SERIES = {  # `agent.scrape.ScrapeStats` field -> counter
    "scrapes": "scrapes_total",
    "failed_scrapes": "scrapes_failed_total",
    "frames_spooled": "frames_spooled_total",
    "points_spooled": "points_spooled_total",
    "points_dropped": "points_dropped_total",
}


class AgentHealth:
    """The delivery counters of one agent process, and its health rows of a round."""

    def __init__(self, agent_id: str) -> None:
        self.labels = {"job": SELF_JOB, "instance": agent_id}
        self._deliveries: Counter[Outcome] = Counter()
        self._attempts = 0

    def delivered(self, result: BatchResult) -> None:
        """One frame's round of delivery ended (`agent.uploader.Uploader.deliver`)."""
        self._deliveries[result.outcome] += 1
        self._attempts += result.attempts

    def deferred_locally(self) -> None:
        """One frame's round ended on a local failure (the spool's disk): counted as a
        ``deferred`` round, since the frame stays pending for the next. Its POSTs, if any
        were made before the failure, are not known here and not counted."""
        self._deliveries[Outcome.DEFERRED] += 1

    def points(
        self,
        ts_ns: int,
        *,
        stats: Mapping[str, int],
        pending_frames: int,
        pending_bytes: int,
        buffered_points: int,
    ) -> pa.Table:
        """The rows of one round, all at ``ts_ns``."""
        rows: list[tuple[str, float, dict[str, str]]] = [
            ("spool_pending_frames", pending_frames, self.labels),
            ("spool_pending_bytes", pending_bytes, self.labels),
            ("buffered_points", buffered_points, self.labels),
            *((series, stats[field], self.labels) for field, series in _STATS_SERIES.items()),
            ("delivery_attempts_total", self._attempts, self.labels),
            *(
                ("deliveries_total", self._deliveries[outcome], {**self.labels, "outcome": outcome})
                for outcome in Outcome
            ),
        ]
        return points_table(
            [ts_ns] * len(rows),
            [PREFIX + name for name, _value, _labels in rows],
            [float(value) for _name, value, _labels in rows],
            [dict(labels) for _name, _value, labels in rows],
        )


def series_names() -> frozenset[str]:
    """Every metric name `AgentHealth.points` records (for the dashboards' and alerts'
    checks)."""
    stats = dict.fromkeys(_STATS_SERIES, 0)
    rows = AgentHealth("any").points(
        0, stats=stats, pending_frames=0, pending_bytes=0, buffered_points=0
    )
    return frozenset(rows.column("metric").to_pylist())
