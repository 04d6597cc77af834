"""``python -m bench.promql [--quick]``: the read path against a reference Prometheus 2.42
holding the same samples in its own TSDB (issue 32, "Performance"). See bench/README.md."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.promql import fixture, measure
from bench.promql.fleet import DAY0_S, MONTH0_S, T_END_S, make_fleet
from bench.promql.names_fixture import ensure_names
from bench.promql.s3_cold import cold_on_s3
from bench.promql.servers import (
    Collector,
    Reference,
    Target,
    hardlink_copy,
    start_query_collector,
    start_reference,
)

GiB = 1024**3
DAY_RANGE = {"start": str(DAY0_S + 300), "end": str(T_END_S), "step": "60"}
"""The day's panels: from 5 minutes into the day, so that every window ([5m], and the
engine's 5 m lookback) lies in the day store (the reference also holds the month before)."""
PANELS = {
    "rate": "rate(http_requests_total[5m])",
    "sum_by_rate": "sum by (job) (rate(node_network_receive_bytes_total[5m]))",
    "histogram_quantile": (
        "histogram_quantile(0.9, sum by (le) (rate(http_request_duration_seconds_bucket[5m])))"
    ),
    "avg_over_time": "avg_over_time(node_load1[5m])",
}
DASHBOARD = [
    *PANELS.values(),
    "sum by (job, code) (rate(http_requests_total[5m]))",
    "sum by (job) (rate(process_cpu_seconds_total[5m]))",
    "max by (job) (process_resident_memory_bytes)",
    "sum(up)",
    "rate(http_request_duration_seconds_sum[5m]) / rate(http_request_duration_seconds_count[5m])",
    "sum by (job) (rate(node_network_transmit_bytes_total[5m]))",
]
RSS_SETTINGS = {"LM_QUERY__MAX_CONCURRENT_PROMQL": "10"}
"""One slot per loop: at the default 8, two of the 10 loops would be answered 429."""
MONTH_PANEL = 'rate(process_cpu_seconds_total{job="api"}[1h])'
HOUR_QUERY = "rate(http_requests_total[5m])"


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def block_samples(blocks: Path) -> int:
    """The samples in the reference's blocks (``promtool tsdb list``)."""
    listing = subprocess.run(
        ["promtool", "tsdb", "list", str(blocks)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert listing[0].split()[7:9] == ["NUM", "SAMPLES"], listing[0]
    # ULID, MIN TIME, MAX TIME, DURATION, NUM SAMPLES: the fifth field of a row
    return sum(int(line.split()[4]) for line in listing[1:] if line.strip())


def day_count(target: Target) -> int:
    """Samples of the last day, summed per metric name (count_over_time drops the name)."""
    total = 0
    for name in sorted(set(make_fleet().metric)):
        params = {"query": f"sum(count_over_time({name}[1d]))", "time": str(T_END_S)}
        total += int(float(target.query("/api/v1/query", params)["data"]["result"][0]["value"][1]))
    return total


def check_reference(
    ours: Collector, reference: Reference, blocks: Path, record: dict[str, Any]
) -> None:
    """Sample counts and raw samples (timestamps and values) equal on both sides."""
    raw = 'http_request_duration_seconds_bucket{instance="db-07:9100",le="0.1"}[1h]'
    raw_params = {"query": raw, "time": str(T_END_S - 7200)}
    ours_raw = ours.target.query("/api/v1/query", raw_params)["data"]
    check = {
        "reference_month_samples": block_samples(blocks),
        "fixture_month_samples": record["fixture"]["month"]["samples"],
        "ours_day_samples": day_count(ours.target),
        "reference_day_samples": day_count(reference.target),
        "fixture_day_samples": record["fixture"]["day"]["samples"],
        "raw_samples": len(ours_raw["result"][0]["values"]),
        "raw_samples_equal": ours_raw
        == reference.target.query("/api/v1/query", raw_params)["data"],
    }
    record["reference_check"] = check
    log(f"reference check: {check}")
    month = check["reference_month_samples"] == check["fixture_month_samples"]
    day = (
        check["ours_day_samples"] == check["reference_day_samples"] == check["fixture_day_samples"]
    )
    if not (month and day and check["raw_samples_equal"]):
        raise SystemExit("the reference does not hold the same samples")


def compared_json(c: measure.Compared) -> dict[str, Any]:
    return {
        "ours_wall_median_s": c.ours.wall_median,
        "reference_wall_median_s": c.reference.wall_median,
        "ratio": c.ratio,
        "ours_cpu_median_s": c.ours.cpu_median,
        "reference_cpu_median_s": c.reference.cpu_median,
        "agree": c.agree,
        "series_points_sum": c.shape,
        "ours_wall": c.ours.wall,
        "reference_wall": c.reference.wall,
        "load_before": c.load_before,
        "load_after": c.load_after,
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    fleet = make_fleet()
    record: dict[str, Any] = {"uptime_start": uptime(), "args": vars(args)}
    log("fixtures (cached under bench/.data/promql)")
    record["fixture"] = fixture.ensure(fleet, sparse_step_s=args.sparse_step_s)
    record["names_fixture"] = ensure_names()
    base = Path(str(record["fixture"]["dir"]))
    day_store = hardlink_copy(base / "day", work / "day")
    month_store = hardlink_copy(base / "month", work / "month")
    names_store = hardlink_copy(Path(str(record["names_fixture"]["dir"])) / "store", work / "names")
    reference = start_reference(base / "reference", work / "reference")
    try:
        ours = start_query_collector(f"file://{day_store}", work / "c-day")
        try:
            check_reference(ours, reference, base / "reference", record)
            panels: dict[str, Any] = {}
            for name, query in PANELS.items():
                c = measure.interleaved(
                    name,
                    ours.target,
                    reference.target,
                    "/api/v1/query_range",
                    {"query": query, **DAY_RANGE},
                    args.repeats,
                )
                panels[name] = compared_json(c)
                log(
                    f"{name}: ours {c.ours.wall_median:.3f} s ({c.ours.cpu_median:.2f} CPU s), "
                    f"reference {c.reference.wall_median:.3f} s ({c.reference.cpu_median:.2f} CPU s), "
                    f"ratio {c.ratio:.2f}, agree {c.agree}, load {c.load_after[0]:.1f}"
                )
            record["panels"] = panels
            log("remote read throughput")
            record["remote_read"] = measure.read_throughput(
                ours.target, reference.target, DAY0_S * 1000, T_END_S * 1000, args.read_repeats
            )
            log(json.dumps(record["remote_read"]))
        finally:
            ours.stop()
        cold: dict[str, Any] = {}
        for name, query in PANELS.items():
            fresh = start_query_collector(f"file://{day_store}", work / f"c-cold-{name}")
            try:
                wall, cpu, _ = measure.timed(
                    fresh.target, "/api/v1/query_range", {"query": query, **DAY_RANGE}
                )
            finally:
                fresh.stop()
            cold[name] = {"wall_s": wall, "cpu_s": cpu}
            log(f"cold {name}: {wall:.3f} s, {cpu:.2f} CPU s")
        record["cold"] = cold
        record["rss"] = rss(args, day_store, work, reference)
        record["month"] = month(args, day_store, month_store, work, reference)
    finally:
        reference.stop()
    names_collector = start_query_collector(f"file://{names_store}", work / "c-names", engine=False)
    try:
        record["names"] = {
            "24h": measure.names(
                names_collector.target, T_END_S - 86400 + 1800, T_END_S + 1800, args.repeats
            ),
            "30d": measure.names(names_collector.target, MONTH0_S, T_END_S, args.repeats),
        }
        log(f"names: {record['names']}")
    finally:
        names_collector.stop()
    if args.s3_latency_ms:
        month_params = {"start": str(MONTH0_S + 3600), "end": str(T_END_S), "step": "3600"}
        queries = {n: ("day", {"query": q, **DAY_RANGE}) for n, q in PANELS.items()}
        queries["30-day panel"] = ("month", {"query": MONTH_PANEL, **month_params})
        hour = {"query": HOUR_QUERY, "start": str(T_END_S - 3600), "end": str(T_END_S)}
        hour["step"] = "60"
        record["s3_cold"] = s3_phase(
            work / "s3",
            {"day": day_store, "month": month_store},
            queries,
            args.s3_latency_ms,
            log,
            {"day": hour, "month": hour},
        )
        s3 = record["s3_cold"]
        s3["requests_equal"] = s3["requests day"].get("query") == s3["requests month"]["query"]
    record["uptime_end"] = uptime()
    return record


def s3_phase(*args: Any) -> dict[str, Any]:
    """`cold_on_s3`, its failure recorded rather than losing the rest of the run."""
    try:
        return cold_on_s3(*args)
    except Exception as error:  # recorded and printed with the results
        log(f"S3 phase failed: {error!r}")
        return {"error": repr(error)[:1000], "requests day": {}, "requests month": {"query": 0}}


def rss(args: argparse.Namespace, store: Path, work: Path, reference: Reference) -> dict[str, Any]:
    panels = [{"query": q, **DAY_RANGE} for q in DASHBOARD]
    collector = start_query_collector(f"file://{store}", work / "c-rss", extra=RSS_SETTINGS)
    try:
        ours = measure.loops_rss(collector.target, panels, args.loops, args.loop_seconds)
    finally:
        collector.stop()
    log(f"RSS ours: {ours}")
    theirs = measure.loops_rss(reference.target, panels, args.loops, args.loop_seconds)
    log(f"RSS reference: {theirs}")
    return {
        "ours": ours,
        "reference": theirs,
        "panels": DASHBOARD,
        "settings": f"{RSS_SETTINGS}, otherwise the defaults: query.cache_bytes 256 MiB, "
        "max_read_bytes_in_flight 512 MiB, max_read_samples 1e7, the engine's "
        "--query.max-concurrency = max_concurrent_promql",
    }


def month(
    args: argparse.Namespace, day_store: Path, month_store: Path, work: Path, reference: Reference
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    params = {
        "query": MONTH_PANEL,
        "start": str(MONTH0_S + 3600),
        "end": str(T_END_S),
        "step": "3600",
    }
    collector = start_query_collector(f"file://{month_store}", work / "c-month-cold")
    try:
        wall, cpu, _ = measure.timed(collector.target, "/api/v1/query_range", params)
        out["cold"] = {"wall_s": wall, "cpu_s": cpu}
        c = measure.interleaved(
            "month", collector.target, reference.target, "/api/v1/query_range", params, args.repeats
        )
        out["warm"] = compared_json(c)
        log(
            f"30-day panel: cold {wall:.3f} s; warm ours {c.ours.wall_median:.3f} s, "
            f"reference {c.reference.wall_median:.3f} s, agree {c.agree}"
        )
    finally:
        collector.stop()
    hour = {"query": HOUR_QUERY, "start": str(T_END_S - 3600), "end": str(T_END_S), "step": "60"}
    for name, store in (("1 day", day_store), ("30 days", month_store)):
        fresh = start_query_collector(f"file://{store}", work / f"c-requests-{name[:2].strip()}")
        try:
            out[f"requests {name}"] = measure.requests_for(fresh, hour)
        finally:
            fresh.stop()
        log(f"store requests, 1 h query over {name} of history: {out[f'requests {name}']}")
    first, second = out["requests 1 day"]["query"], out["requests 30 days"]["query"]
    out["requests_equal"] = first == second
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.promql", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, 30 s loops")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (7)")
    parser.add_argument("--read-repeats", type=int, default=None, help="remote reads (3)")
    parser.add_argument("--loops", type=int, default=10)
    parser.add_argument("--loop-seconds", type=float, default=None, help="RSS loops (300 s)")
    parser.add_argument(
        "--sparse-step-s",
        type=int,
        default=300,
        help="the 990 other series' step before the last day (a multiple of 15)",
    )
    parser.add_argument(
        "--s3-latency-ms",
        type=float,
        nargs="*",
        default=None,
        help="cold queries on MiniStack behind the delay proxy (0 20; none: skip)",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (3 if args.quick else 7)
    args.read_repeats = args.read_repeats or (1 if args.quick else 3)
    args.loop_seconds = args.loop_seconds or (30.0 if args.quick else 300.0)
    if args.s3_latency_ms is None:
        args.s3_latency_ms = [20.0] if args.quick else [0.0, 20.0]
    if args.sparse_step_s % 15 or args.sparse_step_s > 3600:
        parser.error("--sparse-step-s must be a multiple of 15, at most 3600")
    with tempfile.TemporaryDirectory(prefix="bench-promql-", dir=args.work_dir) as tmp:
        record = run(args, Path(tmp))
    text = json.dumps(record, indent=1, default=str)
    if args.json:
        args.json.write_text(text)
    print(text)
    verdicts(record)


def verdicts(record: dict[str, Any]) -> None:
    lines = []
    for name, panel in record["panels"].items():
        ok = panel["ratio"] <= 3.0
        lines.append(f"{name}: warm ratio {panel['ratio']:.2f} (<= 3): {'MET' if ok else 'MISSED'}")
    warm = record["month"]["warm"]["ours_wall_median_s"]
    lines.append(f"30-day panel warm {warm:.3f} s (<= 2 s): {'MET' if warm <= 2 else 'MISSED'}")
    for span, paths in record["names"].items():
        for path, got in paths.items():
            worst = max(got["cold_s"], got["warm_median_s"])
            lines.append(
                f"names {span} {path}: warm {got['warm_median_s']:.3f} s, cold "
                f"{got['cold_s']:.3f} s (<= 1 s): {'MET' if worst <= 1 else 'MISSED'}"
            )
    over = record["rss"]["ours"]["over_idle"]
    lines.append(
        f"RSS over idle {over / 2**20:.0f} MiB (<= 1 GiB): {'MET' if over <= GiB else 'MISSED'}"
    )
    lines.append(
        "store requests equal at 1 and 30 days (lm_store_request_seconds_count): "
        f"{record['month']['requests_equal']}"
    )
    if "s3_cold" in record:
        equal = record["s3_cold"]["requests_equal"]
        lines.append(f"S3 requests equal at 1 and 30 days (counting proxy): {equal}")
    print("\n".join(lines))
    if any(math.isnan(p["ratio"]) for p in record["panels"].values()):
        sys.exit(1)
