"""The one transition of the rollup dataset (PROTOCOL §4): `apply(base, changes)` builds
the next `Snapshot` and checks every invariant against the base — versions, owner epochs,
data files, the ledger (files, hours, late and lost batches), retention and tombstones —
raising `RollupInvariantError` naming the first violation before anything is written.
Pure; `rollup.table.commit` is its only writer."""

from __future__ import annotations

from collections.abc import Mapping

from protocol import keys
from rollup.table import schemas
from rollup.table.data_file import DataFile
from rollup.table.ledger_retracted import next_retracted
from rollup.table.manifest import (
    COMMIT_ID_PATTERN,
    Changes,
    Snapshot,
    TableState,
    parse_created_at,
)
from rollup.table.manifest_errors import RollupInvariantError
from rollup.table.manifest_ledger import (
    EMPTY_LEDGER_HOUR,
    LedgerHour,
    LostBatch,
    check_ledger_hour,
    ledger_file_hour,
    lost_totals,
    no_duplicates,
)
from rollup.table.tombstones import Tombstone, retention_applied


def apply(
    base: Snapshot | None,
    changes: Changes,
    *,
    version: int,
    commit_id: str,
    owner_epoch: int,
    created_at: str,
    manifest_key_of_base: str | None,
) -> Snapshot:
    """The snapshot that results from applying ``changes`` to ``base`` (None: empty dataset).

    Pure. Every invariant is checked against the base; the first violation raises
    `RollupInvariantError` naming it. The new snapshot's ``removed_files`` are the removed
    paths; its tombstones are the base's plus the added ones.
    """
    _check_header(base, version, commit_id, owner_epoch, created_at, manifest_key_of_base)
    base_tables: Mapping[str, TableState] = base.tables if base is not None else {}
    live = {f.path: f for state in base_tables.values() for f in state.data_files}

    # Removing a file the base does not have means the plan was made against another
    # snapshot: committing it would silently keep rows the planner meant to replace.
    no_duplicates("removed_files", changes.removed_files)
    for path in changes.removed_files:
        if path not in live:
            raise RollupInvariantError(f"removed file {path!r} is not in base version {_v(base)}")

    # File paths are unique per write; a path seen twice would count its rows twice.
    no_duplicates("added_files", [f.path for f in changes.added_files])
    for added in changes.added_files:
        _check_added_file(added, version, live)

    tables: dict[str, TableState] = {}
    removed = set(changes.removed_files)
    for name in sorted(set(schemas.TABLES) | set(base_tables)):
        state = base_tables.get(name)
        columns = (
            state.columns
            if state is not None
            else tuple(schemas.columns_json(schemas.TABLES[name]))
        )
        kept = tuple(f for f in (state.data_files if state else ()) if f.path not in removed)
        new = tuple(f for f in changes.added_files if f.table == name)
        tables[name] = TableState(columns, kept + new)

    ledger_files, ledger_hours = next_ledger(base, changes)
    moved = next_retracted(
        base.ledger_retracted if base is not None else (),
        ledger_hours,
        next_late(base, changes),
        next_lost(base, changes, version),
        added=changes.added_retracted,
        restored=changes.restored,
        included=changes.ledger_delta,
        ledger_file_hours={ledger_file_hour(p) for p in changes.added_ledger_files},
        version=version,
    )
    retention = _next_retention(base, changes, tables)
    return Snapshot(
        version=version,
        previous_manifest_key=manifest_key_of_base,
        created_at=created_at,
        owner_epoch=owner_epoch,
        commit_id=commit_id,
        tables=tables,
        tombstones=_next_tombstones(base, changes, version, retention),
        removed_files=tuple(changes.removed_files),
        ledger_files=ledger_files,
        ledger_hours=moved.hours,
        retention=retention,
        ledger_late=moved.late,
        ledger_lost=moved.lost,
        ledger_retracted=moved.retracted,
    )


