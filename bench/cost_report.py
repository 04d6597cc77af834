"""The report of `bench.cost`: requests per accepted batch by phase and S3 class, dollars,
targets, amortization notes and the 1x/10x rollup comparison (markdown + a JSON summary)."""

from __future__ import annotations

import platform
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.cost_history import HistoryRun
from bench.counting import Tally, by_class, describe, dollars, select


@dataclass
class Measured:
    args: dict[str, object]
    settings: dict[str, object]
    phases: dict[str, Tally] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    accepted: int = 0
    resent: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    load_seconds: float = 0.0
    reconciler_seconds: float = 0.0
    idle_seconds: float = 0.0
    catalog_wait_s: float = 0.0
    history: list[HistoryRun] = field(default_factory=list)
    loadavg: dict[str, tuple[float, float, float]] = field(default_factory=dict)


BEFORE = {"PUT": 9.24, "GET": 8.2, "dollars": 49.50}
"""The per-object design (derived entries), same setup: 2 collectors, 2,000 batches +
5 % re-sends, ``run --once`` twice, one rollup (issue 11)."""
TARGET = {"PUT": 2.05, "GET": 2.5}
BUNDLES_TARGET_PUT = 1.25
"""Issue 33: end to end with bundles on, 64 concurrent senders on 2 collectors."""
RAW = ("raw-blobs", "raw-bundles")
LOG = ["index-log"]
PROBES = ["probe", "index-versions", "index-features.json"]
"""The collectors' readiness check (a HEAD every 5 s each) and start-up probe, and the
feature gate's requests (PROTOCOL §3.10: the version entry's PUT and the feature record's
conditional GET, each once a minute per process)."""


def _sum(*tallies: Tally) -> Tally:
    total: Tally = Counter()
    for tally in tallies:
        total.update(tally)
    return total


def _row(label: str, tally: Tally, batches: int) -> tuple[str, dict[str, Any]]:
    c = by_class(tally)
    put, get = c["PUT"] / batches, c["GET"] / batches
    line = (
        f"| {label} | {c['PUT']:,} | {c['GET']:,} | {put:.4f} | {get:.4f} "
        f"| {dollars(put, get) * 1e6:.2f} |"
    )
    return line, {"put": c["PUT"], "get": c["GET"], "put_per_batch": put, "get_per_batch": get}


def _verdict(ok: bool) -> str:
    return "**PASS**" if ok else "**MISS**"


