"""`rollup.job.hour_stage.resolve_committed_ties`: the first/last tie keys of committed
``rollup_1m`` rows, looked up in the committed points, and the rule when that point is
gone (a delete by agent then compaction, or points retention shorter than rollup_1m's):
the committed sample keeps its place, never an error (issue 24 item 5). Pure pyarrow."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pyarrow as pa

from rollup.table import aggregate
from rollup.table.schemas import POINTS_SCHEMA
from rollup.table.ties import resolve_committed_ties

T0 = 1_795_000_000_000_000  # µs, a minute boundary (divisible by 60 s)
SERIES = 'cpu{host="a"}'
Sample = tuple[int, float, str, int]  # (ts_us, value, agent, seq)


def points(samples: Sequence[Sample]) -> pa.Table:
    return pa.table(
        {
            "ts": [datetime.fromtimestamp(ts / 1e6, tz=UTC) for ts, _v, _a, _s in samples],
            "metric": ["cpu"] * len(samples),
            "labels": [[("host", "a")]] * len(samples),
            "value": [v for _ts, v, _a, _s in samples],
            "series": [SERIES] * len(samples),
            "agent_id": [a for _ts, _v, a, _s in samples],
            "boot_id": ["b"] * len(samples),
            "seq": [s for _ts, _v, _a, s in samples],
        },
        schema=POINTS_SCHEMA,
    )


def merged(committed: Sequence[Sample], new: Sequence[Sample], kept: Sequence[Sample]) -> dict:
    """One minute: ``committed`` samples rolled up (rollup_1m keeps no tie key), merged
    with ``new`` samples, the committed points still present being ``kept``."""
    old_points = points(committed)
    rollup = aggregate.rollup_rows(
        aggregate.partials_of_points(old_points), aggregate.series_info(old_points)
    )
    old = aggregate.partials_of_rollup(rollup)
    fresh = aggregate.partials_of_points(points(new))
    resolved = resolve_committed_ties(old, fresh, lambda _series: points(kept))
    (row,) = aggregate.merge_partials(pa.concat_tables([resolved, fresh])).to_pylist()
    return row


def test_present_points_break_ties_by_agent() -> None:
    committed = [(T0 + 5, 1.0, "m", 0), (T0 + 50, 2.0, "m", 1)]
    # "a" < "m" wins the first tie; "a" < "m" loses the last tie.
    row = merged(committed, [(T0 + 5, -1.0, "a", 0), (T0 + 50, -2.0, "a", 1)], committed)
    assert (row["first"], row["last"]) == (-1.0, 2.0)
    row = merged(committed, [(T0 + 5, -1.0, "z", 0), (T0 + 50, -2.0, "z", 1)], committed)
    assert (row["first"], row["last"]) == (1.0, -2.0)


def test_a_gone_committed_point_keeps_its_place_instead_of_raising() -> None:
    committed = [(T0 + 5, 1.0, "m", 0), (T0 + 50, 2.0, "m", 1)]
    # The committed points are gone; before the fix: ValueError ("no committed point").
    for agent in ("a", "z"):
        row = merged(committed, [(T0 + 5, -1.0, agent, 0), (T0 + 50, -2.0, agent, 1)], [])
        assert (row["first"], row["last"]) == (1.0, 2.0), agent
        assert row["count"] == 4
    # Strictly earlier or later samples still win, whatever the keys.
    row = merged(committed, [(T0 + 4, -1.0, "z", 0), (T0 + 51, -2.0, "a", 1)], [])
    assert (row["first"], row["last"]) == (-1.0, -2.0)


def test_another_point_at_the_same_ts_is_not_taken_for_the_gone_one() -> None:
    # At T0+5: "m" (value 1.0, the committed first: deleted by agent and compacted away)
    # and "x" (value 3.0, still present). A new "n" ties: "m" < "n", so 1.0 stays first.
    # Taking "x"'s key for the committed row (the old lookup) would let "n" win.
    committed = [(T0 + 5, 1.0, "m", 0), (T0 + 5, 3.0, "x", 0), (T0 + 50, 2.0, "m", 1)]
    kept = [(T0 + 5, 3.0, "x", 0), (T0 + 50, 2.0, "m", 1)]
    row = merged(committed, [(T0 + 5, -1.0, "n", 0)], kept)
    assert row["first"] == 1.0
    assert row["last"] == 2.0 and row["count"] == 4
