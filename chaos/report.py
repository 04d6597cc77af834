"""The report of a chaos run: a JSON document and a table for people.

`RunReport` gathers what was done (scenario, seed, planned schedule, events), what was
injected (the proxy's faults per kind, its schedule digest), what the agents sent and
were told, what the store holds, and every invariant check per audit round. ``ok`` and
the exit code follow the checks: any failed check is a violation (exit 1); skipped
checks are listed as skipped, never counted as passed. The GC coverage (planted orphans
past the horizon that the GC deleted, as of the last round) is a figure, not a check.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.auditor import CheckResult


@dataclass
class AuditRound:
    index: int
    elapsed_s: float
    checks: list[CheckResult]
    store: dict[str, int]
    convergence: dict[str, Any] = field(default_factory=dict)

    @property
    def violations(self) -> int:
        return sum(c.violation_count for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.index,
            "elapsed_s": round(self.elapsed_s, 1),
            "violations": self.violations,
            "checks": {c.name: c.to_dict() for c in self.checks},
            "store": self.store,
            "convergence": self.convergence,
        }


@dataclass
class RunReport:
    scenario: str
    seed: int
    duration_s: float
    work_dir: str
    plan: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    faults: dict[str, Any] = field(default_factory=dict)
    batches: dict[str, Any] = field(default_factory=dict)
    rounds: list[AuditRound] = field(default_factory=list)
    rollup: str = ""
    bundles: bool = False
    """The run turned bundles on (``--bundles``: enable-bundles before the collectors)."""
    elapsed_s: float = 0.0
    error: str | None = None
    driver_errors: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return sum(r.violations for r in self.rounds)

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and not self.driver_errors
            and self.violations == 0
            and bool(self.rounds)
        )

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    @property
    def gc_coverage(self) -> tuple[int, int] | None:
        """``(deleted, planted)`` orphans past the horizon at the last audit; None when
        no scenario planted any."""
        if not self.rounds:
            return None
        last = self.rounds[-1].store
        planted = last.get("planted_orphans_past_horizon", 0)
        return (last.get("planted_orphans_deleted", 0), planted) if planted else None

    def check_totals(self) -> dict[str, Counter[str]]:
        """Per check name: how many rounds passed, failed, were skipped."""
        totals: dict[str, Counter[str]] = {}
        for audit_round in self.rounds:
            for check in audit_round.checks:
                totals.setdefault(check.name, Counter())[check.status] += 1
        return totals

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "duration_s": self.duration_s,
            "elapsed_s": round(self.elapsed_s, 1),
            "ok": self.ok,
            "exit_code": self.exit_code,
            "violations": self.violations,
            "gc_coverage": self.gc_coverage,
            "error": self.error,
            "driver_errors": self.driver_errors,
            "rollup": self.rollup,
            "bundles": self.bundles,
            "faults": self.faults,
            "batches": self.batches,
            "rounds": [r.to_dict() for r in self.rounds],
            "plan": self.plan,
            "events": self.events,
            "work_dir": self.work_dir,
        }

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1, default=str) + "\n")

    def render(self) -> str:
        """The human summary: faults per kind, batches, checks, violations."""
        lines = [
            f"lm-chaos {self.scenario}  seed={self.seed}  duration={self.duration_s:g}s  "
            f"elapsed={self.elapsed_s:.0f}s  rounds={len(self.rounds)}"
            + ("  bundles=on" if self.bundles else ""),
            "",
            "faults injected (by kind)",
        ]
        injected = self.faults.get("injected", {})
        rows = [(kind, str(count)) for kind, count in sorted(injected.items())] or [("none", "0")]
        rows.append(
            ("requests through the proxy", str(sum(self.faults.get("requests", {}).values())))
        )
        for name, value in self.faults.get("events", {}).items():
            rows.append((name, str(value)))
        lines += _table(rows)
        lines += ["", "batches"]
        lines += _table(
            [(k, str(v)) for k, v in self.batches.items() if not isinstance(v, (dict, list))]
        )
        lines += ["", "invariants (rounds passed / failed / skipped)"]
        rows = []
        for name, counts in self.check_totals().items():
            violations = sum(
                c.violation_count for r in self.rounds for c in r.checks if c.name == name
            )
            skip = next(
                (
                    c.detail
                    for r in self.rounds
                    for c in r.checks
                    if c.name == name and c.status == "skipped"
                ),
                "",
            )
            text = f"{counts['passed']} / {counts['failed']} / {counts['skipped']}"
            if violations:
                text += f"   {violations} violation(s)"
            if skip and not counts["passed"] and not counts["failed"]:
                text += f"   ({skip})"
            rows.append((name, text))
        lines += _table(rows)
        if (coverage := self.gc_coverage) is not None:
            deleted, planted = coverage
            lines += [
                "",
                f"GC coverage: {deleted} of {planted} planted orphans past the horizon "
                f"deleted ({100 * deleted / planted:.0f}%)",
            ]
        for audit_round in self.rounds:
            for check in audit_round.checks:
                for example in check.violations[:5]:
                    lines.append(f"VIOLATION round {audit_round.index} {check.name}: {example}")
        lines += [f"DRIVER ERROR: {text}" for text in self.driver_errors]
        if self.error:
            lines.append(f"ERROR: {self.error}")
        lines += ["", f"violations: {self.violations}   result: {'OK' if self.ok else 'FAILED'}"]
        return "\n".join(lines)


def _table(rows: list[tuple[str, str]]) -> list[str]:
    width = max((len(name) for name, _ in rows), default=0)
    return [f"  {name:<{width}}  {value}" for name, value in rows]
