"""The rollup's progress as the reconciler daemon sees it in the store: its lag gauges.

The rollup is a batch job (a timer or a CronJob, PROTOCOL §4) that serves no metrics: a
process that ends after each run cannot be scraped, and what matters about it — how far
its committed tables are behind acceptance — is a fact of the store, not of a run. So the
always-running reconciler reads it there: the rollup pointer and the snapshot it names
(`rollup.table.commit`), and exports

- ``lm_reconciler_rollup_committed_timestamp_seconds``: the latest snapshot's
  ``created_at`` (``time() - it``: how long ago the rollup last committed);
- ``lm_reconciler_rollup_included_through_timestamp_seconds``: the end of the newest
  accepted hour the snapshot's ledger includes (``time() - it``: the rollup's lag behind
  acceptance, at least the time since that hour ended);
- ``lm_reconciler_rollup_snapshot_version``.

Cost: at most one conditional GET of the pointer every `REFRESH_INTERVAL_S` (a 304 where
the store has conditional GETs, `store.base.get_if_changed`), and one GET of the snapshot
manifest when the pointer changed: requests grow with the rollup's commits, never with
history. A failed read is logged and leaves the gauges as they were (their age then shows
it): `refresh` never raises, so it cannot end a pass.
"""

from __future__ import annotations

import structlog

from protocol import keys
from protocol.records import RecordError, RollupPointer
from reconciler.context import ReconcilerContext
from reconciler.metrics import ReconcilerMetrics
from rollup.table.commit import read_snapshot
from rollup.table.manifest import RollupManifestError, Snapshot, parse_created_at
from store.base import get_if_changed
from store.errors import NotFound, StoreError

log = structlog.get_logger(__name__)
REFRESH_INTERVAL_S = 60.0
"""The gauges' resolution: a rollup runs every several minutes at the most."""


def included_through_ns(snapshot: Snapshot) -> int:
    """End of the newest accepted hour with batches in ``snapshot``'s ledger (0: none)."""
    hours = [hour for hour, totals in snapshot.ledger_hours.items() if totals.batches > 0]
    return keys.UtcHour.parse_iso(max(hours)).next().start_ns if hours else 0


class RollupProgress:
    """Keeps the rollup gauges of ``metrics`` fresh (module docstring)."""

    def __init__(self, metrics: ReconcilerMetrics, *, interval_s: float = REFRESH_INTERVAL_S):
        self._metrics = metrics
        self._interval_s = interval_s
        self._checked_at: float | None = None
        self._etag: str | None = None

    async def refresh(self, ctx: ReconcilerContext) -> None:
        """Read the pointer if `REFRESH_INTERVAL_S` passed, and the snapshot if it moved."""
        now = ctx.clock.monotonic()
        if self._checked_at is not None and now - self._checked_at < self._interval_s:
            return
        self._checked_at = now
        try:
            changed = await get_if_changed(ctx.store, keys.ROLLUP_POINTER_KEY, self._etag)
            if changed is None:
                return
            body, etag = changed
            pointer = RollupPointer.from_json(body)
            snapshot = await read_snapshot(ctx.store, pointer.manifest_key)
        except NotFound:
            return  # no commit yet (or one being vacuumed away): nothing to show
        except (StoreError, RecordError, RollupManifestError) as exc:
            log.warning("rollup_progress_unreadable", error=str(exc))
            return
        self._observe(snapshot)
        self._etag = etag

    def _observe(self, snapshot: Snapshot) -> None:
        try:
            committed = parse_created_at(snapshot.created_at).timestamp()
        except ValueError:
            committed = 0.0  # a snapshot reader already refuses such a manifest
        self._metrics.rollup_committed.set(committed)
        self._metrics.rollup_included_through.set(included_through_ns(snapshot) / 1e9)
        self._metrics.rollup_version.set(snapshot.version)
