"""How a full audit reports and saves its progress (the ``progress`` callback of
`reconciler.audit.run.run_full_audit`, relayed by the audit worker, shown by
``lm-reconciler audit``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

PROGRESS_INTERVAL_S = 2.0
PROGRESS_RECORDS = 1000
"""Progress is saved every `PROGRESS_INTERVAL_S` or once this many records were cataloged
since the last save, whichever comes first: a crash re-reads at most that much."""


@dataclass(frozen=True, slots=True)
class AuditProgress:
    """Handed to the ``progress`` callback after every chunk."""

    audit_id: str
    resumed: bool
    manifests_seen: int
    quarantines_seen: int
    groups_done: int
    """Listing ranges done (`reconciler.audit.ranges`; the name predates them)."""
    repaired: int
    """Records this audit cataloged (the name predates the index)."""
    problems: int
    blobs_verified: int = 0
    ranges_total: int = 0
    """The listing's ranges; ``groups_done`` counts those listed."""


ProgressCallback = Callable[[AuditProgress], None]
