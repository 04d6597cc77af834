"""`bench.steady`'s results (`Result`) and its report: CPU per batch per process, the
ratio, requests, the catalog."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.counting import Tally, by_class, describe


@dataclass
class CollectorRun:
    name: str
    pid: int
    accepted: int = 0  # in the measured window (after the warm-up)
    failures: int = 0
    retries: int = 0
    cpu_s: float = 0.0  # end of warm-up to exit


@dataclass
class ReconcilerRun:
    label: str
    cpu_s: float
    seconds: float
    code: int
    report: dict[str, Any]
    requests: Tally


@dataclass
class CatalogCheck:
    files: int = 0
    rows: int = 0
    accepted_keys: int = 0
    expected: int = 0
    missing: int = 0
    missing_from_log: int = 0  # of the missing: named by no log segment
    unexpected: int = 0
    read_back_rows: int = 0
    rows_without_etag: int = 0


@dataclass
class Result:
    args: dict[str, Any]
    settings: dict[str, Any]
    uptime: dict[str, str] = field(default_factory=dict)
    collectors: list[CollectorRun] = field(default_factory=list)
    warm_up_batches: int = 0
    load_seconds: float = 0.0
    load_cpu: dict[str, float] = field(default_factory=dict)
    runs: dict[str, ReconcilerRun] = field(default_factory=dict)
    catalog: CatalogCheck = field(default_factory=CatalogCheck)
    profile: str | None = None


def _ms(seconds: float, batches: int) -> float:
    return seconds / batches * 1000 if batches else float("nan")


def render(result: Result, target: float) -> tuple[str, dict[str, Any]]:
    steady, empty, first = result.runs["steady"], result.runs["empty"], result.runs["first"]
    pass_doc = steady.report.get("steady", {})
    cataloged = int(pass_doc.get("rows_cataloged", 0))
    accepted = sum(r.accepted for r in result.collectors)
    collector_cpu = sum(r.cpu_s for r in result.collectors)
    collector_ms = _ms(collector_cpu, accepted)
    whole_ms = _ms(steady.cpu_s, cataloged)
    marginal_ms = _ms(steady.cpu_s - empty.cpu_s, cataloged)
    ratio_whole = collector_ms / whole_ms if whole_ms else float("nan")
    ratio_marginal = collector_ms / marginal_ms if marginal_ms > 0 else float("inf")
    classes = by_class(steady.requests)
    requests = sum(steady.requests.values())
    lines = [
        "## bench.steady",
        "",
        f"- batches: {accepted} accepted in the measured window + {result.warm_up_batches} "
        f"warm-up, {result.args['points']} points each, {len(result.collectors)} collectors, "
        f"concurrency {result.args['concurrency']} each; load {result.load_seconds:.1f} s "
        f"({accepted / result.load_seconds:.0f} batches/s)",
        "- CPU during the load (s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in result.load_cpu.items())
        + f" (others = {result.load_cpu.get('others', 0) / result.load_seconds:.2f} cores)",
        "- settings: " + ", ".join(f"{k} {v}" for k, v in result.settings.items()),
        "- uptime: " + "; ".join(f"{k}: `{v}`" for k, v in result.uptime.items()),
        "",
        "| process | batches | CPU s | ms CPU / batch |",
        "|---|---:|---:|---:|",
    ]
    for run in result.collectors:
        lines.append(
            f"| {run.name} (pid {run.pid}; {run.failures} failed, {run.retries} retries) "
            f"| {run.accepted} | {run.cpu_s:.2f} | {_ms(run.cpu_s, run.accepted):.3f} |"
        )
    lines += [
        f"| collectors together | {accepted} | {collector_cpu:.2f} | {collector_ms:.3f} |",
        f"| reconciler `run --once`, whole process ({steady.seconds:.1f} s wall) "
        f"| {cataloged} | {steady.cpu_s:.2f} | {whole_ms:.4f} |",
        f"| reconciler `run --once` with nothing new (fixed cost, {empty.seconds:.1f} s wall) "
        f"| 0 | {empty.cpu_s:.2f} | |",
        f"| reconciler, marginal (whole - fixed) | {cataloged} | "
        f"{steady.cpu_s - empty.cpu_s:.2f} | {marginal_ms:.4f} |",
        f"| first `run --once` (audit of the empty bucket, GC; not in the ratio, "
        f"{first.seconds:.1f} s wall) | 0 | {first.cpu_s:.2f} | |",
        "",
        f"**Ratio** (collector cores one reconciler core keeps up with, target >= {target:g}): "
        f"whole process **{ratio_whole:.1f}**, marginal **{ratio_marginal:.1f}** — "
        f"{'PASS' if ratio_whole >= target else 'MISS'} (whole), "
        f"{'PASS' if ratio_marginal >= target else 'MISS'} (marginal)",
        "",
        f"- steady run's pass: {json_line(pass_doc)}; "
        f"{cataloged / max(1, int(pass_doc.get('segments', 0))):.1f} batches per segment",
        f"- steady run's store requests: {requests} = {requests / cataloged:.4f} per batch "
        f"(PUT-class {classes['PUT'] / cataloged:.4f}, GET-class {classes['GET'] / cataloged:.4f}):"
        f" {describe(steady.requests)}",
        f"- empty run's store requests: {sum(empty.requests.values())}: {describe(empty.requests)}",
        f"- catalog: {result.catalog.files} files, {result.catalog.rows} rows, "
        f"{result.catalog.accepted_keys} accepted keys of {result.catalog.expected} accepted "
        f"batches: {result.catalog.missing} missing ({result.catalog.missing_from_log} of them "
        f"named by no log segment), {result.catalog.unexpected} unexpected, "
        f"{result.catalog.read_back_rows} rows read back, "
        f"{result.catalog.rows_without_etag} without etag — "
        f"{'every batch cataloged' if not result.catalog.missing else 'BATCHES MISSING'}",
    ]
    if result.profile:
        lines += ["", "```", result.profile.rstrip(), "```"]
    summary = {
        "args": result.args,
        "settings": result.settings,
        "uptime": result.uptime,
        "collectors": [vars(r) for r in result.collectors],
        "collector_ms_per_batch": collector_ms,
        "reconciler_ms_per_batch_whole": whole_ms,
        "reconciler_ms_per_batch_marginal": marginal_ms,
        "ratio_whole": ratio_whole,
        "ratio_marginal": ratio_marginal,
        "runs": {
            k: {
                "cpu_s": r.cpu_s,
                "seconds": r.seconds,
                "report": r.report,
                "requests": {f"{op} {area}": n for (op, area), n in r.requests.items()},
            }
            for k, r in result.runs.items()
        },
        "catalog": vars(result.catalog),
        "load_seconds": result.load_seconds,
        "load_cpu": result.load_cpu,
    }
    return "\n".join(lines), summary


def json_line(doc: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in doc.items())
