"""The differential test's fleet, reference and expressions on their own (issue 32): the
fleet is what the issue asks for, the reference Prometheus 2.42 holds exactly its
samples (stale markers as stale markers, nothing refused), and every expression except
``absent*`` returns a series with a value that is not NaN on the reference.

The module runs two Prometheus processes, stopped by PID (`reference.ReferencePrometheus`):
the reference, and one holding the fleet without its stale markers, which shows that
the expressions and the comparison catch a read path losing them and on which the
refusal counters are probed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator

import cramjam
import numpy as np
import pytest

from collector.receivers.proto.wire_pb2 import WriteRequest
from tests.collector.promql.diff.compare import has_non_nan
from tests.collector.promql.diff.fleet import (
    END_MS,
    STALE_NAN_BITS,
    STEP_MS,
    T0_MS,
    Fleet,
    fleet,
)
from tests.collector.promql.diff.queries import CATEGORIES, QUERIES
from tests.collector.promql.diff.reference import ReferencePrometheus
from tests.collector.promql.diff.runner import Target, answers, requests_of, run_queries
from tests.prometheus_binary import require_prometheus

REQUIRED_CATEGORIES = {
    "selector", "rate", "over_time", "aggregation", "histogram", "binary", "offset",
    "absent", "label", "math_time", "subquery",
}  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferencePrometheus]:
    binary = require_prometheus()
    running = ReferencePrometheus(binary, tmp_path_factory.mktemp("reference")).start()
    try:
        running.feed(fleet())
        yield running
    finally:
        running.stop()


def test_the_fleet_is_what_the_issue_asks_for() -> None:
    built: Fleet = fleet()
    assert 30 <= len(built.series) <= 60
    ts = built.all_ts_ms()
    assert np.unique(ts).size == ts.size == built.samples  # a millisecond per sample
    assert ts.min() >= T0_MS and ts.max() - ts.min() >= 2 * 3600 * 1000 - STEP_MS
    names = {s.presented[0][1] for s in built.series}
    assert {"request_duration_seconds_bucket", "rpc_latency_seconds_count"} <= names
    dotted = [s for s in built.series if s.metric == "http.server.duration"]
    assert dotted and all(s.presented[0] == ("__name__", "http_server_duration") for s in dotted)
    assert all(dict(s.presented).get("service_name") == "checkout" for s in dotted)
    stale = [s for s in built.series if s.values.view(np.uint64)[-1] == STALE_NAN_BITS]
    assert len(stale) == 5 and all(s.ts_ms[-1] < END_MS for s in stale)
    counters = [s for s in built.series if s.metric.endswith("_total")]
    assert any((np.diff(s.values) < 0).any() for s in counters)  # resets
    assert {s.channel for s in built.series} == {"remote_write", "frame"}
    assert all(((s.us >= 0) & (s.us < 1000)).all() for s in built.series)
    assert all((np.diff(s.ts_ms) > 0).all() for s in built.series)


def test_the_reference_holds_exactly_the_fleet(reference: ReferencePrometheus) -> None:
    counters = reference.assert_clean(fleet())
    assert set(counters.values()) == {0.0}
    # A stale marker arrived as one: w0's last sample is at 10:50, its marker one scrape
    # later; 2 minutes after the marker (well within the 5 m lookback of the last
    # sample) the series is gone. An ordinary NaN there (what OpenMetrics backfill would
    # give) would answer NaN instead; just before the marker it answers its last value.
    w0 = next(s for s in fleet().series if dict(s.presented).get("worker") == "w0")
    after = int(w0.ts_ms[-1]) + 2 * 60_000
    answer = query(reference, 'batch_progress{worker="w0"}', after)
    assert answer["data"]["result"] == []
    before = query(reference, 'batch_progress{worker="w0"}', int(w0.ts_ms[-1]) - 1)
    assert [e["value"][1] for e in before["data"]["result"]] == [repr_go(w0.values[-2])]


def repr_go(value: float) -> str:
    """A float as Prometheus' JSON writes it (shortest round-trip decimal)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def query(reference: ReferencePrometheus, expr: str, at_ms: int) -> dict:  # type: ignore[type-arg]
    import json
    import urllib.parse

    params = urllib.parse.urlencode({"query": expr, "time": f"{at_ms / 1000:.3f}"})
    return dict(json.loads(reference.get_text(f"/api/v1/query?{params}")))


