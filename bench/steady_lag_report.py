"""`bench.steady_lag`'s results (`Run`, `Sample`), its catalog check and its report."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench._common import percentile
from protocol import keys

NS = 1_000_000_000


@dataclass
class Sample:
    t_s: float  # since the writers started
    lag_s: float  # status's definition: oldest waiting segment, from its first row time
    lag_written_s: float  # the same, from when its create returned
    gauge_s: float | None  # lm_reconciler_log_lag_seconds
    checkpoint_age_s: float | None  # since the checkpoint last moved (a chunk committed)
    waiting: int  # segments written and not yet consumed
    written: int  # segments written so far
    audit: str | None  # the newest audit's status
    reconciler_cores: float
    audit_worker_cores: float  # the daemon's child processes (its audit worker)
    writer_cores: float
    others_cores: float
    reconciler_rss_mib: float
    audit_worker_rss_mib: float


@dataclass
class Run:
    args: dict[str, Any]
    settings: dict[str, Any]
    uptime: dict[str, str] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    writers: list[dict[str, Any]] = field(default_factory=list)
    writer_cpu_s: float = 0.0
    reconciler_cpu_s: float = 0.0
    reconciler_peak_rss_mib: float = 0.0
    audit_worker_cpu_s: float = 0.0
    """The daemon's audit workers, up to the last sample."""
    audit_worker_peak_rss_mib: float = 0.0
    """The highest sampled resident set of the daemon's audit worker."""
    audits: list[dict[str, Any]] = field(default_factory=list)
    catch_up_s: float = 0.0
    never_consumed: int = 0
    catalog: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[float, str, str]] = field(default_factory=list)
    """(t s, event, detail) from the daemon's log: audits, compactions, stage failures."""


def catalog_check(root: Path) -> dict[str, Any]:
    """Distinct accepted keys in every catalog file (read from disk), rows by ``source``."""
    files = sorted((root / keys.INDEX_CATALOG_PREFIX).rglob("*.parquet"))
    keys_seen: list[pa.ChunkedArray] = []
    sources: dict[str, int] = {}
    rows = 0
    for path in files:
        table = pq.read_table(path, columns=["kind", "key", "source"])
        rows += table.num_rows
        accepted = table.filter(pc.equal(table.column("kind"), "accepted"))
        keys_seen.append(accepted.column("key"))
        source = pc.if_else(
            pc.starts_with(pc.fill_null(table.column("source"), ""), keys.INDEX_LOG_PREFIX),
            "log segment",
            pc.fill_null(table.column("source"), "(none)"),
        )
        for entry in pc.value_counts(source).to_pylist():
            sources[entry["values"]] = sources.get(entry["values"], 0) + entry["counts"]
    distinct = 0
    if keys_seen:
        distinct = int(
            pc.count_distinct(
                pa.chunked_array(
                    [chunk for column in keys_seen for chunk in column.chunks], pa.string()
                )
            ).as_py()
        )
    return {"files": len(files), "rows": rows, "accepted_keys": distinct, "rows_by_source": sources}


def _max(values: list[float]) -> float:
    return max(values) if values else float("nan")