def render(m: Measured) -> tuple[str, dict[str, Any]]:
    n = max(1, m.accepted)
    p = m.phases
    new, shut = p["collectors: new batches"], p["collectors: shutdown"]
    resends = {label: p[label] for label in m.resent}
    ack_new = select(new, LOG + PROBES, exclude=True)
    flushes = _sum(select(new, LOG), *(select(t, LOG) for t in resends.values()), select(shut, LOG))
    probes = _sum(
        p["collectors: start-up probe"],
        select(new, PROBES),
        *(select(t, PROBES) for t in resends.values()),
        select(shut, LOG, exclude=True),
    )
    parts: list[tuple[str, Tally]] = [
        ("collectors: acknowledgement path, new batches", ack_new),
        *(
            (f"{label} x {m.resent[label]}", select(tally, LOG + PROBES, exclude=True))
            for label, tally in resends.items()
        ),
        ("collectors: index log flushes (incl. shutdown)", flushes),
        ("collectors: start-up probe, readiness checks, feature gate", probes),
        (
            f"reconciler: `run` for {m.reconciler_seconds:.0f} s (steady passes, lease, "
            f"first audit, {m.idle_seconds:.0f} s idle)",
            p["reconciler: run (whole life)"],
        ),
        ("reconciler: one full audit (`lm-reconciler audit`)", p["reconciler: one full audit"]),
    ]
    if "reconciler: one GC run" in p:
        parts.append(("reconciler: one GC run (`lm-reconciler gc`)", p["reconciler: one GC run"]))
    parts.append(("rollup: one `lm-rollup run`", p["rollup: one run"]))
    total = _sum(*(tally for _label, tally in parts))

    out: list[str] = []
    summary: dict[str, Any] = {"phases": {}, "settings": m.settings, "args": m.args}
    rate = m.accepted / m.load_seconds if m.load_seconds else 0.0
    out.append(
        f"Accepted {m.accepted:,} new batches in {m.load_seconds:.1f} s ({rate:.1f}/s over "
        f"{m.args['collectors']} collectors, concurrency {m.args['concurrency']}), re-sent "
        f"{sum(m.resent.values())}; outcomes {m.outcomes}. Catalog complete {m.catalog_wait_s:.1f} s after "
        "the collectors stopped."
    )
    out.append("")
    out.append(
        "| phase | PUT-class | GET-class | PUT-class / batch | GET-class / batch | $ / M batches |"
    )
    out.append("|---|---:|---:|---:|---:|---:|")
    for label, tally in parts:
        line, data = _row(label, tally, n)
        out.append(line)
        summary["phases"][label] = {
            **data,
            "detail": {f"{o} {a}": v for (o, a), v in tally.items()},
        }
    line, data = _row("**total, end to end**", total, n)
    out.append(line)
    summary["total"] = data
    out.append(
        f"| before (derived entries, issue 11) | | | {BEFORE['PUT']} | {BEFORE['GET']} "
        f"| {BEFORE['dollars']:.2f} |"
    )
    out.append("")
    out.append("Requests by operation and key area:")
    out.append("")
    for label, tally in parts:
        out.append(f"- {label}: {describe(tally) or 'none'}")
    out.append("")

    # Targets.
    ack = by_class(ack_new)
    bundles = bool(m.args.get("bundles"))
    raw_puts = sum(n for (op, area), n in ack_new.items() if area in RAW and op.startswith("put"))
    summary["frames_per_raw_put"] = m.accepted / raw_puts if raw_puts else None
    out.append("Targets:")
    out.append("")
    if bundles:
        out.append(
            f"- bundles on: {m.accepted:,} frames in {raw_puts:,} raw PUTs = "
            f"{m.accepted / max(1, raw_puts):.2f} frames per raw PUT; acknowledgement path "
            f"{ack['PUT'] / n:.3f} PUT-class + {ack['GET'] / n:.3f} GET-class a batch"
        )
    else:
        out.append(
            f"- acknowledgement path, new batch: {ack['PUT'] / n:.3f} PUT-class + "
            f"{ack['GET'] / n:.3f} GET-class (exactly 2 PUT): "
            f"{_verdict(ack['PUT'] == 2 * m.accepted and ack['GET'] == 0)}"
        )
    for label, tally in resends.items():
        count = max(1, m.resent[label])
        c = by_class(select(tally, LOG + PROBES, exclude=True))
        out.append(
            f"- {label.removeprefix('collectors: ')}: {c['PUT'] / count:.2f} PUT-class + "
            f"{c['GET'] / count:.2f} GET-class each (<= 2 PUT-class): "
            f"{_verdict(c['PUT'] <= 2 * count)}"
        )
    put_target = BUNDLES_TARGET_PUT if bundles else TARGET["PUT"]
    out.append(
        f"- end to end: {data['put_per_batch']:.3f} PUT-class (<= {put_target}) "
        f"{_verdict(data['put_per_batch'] <= put_target)}, {data['get_per_batch']:.3f} "
        f"GET-class (<= {TARGET['GET']}) {_verdict(data['get_per_batch'] <= TARGET['GET'])}; "
        f"${dollars(data['put_per_batch'], data['get_per_batch']) * 1e6:.2f} per million "
        f"batches (before: ${BEFORE['dollars']:.2f})"
    )
    out.append("")
    out.extend(_amortization(m, flushes, rate))
    if m.history:
        out.extend(_history(m, summary))
    out.extend(_environment(m))
    for note in m.notes:
        out.append(f"Note: {note}")
    return "\n".join(out), summary


