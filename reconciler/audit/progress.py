"""How a full audit reports and saves its progress (the ``progress`` callback of
`reconciler.audit.run.run_full_audit`, relayed by the audit worker, shown by
``lm-reconciler audit``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]  # no stubs installed

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


class ProgressBar:
    """``lm-reconciler audit``'s tqdm counter on standard error, only when it is a terminal."""

    def __init__(self) -> None:
        self._bar: Any = None

    def update(self, progress: AuditProgress) -> None:
        if not sys.stderr.isatty():
            return
        if self._bar is None:
            verb = "resuming audit" if progress.resumed else "auditing"
            self._bar = tqdm(desc=f"{verb} {progress.audit_id}", unit=" records", file=sys.stderr)
        self._bar.n = progress.manifests_seen + progress.quarantines_seen
        ranges = f"{progress.groups_done}/{progress.ranges_total}" if progress.ranges_total else "-"
        self._bar.set_postfix(
            ranges=ranges, cataloged=progress.repaired, problems=progress.problems, refresh=False
        )
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
