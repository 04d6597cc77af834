"""The end-of-run summary of an agent run, and the exit-code rule of ``lm-agent send``.

Exit codes (`RunSummary.exit_code`):
- ``0`` every frame reached the outcome its kind expects: originals/recovered frames
  delivered (200), injected duplicates answered "200 duplicate", injected conflicts 409;
- ``1`` something unexpected happened — a frame was parked as poison (400/413/415), a
  frame that was not an injected conflict was parked as a conflict (409), an injected
  conflict was accepted, or an injected duplicate was answered as new;
- ``3`` nothing unexpected, but some frames are still pending (retries exhausted in
  every round) or were never sent because the spool stayed full; re-run to deliver them.
(``2`` is left to usage and input errors, as argparse uses it.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.truth import BatchKind, TruthRecord
from agent.uploader import BatchResult, Outcome


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    """The final result of one spooled frame: its last round's `BatchResult`, plus the
    attempts and rounds it took in all."""

    entry_name: str
    truth: TruthRecord
    result: BatchResult
    attempts: int
    rounds: int

    @property
    def kind(self) -> BatchKind:
        return self.truth.kind

    @property
    def outcome(self) -> Outcome:
        return self.result.outcome


@dataclass(frozen=True, slots=True)
class RunSummary:
    batches: int
    accepted: int
    duplicates: int
    conflicts: int
    poison: int
    pending: int
    not_sent: int
    retries: int
    recovered: int
    points_accepted: int
    duplicates_injected: int
    conflicts_injected: int
    ack_p50_ms: float | None
    ack_p99_ms: float | None
    elapsed_s: float
    unexpected: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.unexpected:
            return 1
        if self.pending or self.not_sent:
            return 3
        return 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exit_code": self.exit_code}

    def render_table(self) -> str:
        """A small two-column table for people."""
        rows = [
            ("batches", str(self.batches)),
            ("accepted (new)", str(self.accepted)),
            ("duplicates", f"{self.duplicates} ({self.duplicates_injected} injected)"),
            ("conflicts (parked)", f"{self.conflicts} ({self.conflicts_injected} injected)"),
            ("poison (parked)", str(self.poison)),
            ("still pending", str(self.pending)),
            ("not sent (spool full)", str(self.not_sent)),
            ("retries", str(self.retries)),
            ("recovered from spool", str(self.recovered)),
            ("points accepted (new)", str(self.points_accepted)),
            ("ack latency p50 (ms)", _ms(self.ack_p50_ms)),
            ("ack latency p99 (ms)", _ms(self.ack_p99_ms)),
            ("elapsed (s)", f"{self.elapsed_s:.2f}"),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {value}" for name, value in rows]
        lines += [f"UNEXPECTED: {problem}" for problem in self.unexpected]
        return "\n".join(lines)


def summarize(
    records: Sequence[DeliveryRecord], *, elapsed_s: float, not_sent: int = 0
) -> RunSummary:
    """Count outcomes and check each against what its kind expects (module docstring)."""
    count = {outcome: 0 for outcome in Outcome}
    unexpected: list[str] = []
    latencies: list[float] = []
    points = 0
    for record in records:
        count[record.outcome] += 1
        if record.outcome is Outcome.ACCEPTED:  # newly accepted: duplicates add no points
            points += record.truth.point_count
        if record.outcome.delivered and record.result.ack_latency_s is not None:
            latencies.append(record.result.ack_latency_s)
        problem = _unexpected(record)
        if problem:
            unexpected.append(problem)
    latencies.sort()
    return RunSummary(
        batches=len(records),
        accepted=count[Outcome.ACCEPTED],
        duplicates=count[Outcome.DUPLICATE],
        conflicts=count[Outcome.CONFLICT],
        poison=count[Outcome.POISON],
        pending=count[Outcome.DEFERRED],
        not_sent=not_sent,
        retries=sum(r.attempts - 1 for r in records),
        recovered=sum(1 for r in records if r.kind is BatchKind.RECOVERED),
        points_accepted=points,
        duplicates_injected=sum(1 for r in records if r.kind is BatchKind.DUPLICATE),
        conflicts_injected=sum(1 for r in records if r.kind is BatchKind.CONFLICT),
        ack_p50_ms=_percentile_ms(latencies, 50),
        ack_p99_ms=_percentile_ms(latencies, 99),
        elapsed_s=elapsed_s,
        unexpected=unexpected,
    )


def _unexpected(record: DeliveryRecord) -> str | None:
    outcome, kind = record.outcome, record.kind
    where = f"{kind.value} {record.truth.identity} (spool entry {record.entry_name})"
    if outcome is Outcome.POISON:
        return f"{where} parked as poison: HTTP {record.result.status} {record.result.response}"
    if outcome is Outcome.CONFLICT and kind is not BatchKind.CONFLICT:
        return f"{where} parked as an identity conflict"
    if kind is BatchKind.CONFLICT and outcome.delivered:
        return f"{where} was accepted although its identity was already taken"
    if kind is BatchKind.DUPLICATE and outcome is Outcome.ACCEPTED:
        return f"{where} was answered as new although it was delivered before"
    return None


def _percentile_ms(sorted_s: list[float], percent: int) -> float | None:
    """Nearest-rank percentile, in milliseconds."""
    if not sorted_s:
        return None
    rank = max(1, math.ceil(percent / 100 * len(sorted_s)))
    return sorted_s[rank - 1] * 1000.0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