def _amortization(m: Measured, flushes: Tally, rate: float) -> list[str]:
    n = max(1, m.accepted)
    s = m.settings
    segments = by_class(flushes)["PUT"]
    age_s = float(s["ingest.index_flush_max_age_ms"]) / 1000  # type: ignore[arg-type]
    writers = int(m.args["collectors"])  # type: ignore[call-overload]
    idle = by_class(m.phases["reconciler idle window"])
    per_hour = {k: v * 3600 / m.idle_seconds for k, v in idle.items()} if m.idle_seconds else idle
    audit = by_class(m.phases["reconciler: one full audit"])
    interval_h = float(s["reconciler.max_audit_interval_s"]) / 3600  # type: ignore[arg-type]
    lines = [
        "Amortization:",
        "",
        f"- *Flushes*: {segments} log segments for {m.accepted:,} batches = "
        f"{segments / n:.4f} PUT-class a batch, at {rate:.1f} batches/s over {writers} "
        f"writers with `index_flush_max_age_ms` = {age_s * 1000:.0f} and `index_flush_rows` = "
        f"{s['ingest.index_flush_rows']}. A busy writer flushes about once per max age, so "
        f"segments a batch ≈ writers / (age x rate): {writers / (age_s * rate) if rate else 0:.4f} "
        f"here; it stays <= 0.01 from {writers / (age_s * 0.01):.0f} batches/s on "
        f"(<= 0.05 from {writers / (age_s * 0.05):.0f}/s). Below that, a longer max age keeps "
        "the share down (segments are never on the acknowledgement path).",
        f"- *Idle reconciler*: {idle['PUT']} PUT-class + {idle['GET']} GET-class in "
        f"{m.idle_seconds:.0f} s idle = {per_hour['PUT']:.0f} + {per_hour['GET']:.0f} an hour "
        f"(loop every {s['reconciler.loop_interval_s']} s: a log LIST, lease renewals, audit "
        f"bookkeeping): {per_hour['PUT'] / 3600:.3f} PUT-class a second, i.e. per batch "
        f"{per_hour['PUT'] / 3600 / 10:.4f} at 10 batches/s, "
        f"{per_hour['PUT'] / 3600 / 100:.5f} at 100/s.",
        f"- *Full audit*: {audit['PUT']} PUT-class + {audit['GET']} GET-class for a store of "
        f"{m.accepted:,} batches = {audit['PUT'] / n:.4f} + {audit['GET'] / n:.4f} a batch of "
        "history (LIST pages of accepted/ and raw-blobs/, one GET per catalog file, no GET "
        f"per known record). One audit every `max_audit_interval_s` ({interval_h:.0f} h) over "
        "D days of history adds D x that to every new batch: D = 1, 7, 30 → "
        + ", ".join(f"{d * audit['PUT'] / n:.3f}" for d in (1, 7, 30))
        + " PUT-class a batch (per hour of history: one catalog GET once compacted, plus 2 "
        "LIST pages per 1,000 batches); an S3 Inventory source replaces the LIST pages.",
        "",
    ]
    return lines


def _history(m: Measured, summary: dict[str, Any]) -> list[str]:
    lines = [
        "Rollup cost against history (one `lm-rollup run` including the new batches):",
        "",
        "| history | batches | hours | new batches | PUT-class | GET-class | total | s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in m.history:
        c = run.classes
        lines.append(
            f"| {run.factor}x | {run.history_batches:,} | {run.history_hours} | "
            f"{run.new_batches} | {c['PUT']} | {c['GET']} | {c['PUT'] + c['GET']} | "
            f"{run.seconds:.1f} |"
        )
    summary["history"] = [
        {
            "factor": r.factor,
            "classes": r.classes,
            "detail": {f"{o} {a}": v for (o, a), v in r.tally.items()},
        }
        for r in m.history
    ]
    if len(m.history) == 2:
        one, ten = (r.classes for r in m.history)
        ok = ten["PUT"] + ten["GET"] <= one["PUT"] + one["GET"]
        lines.append("")
        lines.append(f"10x history makes no more requests than 1x: {_verdict(ok)}")
        for run in m.history:
            lines.append(f"- {run.factor}x: {describe(run.tally)}")
    lines.append("")
    return lines


def _environment(m: Measured) -> list[str]:
    settings = ", ".join(f"`{k}` = {v}" for k, v in m.settings.items())
    loads = "; ".join(f"{k} {v[0]:.2f}/{v[1]:.2f}/{v[2]:.2f}" for k, v in m.loadavg.items())
    return [
        f"Settings (the defaults): {settings}.",
        f"Load average (1/5/15 min): {loads}. Machine: {platform.node()}, "
        f"{platform.machine()}, Python {platform.python_version()}.",
        "",
    ]