def _next_retention(
    base: Snapshot | None, changes: Changes, tables: Mapping[str, TableState]
) -> dict[str, str]:
    retention = dict(base.retention) if base is not None else {}
    for table, first_kept in changes.retention.items():
        if table not in schemas.TABLES:
            raise RollupInvariantError(f"retention for unknown table {table!r}")
        keys.UtcHour.parse_iso(first_kept)
        # Moving back would make hours whose files are gone look kept (and empty).
        if table in retention and first_kept < retention[table]:
            raise RollupInvariantError(
                f"retention of {table} moves back from {retention[table]} to {first_kept}"
            )
        retention[table] = first_kept
    # Every file of an hour before its table's cutoff must be gone: retention is exact.
    for table, first_kept in retention.items():
        for kept in tables[table].data_files if table in tables else ():
            if kept.partition.iso < first_kept:
                raise RollupInvariantError(
                    f"{kept.path!r} is before {table}'s retention cutoff {first_kept}"
                )
    return dict(sorted(retention.items()))


def _v(base: Snapshot | None) -> int:
    return base.version if base is not None else 0


def _check_header(
    base: Snapshot | None,
    version: int,
    commit_id: str,
    owner_epoch: int,
    created_at: str,
    manifest_key_of_base: str | None,
) -> None:
    # Versions are consecutive so the pointer's version names exactly one chain position.
    expected = _v(base) + 1
    if version != expected:
        raise RollupInvariantError(f"expected version {expected}, found {version}")
    # The previous key links the chain that history, version travel and vacuum walk.
    if base is None and manifest_key_of_base is not None:
        raise RollupInvariantError("version 1 has no base, but a base manifest key was given")
    if base is not None and manifest_key_of_base != base.manifest_key:
        raise RollupInvariantError(
            f"base manifest key {manifest_key_of_base!r} is not the base's {base.manifest_key!r}"
        )
    # Epochs only grow: a lower epoch is an owner that was taken over (fencing).
    if base is not None and owner_epoch < base.owner_epoch:
        raise RollupInvariantError(
            f"owner epoch {owner_epoch} is older than the base's epoch {base.owner_epoch}"
        )
    if owner_epoch < 1:
        raise RollupInvariantError(f"owner epoch must be >= 1, got {owner_epoch}")
    # The commit id is part of the manifest key: it must be key-safe and unique-looking.
    if not COMMIT_ID_PATTERN.fullmatch(commit_id):
        raise RollupInvariantError(f"commit id must be 1-64 of [0-9A-Za-z-], got {commit_id!r}")
    try:
        parse_created_at(created_at)
    except ValueError as exc:
        raise RollupInvariantError(str(exc)) from None


def _check_added_file(added: DataFile, version: int, live: Mapping[str, DataFile]) -> None:
    if added.table not in schemas.TABLES:
        raise RollupInvariantError(f"added file {added.path!r}: unknown table {added.table!r}")
    # A path reused from the base would make one object stand for two sets of rows.
    if added.path in live:
        raise RollupInvariantError(f"added file {added.path!r} is already in the base")
    # The path's partition is what readers prune by; it must agree with the record.
    prefix = f"{keys.ROLLUP_TABLES_PREFIX}{added.table}/{added.partition.partition}/"
    if not added.path.startswith(prefix) or not added.path.endswith(".parquet"):
        raise RollupInvariantError(f"added file {added.path!r} is not under {prefix!r}")
    # added_version tells history which commit brought the rows.
    if added.added_version != version:
        raise RollupInvariantError(
            f"added file {added.path!r}: expected added_version {version}, "
            f"found {added.added_version}"
        )
    if added.row_count < 0 or added.size_bytes < 0:
        raise RollupInvariantError(f"added file {added.path!r}: negative row_count or size")


