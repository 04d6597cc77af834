"""Raw retention's retired hours in the audit's joins (`reconciler.gc.raw_retention`).

An accepted row of an hour raw retention retired keeps no blob alive (a blob only such
rows reference is an orphan flagged ``raw_retention``, and is never missing), but only
while the hour *holds*: its catalog's unique accepted batches equal the rollup ledger's
(`Retired.holds`) and none of its files was moved aside. Otherwise its rows count as
references and a ``raw-retention-mismatch`` problem says why (resolved once it holds).
One small query over the pinned copies (`AuditJoins.accepted_batches`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from protocol import keys
from reconciler.audit.audit_inputs import CatalogCopy
from reconciler.gc.raw_retention import Retired
from reconciler.problems import ProblemBook


class RetiredJoins(Protocol):
    """What `settle_retired` needs of an engine's joins (`AuditJoins`, `SparkAuditJoins`)."""

    def accepted_batches(self, hours: Sequence[int]) -> dict[int, int]: ...

    def set_retired(self, hours: frozenset[int]) -> None: ...


async def settle_retired(
    joins: RetiredJoins,
    copies: Iterable[CatalogCopy],
    unreadable: Iterable[str],
    retired: Retired,
    problems: ProblemBook,
) -> int:
    """Mark the retired hours that hold in ``joins`` (`AuditJoins.set_retired`), record or
    resolve ``raw-retention-mismatch`` per covered hour; returns the retired batches."""
    aside_hours = [keys.parse_index_catalog_key(name)[0] for name in unreadable]
    hours = {
        hour.start_ns: hour
        for hour in [*(c.hour for c in copies), *aside_hours]
        if retired.covers(hour)
    }
    aside = {hour.start_ns for hour in aside_hours}
    counts = joins.accepted_batches(sorted(hours))
    holding: set[int] = set()
    retired_batches = 0
    for start_ns, hour in sorted(hours.items()):
        batches = counts[start_ns]
        subject = keys.index_catalog_hour_prefix(hour)
        moved_aside = start_ns in aside
        if not moved_aside and retired.holds(hour, batches):
            holding.add(start_ns)
            retired_batches += batches
            await problems.resolve("raw-retention-mismatch", subject)
            continue
        ledger = retired.ledger.get(hour.iso)
        await problems.record(
            "raw-retention-mismatch",
            subject,
            f"accepted hour {hour.iso} is retired, but its catalog holds {batches} "
            f"accepted batches and the rollup ledger {ledger.batches if ledger else 0}"
            f"{' (a catalog file was moved aside)' if moved_aside else ''}: its raw "
            f"blobs are kept until they agree",
        )
    joins.set_retired(frozenset(holding))
    return retired_batches
