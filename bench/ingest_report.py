"""bench.ingest: the printed report and the verdicts."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

from bench import _common as c
from bench.ingest_phases import (
    ANON_LIMIT_BYTES,
    NOISY_CORES,
    P50_TARGET,
    RSS_LIMIT_BYTES,
    THROUGHPUT_TARGET,
    RssResult,
    Scenario,
)

# --- the report -------------------------------------------------------------------------------


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def render_report(scenarios: list[Scenario], rss: list[RssResult], notes: list[str]) -> str:
    lines = [
        f"{'scenario':<20} {'path':<9} {'batch/s':>7} {'points/s':>8} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'ops/b':>5} | {'cpu-s per 1000 batches':^37} | {'others':>6} "
        f"{'peakRSS':>7}",
        f"{'':<20} {'':<9} {'':>7} {'':>8} {'':>7} {'':>7} {'':>5} | "
        f"{'collector':>9} {'store':>6} {'driver':>6} {'proxy':>5} {'total':>6} | "
        f"{'cores':>6} {'MiB':>7} {'load':>14}",
    ]
    for s in scenarios:
        for phase in (s.baseline, s.http, s.collector):
            total = phase.total_cpu_per_batch()
            lines.append(
                f"{s.name:<20} {phase.path:<9} {phase.batches_per_s:>7.1f} "
                f"{phase.points_per_s:>8.0f} {phase.p50_ms:>7.1f} {phase.p99_ms:>7.1f} "
                f"{_num(phase.ops_per_batch):>5} | {_num(phase.cpu_per_1k('collector')):>9} "
                f"{_num(phase.cpu_per_1k('store')):>6} {_num(phase.cpu_per_1k('driver')):>6} "
                f"{_num(phase.cpu_per_1k('proxy')):>5} "
                f"{_num(total * 1000 if total is not None else None):>6} | "
                f"{phase.others_cores:>6.2f} "
                f"{'/'.join(f'{m:.0f}' for m in phase.peak_rss_mib) or '-':>7} "
                f"{'/'.join(f'{v:.2f}' for v in phase.load_avg):>14}"
            )
        col = s.collector
        lines.append(
            f"{'':<20} {'vs http':<9} {s.throughput_ratio:>6.2f}x {'':>8} {s.p50_ratio:>6.2f}x"
            f" {col.p99_ms / s.http.p99_ms:>6.2f}x   per serving-process CPU second "
            f"{_num(s.server_cpu_ratio)}x"
            + (f"; runs {s.http_runs} / {s.collector_runs}" if len(s.collector_runs) > 1 else "")
        )
        lines.append(
            f"{'':<20} {'vs 2-PUT':<9} {s.raw_throughput_ratio:>6.2f}x {'':>8} "
            f"{s.raw_p50_ratio:>6.2f}x   CPU-bound estimate (all processes) "
            f"{_num(s.cpu_ratio)}x; sustained incl. index flush {col.sustained_per_s:.1f}/s; "
            f"failures {s.baseline.failures}/{s.http.failures}/{col.failures}, retries "
            f"{col.retries} {col.retry_reasons or ''}"
        )
        lines.append(
            f"{'':<20} {'index log':<9} backlog {col.index_backlog:.0f} at window end, drained "
            f"in {col.index_drain_s:.1f} s{' (extrapolated)' if col.index_drain_estimated else ''}; "
            f"{_index_text(col.index_rows)}; cpu-s per 1000 "
            f"batches incl. drain: collector {_num(col.cpu_per_1k('collector', incl_drain=True))}"
            f", store {_num(col.cpu_per_1k('store', incl_drain=True))}"
        )
        lines.append(
            f"{'':<20} {'ack ops':<9} "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(col.ops_by_kind.items()))
        )
    lines.append("")
    for r in rss:
        lines.append(
            f"RSS {r.store}/{r.latency_ms:g}ms, max_in_flight_requests {r.in_flight_limit}: "
            f"{r.concurrency} concurrent uploads of {r.frame_bytes} B, {r.accepted} accepted, "
            f"{r.retries} retries {r.retry_reasons or ''}, listen overflows "
            f"{r.listen_overflows}, max in flight {r.max_in_flight_seen:.0f}; MiB per worker: "
            f"idle {_mibs(r.idle_rss_mib)}, after 8 batches {_mibs(r.warm_rss_mib)}, "
            f"peak VmHWM {_mibs(r.peak_rss_mib)} (peak RssAnon {_mibs(r.peak_anon_mib)})"
        )
    lines += [f"note: {note}" for note in notes]
    lines += ["", "targets:", *_targets(scenarios, rss)]
    return "\n".join(lines)


def _mibs(values: list[float]) -> str:
    return "/".join(f"{v:.0f}" for v in values)


def _index_text(rows: dict[str, float]) -> str:
    return ", ".join(f"{k.removeprefix('fate=')} {v:.0f}" for k, v in sorted(rows.items()))


def _targets(scenarios: list[Scenario], rss: list[RssResult]) -> list[str]:
    lines = []
    for s in scenarios:
        ratio, cpu = s.throughput_ratio, s.server_cpu_ratio
        ok = ratio >= THROUGHPUT_TARGET and cpu is not None and cpu >= THROUGHPUT_TARGET
        lines.append(
            f"  [{_verdict(ok)}] throughput >= {THROUGHPUT_TARGET}x the HTTP baseline, measured "
            f"and per serving-process CPU second: {s.name} {ratio:.2f}x, {_num(cpu)}x"
        )
    for s in scenarios:
        lines.append(
            f"  [{_verdict(s.p50_ratio <= P50_TARGET)}] ack p50 <= {P50_TARGET}x the HTTP "
            f"baseline: {s.name} {s.collector.p50_ms:.1f} / {s.http.p50_ms:.1f} ms = "
            f"{s.p50_ratio:.2f}x"
        )
    for s in scenarios:
        ops = s.collector.ops_per_batch
        lines.append(
            f"  [{_verdict(ops == 2.0)}] 2.0 store ops on the ack path per new batch: "
            f"{s.name} {_num(ops, '.3f')}"
        )
    for r in rss:
        worst, anon = max(r.peak_rss_mib), max(r.peak_anon_mib)
        ok = worst * c.MiB <= RSS_LIMIT_BYTES and anon * c.MiB <= ANON_LIMIT_BYTES
        lines.append(
            f"  [{_verdict(ok)}] peak RSS <= {RSS_LIMIT_BYTES // c.MiB} MiB and RssAnon <= "
            f"{ANON_LIMIT_BYTES // c.MiB} MiB per worker with {r.concurrency} concurrent "
            f"{r.frame_bytes / 1024:.0f} KiB uploads: {r.store}, max_in_flight_requests "
            f"{r.in_flight_limit}: peak {worst:.0f} MiB, RssAnon {anon:.0f} MiB"
        )
    noisy = [
        f"{s.name} {p.path} ({p.others_cores:.2f} cores)"
        for s in scenarios
        for p in (s.baseline, s.http, s.collector)
        if p.others_cores > NOISY_CORES
    ]
    if noisy:
        lines.append(
            f"  NOTE: other processes used > {NOISY_CORES} cores during: " + "; ".join(noisy)
        )
    return lines


def header(args: argparse.Namespace, frame_bytes: int) -> str:
    versions = ", ".join(
        f"{name} {_version(name)}"
        for name in ("aiohttp", "aiobotocore", "botocore", "uvloop", "pyarrow", "ministack")
    )
    return (
        f"Lightmetrics ingest benchmark, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC\n"
        f"machine: {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}\n"
        f"versions: {versions}\n"
        f"command: {' '.join([Path(sys.executable).name, '-m', 'bench.ingest', *sys.argv[1:]])}\n"
        f"frames: {args.points_per_batch} points, {frame_bytes} bytes, "
        f"{'zstd' if args.compress else 'uncompressed'}; collector workers: {args.workers}; "
        f"batches per phase <= {args.batches}, <= {args.phase_s:g} s"
    )


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"