def _next_tombstones(
    base: Snapshot | None, changes: Changes, version: int, retention: Mapping[str, str]
) -> tuple[Tombstone, ...]:
    existing = base.tombstones if base is not None else ()
    # A tombstone id committed twice would be a retried delete counted as two requests.
    no_duplicates("tombstones", [t.id for t in (*existing, *changes.added_tombstones)])
    tombstones = existing + tuple(t.committed_at(version) for t in changes.added_tombstones)
    # One whose range retention dropped from every table it names can never match a row
    # again (no row is written before a cutoff, and cutoffs only move forward): it goes,
    # so the list does not grow with history (`rollup.table.tombstones.retention_applied`).
    return tuple(t for t in tombstones if not retention_applied(t, retention))


def next_ledger(
    base: Snapshot | None, changes: Changes
) -> tuple[tuple[str, ...], dict[str, LedgerHour]]:
    """``ledger.files`` and ``ledger.hours`` after ``changes``."""
    base_files = base.ledger_files if base is not None else ()
    no_duplicates("added_ledger_files", changes.added_ledger_files)
    no_duplicates("removed_ledger_files", changes.removed_ledger_files)
    for path in changes.added_ledger_files:
        # A ledger file listed twice would include its batches twice.
        if path in base_files:
            raise RollupInvariantError(f"ledger file {path!r} is already in the base")
        if not path.startswith(keys.ROLLUP_LEDGER_PREFIX) or not path.endswith(".parquet"):
            raise RollupInvariantError(f"ledger file {path!r} is not under rollup/v1/ledger/")
    removed = set(changes.removed_ledger_files)
    added_hours = {ledger_file_hour(path) for path in changes.added_ledger_files}
    for path in changes.removed_ledger_files:
        # Removing a file the base lacks: the merge was planned on another snapshot.
        if path not in base_files:
            raise RollupInvariantError(f"removed ledger file {path!r} is not in the base")
        # Its rows must live on in a file of the same hour (a merge), or batches vanish.
        if ledger_file_hour(path) not in added_hours:
            raise RollupInvariantError(
                f"ledger file {path!r} is removed, and no file of its hour added"
            )
    hours: dict[str, LedgerHour] = dict(base.ledger_hours) if base is not None else {}
    new_batches = 0
    for hour, delta in changes.ledger_delta.items():
        check_ledger_hour(hour, delta)
        new_batches += delta.batches
        hours[hour] = hours.get(hour, EMPTY_LEDGER_HOUR) + delta
    # New batches must be written down somewhere, or verify could never find them.
    if new_batches and not changes.added_ledger_files:
        raise RollupInvariantError(f"ledger delta adds {new_batches} batches but no ledger file")
    files = tuple(f for f in base_files if f not in removed) + tuple(changes.added_ledger_files)
    return files, dict(sorted(hours.items()))


def next_late(base: Snapshot | None, changes: Changes) -> dict[str, LedgerHour]:
    late = dict(base.ledger_late) if base is not None else {}
    for hour, delta in changes.late_delta.items():
        check_ledger_hour(hour, delta)
        _within_delta(hour, delta, changes, "late")
        late[hour] = late.get(hour, EMPTY_LEDGER_HOUR) + delta
    return dict(sorted(late.items()))


def next_lost(base: Snapshot | None, changes: Changes, version: int) -> tuple[LostBatch, ...]:
    existing = base.ledger_lost if base is not None else ()
    # A batch acknowledged twice would be counted twice in the lost totals.
    no_duplicates("lost batches", [b.manifest_id for b in (*existing, *changes.added_lost)])
    for hour, delta in lost_totals(changes.added_lost).items():
        _within_delta(hour, delta, changes, "lost")
    return existing + tuple(b.committed_at(version) for b in changes.added_lost)


def _within_delta(hour: str, part: LedgerHour, changes: Changes, what: str) -> None:
    # Late and lost batches are ledger rows too: a part of this commit's delta, never more.
    included = changes.ledger_delta.get(hour, EMPTY_LEDGER_HOUR)
    if part.batches > included.batches or part.records > included.records:
        raise RollupInvariantError(f"ledger hour {hour}: more {what} batches than new ones")
