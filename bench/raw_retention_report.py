"""The report of `bench.raw_retention`: requests and dollars per retired batch by phase
and S3 class, and the GC's wall time by ``gc.concurrency`` as ratios to the first."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.counting import PRICE_PER_1K, Tally, by_class, describe, dollars
from protocol.clock import ManualClock
from reconciler.context import ReconcilerContext
from store.counting import CountingStore


@dataclass
class Variant:
    """One concurrency's store, clock, reconciler context and measurements."""

    concurrency: int
    store: CountingStore
    clock: ManualClock
    ctx: ReconcilerContext | None = None
    wire: Counter[str] | None = None
    phases: dict[str, Tally] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    others_cores: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, dict[str, float]] = field(default_factory=dict)

    def context(self) -> ReconcilerContext:
        assert self.ctx is not None, "seed first"
        return self.ctx


GC_PHASES = ("GC: retiring", "GC: marking", "GC: deleting")
AUDIT_PHASES = ("audit 1", "audit 2", "audit 3")
TIMED = ("GC: marking", "GC: deleting")


def _sum(tallies: Sequence[Tally]) -> Tally:
    total: Tally = Counter()
    for tally in tallies:
        total.update(tally)
    return total


def _row(name: str, tally: Tally, batches: int) -> str:
    classes = by_class(tally)
    deletes = sum(n for (op, _area), n in tally.items() if op == "delete")
    per_million = dollars(classes["PUT"], classes["GET"]) / batches * 1e6
    return (
        f"| {name} | {classes['PUT'] / batches:.3f} | {classes['GET'] / batches:.3f} | "
        f"{deletes / batches:.3f} | {per_million:.2f} |"
    )


def _per_batch_ops(tally: Tally, batches: int) -> str:
    """``op area: n/batch`` for the entries that scale with the batches (>= 0.5 each)."""
    shown = [(k, n) for k, n in tally.most_common() if n / batches >= 0.5]
    return ", ".join(f"{op} {area}: {n / batches:.2f}" for (op, area), n in shown) or "-"


def cost_section(variant: Variant, batches: int) -> list[str]:
    p = variant.phases
    lines = [
        f"Requests per retired batch (gc.concurrency = {variant.concurrency}; {batches:,} "
        f"batches; PUT-class = PUT/COPY/POST/LIST at ${PRICE_PER_1K['PUT']}/1k, GET-class = "
        f"GET/HEAD/DELETE at ${PRICE_PER_1K['GET']}/1k, as `bench.counting`; DELETE is free "
        "on S3, so its column is already in GET-class and overstates):",
        "",
        "| phase | PUT-class | GET-class | of which DELETE | $ per million batches |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in (
        "seed: acceptance",
        "seed: audit (catalogs)",
        "seed: catalog compaction",
        "seed: rollup commit",
    ):
        lines.append(_row(f"({name})", p[name], batches))
    for audit, gc in zip(AUDIT_PHASES, GC_PHASES, strict=True):  # in the order they ran
        lines += [_row(audit, p[audit], batches), _row(gc, p[gc], batches)]
    gc_total = _sum([p[n] for n in GC_PHASES])
    audits = _sum([p[n] for n in AUDIT_PHASES])
    verification = Counter({k: n for k, n in audits.items() if k == ("get", "raw-blobs")})
    lines += [
        _row("**GC runs (retiring + marking + deleting)**", gc_total, batches),
        _row("audits 1-3", audits, batches),
        _row("audits 1-3 without blob verification", audits - verification, batches),
        _row("**all six steps**", gc_total + audits, batches),
        _row("(audit 4, the check)", p["audit 4 (check)"], batches),
        "",
        "Per batch, the entries that scale with the batches (op area: requests/batch):",
        "",
    ]
    for name in (*GC_PHASES, *AUDIT_PHASES):
        lines.append(f"- {name}: {_per_batch_ops(p[name], batches)}")
    lines += ["", "Everything, as counts:", ""]
    for name in (*GC_PHASES, *AUDIT_PHASES):
        lines.append(f"- {name}: {describe(p[name])}")
    return lines


def timing_section(variants: Sequence[Variant], batches: int) -> list[str]:
    base = variants[0]
    lines = [
        f"GC wall time, {batches:,} blobs, ratios to gc.concurrency = {base.concurrency} "
        "(same N, same run; each step ran for every concurrency before the next step):",
        "",
        "| gc.concurrency | marking s | marks/s | x | deleting s | deletions/s | x "
        "| deleting: driver / MiniStack / proxy / others (cores) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for v in variants:
        mark_s, delete_s = (v.seconds[n] for n in TIMED)
        cpu = v.cpu_s[TIMED[1]]
        cores = " / ".join(
            f"{cpu.get(role, 0.0) / delete_s:.2f}"
            for role in ("driver", "ministack", "proxy", "others")
        )
        lines.append(
            f"| {v.concurrency} | {mark_s:.2f} | {batches / mark_s:.0f} | "
            f"{base.seconds[TIMED[0]] / mark_s:.2f} | {delete_s:.2f} | "
            f"{batches / delete_s:.0f} | {base.seconds[TIMED[1]] / delete_s:.2f} | {cores} |"
        )
    same = all(v.phases[n] == base.phases[n] for v in variants for n in GC_PHASES)
    lines += [
        "",
        "GC requests identical across the concurrencies: "
        + ("yes" if same else "NO (see the counts per variant)"),
    ]
    if not same:
        for v in variants:
            lines.append(
                f"- {v.concurrency}: "
                + "; ".join(f"{n}: {describe(v.phases[n])}" for n in GC_PHASES)
            )
    return lines


def wire_section(variants: Sequence[Variant]) -> list[str]:
    """The wrapper's count against the S3 client's own (MiniStack only)."""
    lines = []
    for v in variants:
        if v.wire is None:
            continue
        counted = sum(v.store.tally.values())
        signed = sum(
            n for (op, area), n in v.store.tally.items() if (op, area) == ("delete", "raw-blobs")
        )
        lines.append(
            f"- gc.concurrency {v.concurrency}: wrapper {counted:,} requests; S3 client "
            f"{sum(v.wire.values()):,} + {signed:,} signed DELETEs sent with aiohttp"
        )
    return ["Request count cross-check (whole run):", "", *lines] if lines else []


def render(
    variants: Sequence[Variant],
    *,
    args: argparse.Namespace,
    raw_days: float,
    loads: Sequence[tuple[float, float, float]],
    uptime: Sequence[str],
) -> str:
    default = next((v for v in variants if v.concurrency == 8), variants[-1])
    settings = default.context().settings
    lines = [
        f"`python -m bench.raw_retention --batches {args.batches} --hours {args.hours} "
        f"--store {args.store} --latency-ms {args.latency_ms:g} "
        f"--concurrency {' '.join(map(str, args.concurrency))}`; "
        f"settings: defaults, retention.raw_days = {raw_days:g}, gc.retry_horizon_s = "
        f"{settings.gc.retry_horizon_s:g}, gc.mark_grace_s = {settings.gc.mark_grace_s:g}, "
        f"reconciler.concurrency = {settings.reconciler.concurrency}, "
        f"reconciler.verify_rate_per_s = {settings.reconciler.verify_rate_per_s:g}.",
        "",
        *cost_section(default, args.batches),
        "",
        *timing_section(variants, args.batches),
        "",
        *wire_section(variants),
        "",
        f"Load average at start / end: {loads[0]} / {loads[-1]}.",
        f"uptime at start: `{uptime[0]}`; at end: `{uptime[-1]}`.",
    ]
    return "\n".join(lines)
