"""``lm-rollup history``: one line per committed version, newest first.

Walks the snapshot chain from the pointer (`rollup.table.commit.walk_snapshots`); versions
removed by vacuum end the walk. For each version: when and by which owner epoch it was
committed, and what it changed: rows and files added per table (files whose
``added_version`` is this version), files removed (its ``removed_files``), batches and
records newly included in the ledger (the difference from the previous version, unknown
when that one was vacuumed), and the deletes it committed: who asked, why, and what
they match (`rollup.table.tombstones`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rollup.table.commit import LoadedSnapshot, walk_snapshots
from rollup.table.manifest import Snapshot
from store.base import ObjectStore


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """What one version is and what its commit did."""

    version: int
    created_at: str
    owner_epoch: int
    commit_id: str
    manifest_key: str
    rows_added: dict[str, int]
    files_added: int
    files_removed: int
    batches_added: int | None
    records_added: int | None
    deletes: tuple[str, ...] = ()

    def as_row(self) -> dict[str, object]:
        """A flat row for table/CSV/JSON output."""
        return {
            "version": self.version,
            "created_at": self.created_at,
            "owner_epoch": self.owner_epoch,
            "rows_added": sum(self.rows_added.values()),
            **{f"rows_added_{table}": rows for table, rows in sorted(self.rows_added.items())},
            "files_added": self.files_added,
            "files_removed": self.files_removed,
            "batches_added": self.batches_added,
            "records_added": self.records_added,
            "deletes": "; ".join(self.deletes),
            "commit_id": self.commit_id,
        }


def describe_version(snapshot: Snapshot, previous: Snapshot | None) -> VersionInfo:
    """Pure: ``snapshot``'s history entry; ``previous`` is version - 1 when known."""
    rows_added: dict[str, int] = {}
    files_added = 0
    for table, state in snapshot.tables.items():
        added = [f for f in state.data_files if f.added_version == snapshot.version]
        rows_added[table] = sum(f.row_count for f in added)
        files_added += len(added)
    batches: int | None = None
    records: int | None = None
    if previous is not None or snapshot.version == 1:
        before = previous.ledger_hours if previous is not None else {}
        batches = sum(h.batches for h in snapshot.ledger_hours.values()) - sum(
            h.batches for h in before.values()
        )
        records = sum(h.records for h in snapshot.ledger_hours.values()) - sum(
            h.records for h in before.values()
        )
    return VersionInfo(
        version=snapshot.version,
        created_at=snapshot.created_at,
        owner_epoch=snapshot.owner_epoch,
        commit_id=snapshot.commit_id,
        manifest_key=snapshot.manifest_key,
        rows_added=rows_added,
        files_added=files_added,
        files_removed=len(snapshot.removed_files),
        batches_added=batches,
        records_added=records,
        deletes=tuple(
            f"{t.id} by {t.requested_by} ({t.reason}): {t.describe()}"
            for t in snapshot.tombstones
            if t.added_version == snapshot.version
        ),
    )


async def history(
    store: ObjectStore, *, limit: int | None = None, start: LoadedSnapshot | None = None
) -> list[VersionInfo]:
    """Up to ``limit`` versions from the latest (or ``start``) back, newest first; empty
    before the first commit. Store errors and `RollupManifestError` propagate."""
    chain: list[Snapshot] = []
    async for snapshot in walk_snapshots(store, start):
        chain.append(snapshot)
        # One extra snapshot tells what the last listed version added.
        if limit is not None and len(chain) > limit:
            break
    shown = chain if limit is None else chain[:limit]
    return [
        describe_version(snapshot, chain[i + 1] if i + 1 < len(chain) else None)
        for i, snapshot in enumerate(shown)
    ]
