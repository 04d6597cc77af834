"""What a reference Prometheus cannot hold, checked through our PromQL API against
literal expectations at each stage of the differential test (PROTOCOL §5 series model;
issue 32's unit cases, here end to end through the engine):

- **microsecond ties within one millisecond**: ``tie_metric{host="a"}`` gets two points
  in the millisecond 08:00:00.001 (µs 900 → 2.0 in batch A, µs 100 → 1.0 in batch B):
  the later microsecond wins, whichever batch is committed or live; and two points at
  one microsecond, 08:00:15.000500, from agents ``agent-diff-x2`` (20.0, batch A) and
  ``agent-diff-x1`` (10.0, batch B): the greater ``agent_id`` wins.
- **two stored series presenting one label set**: ``diff.collision{le="1"}`` and
  ``diff_collision{le="1"}`` both present ``diff_collision{le="1"}``: one series, samples
  merged by time, and at the millisecond they share the lexically smaller stored
  series (``diff.collision``: ``.`` sorts before ``_``) wins.

Batch A goes with the first hour (committed at the split), batch B with the second
(live at the split), so the split check shows the winner does not change when a batch
is committed. The points lie at 08:00-08:02, two hours before the fleet, out of reach of
every expression of `queries.QUERIES` and of the count `ours.COUNT_QUERY` waits for.
"""

from __future__ import annotations

import uuid
from typing import Any

from protocol.frame_encode import encode_frame, points_table
from tests.collector.promql.diff.feed import Batch
from tests.collector.promql.diff.fleet import T0_MS

BOOT = uuid.UUID("5f0c6a2e-0000-4000-8000-00000000e0e0")
BASE_MS = T0_MS - 2 * 3600 * 1000  # 08:00:00
AT_S = f"{(BASE_MS + 5 * 60_000) / 1000:.3f}"  # 08:05: the instant the checks ask at


def _ns(ms_offset: int, us: int = 0) -> int:
    return (BASE_MS + ms_offset) * 1_000_000 + us * 1_000


Row = tuple[int, str, float, dict[str, str]]
TIE = {"host": "a"}
LE = {"le": "1"}
BATCH_A: dict[str, list[Row]] = {
    "agent-diff-x2": [
        (_ns(1, 900), "tie_metric", 2.0, TIE),
        (_ns(15_000, 500), "tie_metric", 20.0, TIE),
        (_ns(60_000), "diff.collision", 5.0, LE),
        (_ns(90_000), "diff.collision", 6.0, LE),
    ]
}
BATCH_B: dict[str, list[Row]] = {
    "agent-diff-x1": [
        (_ns(1, 100), "tie_metric", 1.0, TIE),
        (_ns(15_000, 500), "tie_metric", 10.0, TIE),
        (_ns(60_000, 400), "diff_collision", 7.0, LE),
        (_ns(120_000), "diff_collision", 8.0, LE),
    ]
}
EXPECTED: dict[str, dict[tuple[tuple[str, str], ...], list[tuple[int, str]]]] = {
    "tie_metric[10m]": {
        (("__name__", "tie_metric"), ("host", "a")): [(BASE_MS + 1, "2"), (BASE_MS + 15_000, "20")]
    },
    "diff_collision[10m]": {
        (("__name__", "diff_collision"), ("le", "1")): [
            (BASE_MS + 60_000, "5"),
            (BASE_MS + 90_000, "6"),
            (BASE_MS + 120_000, "8"),
        ]
    },
}


def batches(rows_by_agent: dict[str, list[Row]]) -> list[Batch]:
    found = []
    for agent, rows in rows_by_agent.items():
        table = points_table(
            [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]
        )
        body = encode_frame(agent_id=agent, boot_id=BOOT, seq_start=0, points=table)
        first, last = min(r[0] for r in rows) // 10**6, max(r[0] for r in rows) // 10**6
        found.append(Batch("frame", body, first, last, len(rows)))
    return found


def problems(expr: str, answer: dict[str, Any]) -> list[str]:
    """How ``answer`` (to ``expr`` at `AT_S`) differs from `EXPECTED`."""
    if answer.get("status") != "success":
        return [f"{expr}: {answer.get('errorType')} {answer.get('error')}"]
    got = {
        tuple(sorted(series["metric"].items())): [
            (round(float(at) * 1000), value) for at, value in series["values"]
        ]
        for series in answer["data"]["result"]
    }
    return [] if got == EXPECTED[expr] else [f"{expr}: got {got}, want {EXPECTED[expr]}"]
