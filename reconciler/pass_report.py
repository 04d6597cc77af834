"""What one reconciler pass did (`PassReport`, printed by ``lm-reconciler run --once``),
and `Stopped`: a one-shot command stopped before it got the lease."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.records import AuditRecord
from reconciler.compaction import CompactionResult
from reconciler.log_retention import LogRetentionResult
from reconciler.steady import SteadyResult


class Stopped(Exception):
    """`Reconciler.stop` was called before a one-shot command got the lease."""


@dataclass
class PassReport:
    """What one pass did. ``None`` for a stage that did not run (or failed in ``run()``)."""

    epoch: int
    steady: SteadyResult | None = None
    audit: AuditRecord | None = None
    compaction: CompactionResult | None = None
    log_retention: LogRetentionResult | None = None
    gc: Any = None

    @property
    def complete(self) -> bool:
        """The steady pass finished and any audit that ran completed."""
        steady_ok = self.steady is not None and self.steady.complete
        audit_ok = self.audit is None or self.audit.status == "completed"
        return steady_ok and audit_ok