@pytest.fixture(scope="module")
def stale_less(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferencePrometheus]:
    """A second Prometheus holding the fleet without its stale markers: what a read path
    that loses them (as the remote_write receiver once did) would serve."""
    binary = require_prometheus()
    built = fleet()
    series = []
    for s in built.series:
        keep = s.values.view(np.uint64) != STALE_NAN_BITS
        series.append(
            dataclasses.replace(s, ts_ms=s.ts_ms[keep], us=s.us[keep], values=s.values[keep])
        )
    running = ReferencePrometheus(binary, tmp_path_factory.mktemp("stale-less")).start()
    try:
        running.feed(Fleet(tuple(series)))
        yield running
    finally:
        running.stop()


def test_the_test_sees_lost_stale_markers(
    reference: ReferencePrometheus,
    stale_less: ReferencePrometheus,
    terminal_report: Callable[[str], None],
) -> None:
    """The expressions and the comparison catch a read path that loses stale markers,
    and only the expressions over series that stop differ."""
    report = asyncio.run(
        run_queries(QUERIES, Target(reference.base_url), Target(stale_less.base_url))
    )
    terminal_report(report.table("reference against one without stale markers"))
    differing = {query.expr for query, _, _ in report.failures}
    assert {"batch_progress", "count_over_time(batch_progress[20m:1m])"} <= differing
    assert 'absent(batch_progress{worker="w0"})' in differing  # 1 once w0 has stopped
    stopping = ("batch_", "__name__", "count(cpu_usage_ratio)")
    assert all(any(word in expr for word in stopping) for expr in differing), differing
    assert sum(report.agreed.values()) >= len(QUERIES) - len(differing)


def test_the_refusal_counters_are_the_ones_that_count(stale_less: ReferencePrometheus) -> None:
    """The counters `assert_clean` reads are the ones Prometheus 2.42 moves when it
    refuses a remote-write sample (probed on the second process, an hour after the
    fleet, out of reach of every expression)."""
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
    other, later = stale_less, END_MS + 3600_000
    before = other.metric("prometheus_tsdb_head_samples_appended_total")

    def send(at_ms: int, value: float) -> int:
        request = WriteRequest()
        entry = request.timeseries.add()
        entry.labels.add(name="__name__", value="x")
        entry.samples.add(value=value, timestamp=at_ms)
        body = bytes(cramjam.snappy.compress_raw(request.SerializeToString()))
        return other.post("/api/v1/write", body, headers)[0]

    assert other.metric("prometheus_tsdb_out_of_order_samples_total") == 0
    assert other.metric("prometheus_tsdb_out_of_bound_samples_total") == 0
    assert send(later, 1.0) == 204
    assert send(later, 2.0) == 400  # a duplicate: refused (2.42 counts none for it)
    assert send(later - 60_000, 1.0) == 400
    assert other.metric("prometheus_tsdb_out_of_order_samples_total") == 1
    assert send(later - 3 * 3600_000, 1.0) == 400
    assert other.metric("prometheus_tsdb_out_of_bound_samples_total") == 1
    assert other.metric("prometheus_tsdb_head_samples_appended_total") == before + 1
    with pytest.raises(AssertionError):
        other.assert_clean(fleet())


def test_every_expression_returns_data_on_the_reference(
    reference: ReferencePrometheus, terminal_report: Callable[[str], None]
) -> None:
    assert len(QUERIES) >= 200
    assert len({q.expr for q in QUERIES}) == len(QUERIES)
    assert REQUIRED_CATEGORIES <= set(CATEGORIES)
    target = Target(reference.base_url)
    empty: list[str] = []
    failed: list[tuple[str, list[str | None]]] = []
    per_category: Counter[str] = Counter()

    async def run() -> None:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            for q in QUERIES:
                got = await answers(session, target, q)
                if any(a["status"] != "success" for a in got):
                    failed.append((q.expr, [a.get("error") for a in got]))
                    continue
                per_category[q.category] += len(got)
                if q.category == "absent":
                    continue
                split = len(got) - (not q.instant_only)
                instants, ranged = got[:split], got[split:]
                if not any(has_non_nan(a) for a in instants) or not all(map(has_non_nan, ranged)):
                    empty.append(q.expr)

    asyncio.run(run())
    lines = [f"reference: {len(QUERIES)} expressions, requests per category:"]
    for category in CATEGORIES:
        count = sum(1 for q in QUERIES if q.category == category)
        lines.append(
            f"  {category:<12} {count:>3} expressions, {per_category[category]:>4} requests"
        )
    terminal_report("\n".join(lines))
    assert not failed, f"{len(failed)} expressions fail on the reference: {failed[:10]}"
    assert not empty, f"{len(empty)} expressions return no non-NaN value: {empty[:10]}"
    assert sum(len(requests_of(q)) for q in QUERIES) == sum(per_category.values())