def render(run: Run) -> tuple[str, dict[str, Any]]:
    args = run.args
    loop_s = float(run.settings["reconciler.loop_interval_s"])
    limit = 2 * loop_s
    window = [s for s in run.samples if s.t_s <= args["duration_s"]]
    during_audit = [s for s in run.samples if s.audit == "running"]
    lags = sorted(s.lag_s for s in window)
    batches = sum(int(w.get("batches", 0)) for w in run.writers)
    seconds = max((float(w.get("seconds", 0)) for w in run.writers), default=0.0)
    rate = batches / seconds if seconds else 0.0
    max_all = _max([s.lag_s for s in run.samples])
    max_audit = _max([s.lag_s for s in during_audit])
    passed = max_all < limit and not run.never_consumed
    expected = run.catalog.get("expected", 0)
    cataloged = run.catalog.get("accepted_keys", 0)
    lines = [
        "## bench.steady_lag",
        "",
        f"- asked: {args['rate']:g} batches/s from {args['writers']} writers "
        f"({args['writer_procs']} processes) for {args['duration_s']:g} s; "
        f"**achieved {rate:.0f} batches/s** ({batches} batches, "
        f"{sum(int(w.get('dropped_batches', 0)) for w in run.writers)} dropped by writers "
        f"that fell behind; {sum(int(w.get('segments', 0)) for w in run.writers)} segments, "
        f"{sum(int(w.get('rows_written', 0)) for w in run.writers)} rows)",
        "- settings: " + ", ".join(f"{k} {v}" for k, v in run.settings.items()),
        "- uptime: " + "; ".join(f"{k}: `{v}`" for k, v in run.uptime.items()),
        f"- lag (status's definition: oldest waiting segment from its first row), during the "
        f"load: p50 {percentile(lags, 50):.1f} s, p95 {percentile(lags, 95):.1f} s, "
        f"max {_max(lags):.1f} s; whole run incl. catch-up max {max_all:.1f} s; "
        f"while a full audit ran ({len(during_audit)} samples): max {max_audit:.1f} s; "
        f"since written max {_max([s.lag_written_s for s in run.samples]):.1f} s; "
        f"daemon gauge max {_max([s.gauge_s or 0.0 for s in run.samples]):.1f} s",
        f"- **target lag < {limit:g} s (2 x loop_interval_s) throughout, also during an "
        f"audit: {'PASS' if passed and during_audit else 'MISS'}**"
        + ("" if during_audit else " (no audit ran inside the window)"),
        f"- caught up {run.catch_up_s:.1f} s after the writers stopped; segments never "
        f"consumed: {run.never_consumed}",
        f"- daemon CPU {run.reconciler_cpu_s:.1f} s over its life = "
        f"{run.reconciler_cpu_s / batches * 1e6 if batches else 0:.0f} us per batch (audits "
        f"and the first pass included); peak RSS {run.reconciler_peak_rss_mib:.0f} MiB; "
        f"plus its audit worker processes {run.audit_worker_cpu_s:.1f} s (up to the last "
        f"sample; peak sampled RSS {run.audit_worker_peak_rss_mib:.0f} MiB); "
        f"writers CPU {run.writer_cpu_s:.1f} s",
        f"- catalog: {run.catalog.get('files')} files, {run.catalog.get('rows')} rows, "
        f"{cataloged} distinct accepted keys of {expected} batches written — "
        f"{'every batch cataloged' if cataloged == expected else 'MISMATCH'}; rows by source "
        f"{run.catalog.get('rows_by_source')}",
        "- audits: "
        + "; ".join(
            f"{a['status']} {_secs(a)}"
            for a in sorted(run.audits, key=lambda a: a.get("started_at_unix_ns") or 0)
        ),
        "- daemon events (t from the writers' start): "
        + "; ".join(f"t={t:g} s {event} ({detail})" for t, event, detail in run.events),
        "",
        "| t s | lag s | since written s | gauge s | checkpoint age s | waiting / written "
        "segments | audit | daemon cores | audit worker cores | writer cores | others cores "
        "| daemon RSS MiB | audit worker RSS MiB |",
        "|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    step = max(1, round(10 / max(0.5, float(args["sample_s"]))))
    for i, s in enumerate(run.samples):
        if i % step and s.lag_s < limit / 2:
            continue  # every ~10 s, and every sample with a lag past half the limit
        lines.append(
            f"| {s.t_s:.0f} | {s.lag_s:.1f} | {s.lag_written_s:.1f} | {_round(s.gauge_s)} "
            f"| {s.checkpoint_age_s} "
            f"| {s.waiting} / {s.written} | {s.audit} | {s.reconciler_cores:.2f} "
            f"| {s.audit_worker_cores:.2f} | {s.writer_cores:.2f} | {s.others_cores:.2f} "
            f"| {s.reconciler_rss_mib:.0f} | {s.audit_worker_rss_mib:.0f} |"
        )
    summary = {
        **{k: v for k, v in dataclasses.asdict(run).items() if k != "samples"},
        "samples": [dataclasses.asdict(s) for s in run.samples],
        "achieved_rate": rate,
        "max_lag_s": max_all,
        "max_lag_during_audit_s": max_audit,
        "pass": passed and bool(during_audit),
    }
    return "\n".join(lines), summary


def _round(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _secs(audit: dict[str, Any]) -> str:
    start, end = audit.get("started_at_unix_ns"), audit.get("completed_at_unix_ns")
    length = f"{(end - start) / NS:.0f} s" if start and end else "unfinished"
    return f"({length})"
