"""The report of `bench.gc`: requests per GC run and per candidate, by operation and S3
class, the audits and GC log files the runs made, and the end-state checks; and the
result records the benchmark fills (`GcRun`, `Result`), here so that the report need not
import the benchmark."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.counting import Tally, by_class
from bench.gc_seed import Seeded
from config import Settings
from reconciler.gc.policy import GcOutcome

TARGET_PER_CANDIDATE = 16
OPS = ("GET", "HEAD", "LIST", "PUT", "DELETE")


@dataclass
class GcRun:
    """One GC run of the daemon, as counted."""

    index: int
    tally: Tally
    seconds: float
    outcome: GcOutcome | None
    error: str | None
    audit_running_at_start: bool
    audits_before: int
    audits_after: int
    orphans_left: int
    loadavg: tuple[float, float, float]
    bytes_read: int = 0


@dataclass
class Result:
    args: argparse.Namespace
    settings: Settings
    seeded: Seeded
    runs: list[GcRun] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    audits: list[str] = field(default_factory=list)
    gc_log_files: list[str] = field(default_factory=list)
    uptime: list[str] = field(default_factory=list)
    seed_seconds: float = 0.0
    total_seconds: float = 0.0
    shift_s: float = 0.0


def op_name(op: str) -> str:
    """``put_if_match`` → ``PUT`` and so on (the HTTP operation)."""
    return "PUT" if op.startswith("put") else op.upper()


def by_op(tally: Tally) -> Counter[str]:
    ops: Counter[str] = Counter()
    for (op, _area), n in tally.items():
        ops[op_name(op)] += n
    return ops


def total(runs: Sequence[GcRun]) -> Tally:
    summed: Tally = Counter()
    for run in runs:
        summed.update(run.tally)
    return summed


def _run_row(run: GcRun) -> str:
    record = run.outcome.record if run.outcome else None
    ops, classes = by_op(run.tally), by_class(run.tally)
    what = (
        f"{record.candidates} | {record.marked} | {record.deleted}"
        if record
        else f"failed: {run.error} | - | -"
    )
    return (
        f"| {run.index} | {what} | {sum(run.tally.values()):,} | "
        + " | ".join(f"{ops[op]:,}" for op in OPS)
        + f" | {classes['PUT']:,} | {classes['GET']:,} | {run.seconds:.1f} | "
        f"{'yes' if run.audit_running_at_start else 'no'} | "
        f"{run.audits_before} → {run.audits_after} | {run.orphans_left} | "
        f"{run.loadavg[0]:.2f} |"
    )


def _per_candidate(tally: Tally, candidates: int) -> list[str]:
    lines = [
        "| operation | key area | per candidate |",
        "|---|---|---:|",
    ]
    rest = 0
    for (op, area), n in sorted(tally.items(), key=lambda item: (-item[1], item[0])):
        if n / candidates >= 0.05:
            lines.append(f"| {op} | {area} | {n / candidates:.3f} |")
        else:
            rest += n
    lines.append(f"| (everything else: fixed per run) | | {rest / candidates:.3f} |")
    return lines


def _bundles(result: Result, working: Sequence[GcRun], requests: int) -> list[str]:
    """Per candidate bundle (issue 33): requests and bytes read by the GC runs."""
    seeded = result.seeded
    bundles = len(seeded.orphan_bundles)
    if not bundles:
        return []
    read = sum(run.bytes_read for run in working)
    mean = seeded.bundle_bytes / bundles
    share = "" if not seeded.orphans else " (frame-blob orphans in the same runs included)"
    return [
        f"**Per candidate bundle**{share}: {requests / bundles:.1f} requests "
        f"({requests / bundles / seeded.bundle_frames:.2f} per bundled frame) and "
        f"{read / bundles / 2**20:.2f} MiB read (the bundle is {mean / 2**20:.2f} MiB: "
        f"{read / seeded.bundle_bytes:.2f}x its bytes); {read / 2**20:,.0f} MiB read in all "
        f"for {seeded.bundle_bytes / 2**20:,.0f} MiB of orphan bundles.",
        "",
    ]


def render(result: Result) -> str:
    args, runs, seeded = result.args, result.runs, result.seeded
    candidates = seeded.candidates
    last_deleting = max(
        (run.index for run in runs if run.outcome and run.outcome.deleted), default=0
    )
    working = [run for run in runs if run.index <= last_deleting]
    after = [run for run in runs if run.index > last_deleting]
    summed = total(working)
    requests = sum(summed.values())
    per_candidate = requests / candidates if candidates else 0.0
    classes, ops = by_class(summed), by_op(summed)
    gc = result.settings.gc
    lines = [
        f"## `bench.gc`: {candidates:,} orphans deleted by the daemon's schedule",
        "",
        f"Command: `.venv/bin/python -m bench.gc --orphans {args.orphans} --accepted "
        f"{args.accepted} --conflicts {args.conflicts} --twin-orphans {args.twin_orphans} "
        f"--long-agent-orphans {args.long_agent_orphans} --bundles {args.bundles} "
        f"--bundle-frames {args.bundle_frames} --bundle-frame-bytes {args.bundle_frame_bytes} "
        "--retry-horizon-s "
        f"{args.retry_horizon_s:g} --seed {args.seed}`",
        "",
        f"Seeded in {result.seed_seconds:.1f} s: {seeded.describe()}. Settings: the "
        f"defaults but gc.retry_horizon_s = {gc.retry_horizon_s:g}, gc.max_delete_fraction "
        f"= {gc.max_delete_fraction:g} (grace {gc.mark_grace_s:g} s, gc.concurrency "
        f"{gc.concurrency}, lease {result.settings.reconciler.lease_ttl_s:g} s, loop "
        f"{result.settings.reconciler.loop_interval_s:g} s). The daemon ran "
        f"{result.total_seconds:.1f} s; its clock ended {result.shift_s:g} s ahead of "
        "MiniStack's.",
        "",
        f"Load: `{result.uptime[0]}` at the start, `{result.uptime[-1]}` at the end.",
        "",
        "| GC run | candidates | marked | deleted | requests | "
        + " | ".join(OPS)
        + " | PUT-class | GET-class | s | audit running at start | audit records before → "
        "after | orphans left | load (1 min) |",
        "|---:|---:|---:|---:|---:|" + "---:|" * len(OPS) + "---:|---:|---:|---|---|---:|---:|",
        *(_run_row(run) for run in runs),
        "",
        f"**GC runs 1-{last_deleting} (marking through the last deletion): {requests:,} "
        f"requests for {candidates:,} candidates = {per_candidate:.2f} per candidate "
        f"(target <= {TARGET_PER_CANDIDATE}: "
        f"{'PASS' if per_candidate <= TARGET_PER_CANDIDATE else 'MISS'})**; "
        f"PUT-class {classes['PUT'] / candidates:.2f}, GET-class "
        f"{classes['GET'] / candidates:.2f} (DELETE counted GET-class); by operation "
        + ", ".join(f"{op} {ops[op] / candidates:.2f}" for op in OPS)
        + ".",
        "",
        *_per_candidate(summed, candidates),
        "",
        *_bundles(result, working, requests),
    ]
    if after:
        fixed = total(after)
        lines += [
            f"Run(s) after the last deletion (nothing left to do): {sum(fixed.values())} "
            "requests: "
            + ", ".join(f"{op} {area} {n}" for (op, area), n in fixed.most_common())
            + ".",
            "",
        ]
    lines += [
        f"Audit records at the end: {len(result.audits)} ({', '.join(result.audits)}). GC log "
        f"files: {len(result.gc_log_files)} ({', '.join(result.gc_log_files)}).",
        "",
        "Checks:",
        "",
        *(f"- {'PASS' if ok else 'FAIL'}: {what} ({detail})" for what, ok, detail in result.checks),
    ]
    return "\n".join(lines)
