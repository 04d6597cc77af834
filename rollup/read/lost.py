"""Which batches the latest rollup snapshot records as lost (``ledger.lost``, PROTOCOL §4.1):
read by the reconciler's audit, which does not report their blobs as missing again."""

from __future__ import annotations

import structlog

from rollup.table.commit import load_latest
from rollup.table.manifest import RollupManifestError
from store.base import ObjectStore
from store.errors import StoreError

log = structlog.get_logger(__name__)


async def acknowledged_shas(store: ObjectStore) -> set[str]:
    """The ``frame_sha256`` of every batch the latest snapshot records as lost: an audit
    does not report their blobs as missing again. Empty when there is no readable
    snapshot (the audit then reports what it finds, as before)."""
    try:
        latest = await load_latest(store)
    except (StoreError, RollupManifestError) as exc:
        log.warning("rollup_lost_unreadable", error=str(exc))
        return set()
    return {b.frame_sha256 for b in latest.snapshot.ledger_lost} if latest is not None else set()
