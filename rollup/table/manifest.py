"""The rollup dataset's snapshot model and its one transition, `apply` (PROTOCOL §4).

Pure: no I/O. A `Snapshot` is one immutable manifest
(``rollup/v1/manifests/v<version>-<commit-id>.json``); `Snapshot.to_json` writes exactly
the PROTOCOL §4 shape and `Snapshot.from_json` reads it back, validating everything
(`RollupManifestError` names the field and the problem). `apply(base, changes)` builds
the next snapshot from the current one and checks every invariant against the base,
raising `RollupInvariantError` ("expected version 6, found 7") before anything is written.

Meanings decided here (PROTOCOL §4 shows the fields, not all of their semantics):
- ``removed_files``: the data-file paths *this* snapshot removed (reachable from the
  previous snapshot, not from this one): a record of what became unreachable when, for
  history and vacuum. They are not carried forward. (Snapshots written before deletes
  existed kept this list under ``tombstones``; `rollup.table.manifest_codec` reads both.)
- ``retention``: per table, the first hour (``YYYY-MM-DDTHH``) the table still keeps:
  its files of earlier hours were dropped by retention, and writers drop rows before it.
  Only ever moves forward. Absent for a table without retention.
- ``ledger.late_excluded``: per accepted hour, the batches that arrived after retention
  had dropped every hour their points fall in: in the ledger (so planned once, and
  counted by ``verify``), in ``ledger.hours`` totals, but with no row in any table.
  ``ledger.lost`` likewise, for batches whose raw blob is gone or corrupt.
- ``tombstones``: every delete committed so far (`rollup.table.tombstones`), each with the
  version that added it, until retention has dropped its whole range from every table
  it names (`rollup.table.tombstones.retention_applied`); readers mask the rows they match.
- ``ledger`` (`rollup.table.manifest_ledger`): ``files``, every ledger file of the snapshot
  (compaction merges an hour's files into one); ``hours``, per accepted hour, the total
  batches, records and setsum over all of them; ``late_excluded`` and ``lost`` (batches
  acknowledged as lost, with who and why), parts of those totals with no table rows.
- A data file's ``min``/``max`` hold JSON statistics per column (see `rollup.table.schemas`);
  a column without an entry has no statistics. ``table`` is implied by where the file
  is listed and is not written per file.
- ``created_at``: RFC 3339 UTC with ``Z``, whole seconds (`format_created_at`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from protocol import keys
from rollup.table import schemas
from rollup.table.manifest_errors import RollupInvariantError, RollupManifestError
from rollup.table.manifest_ledger import (
    EMPTY_LEDGER_HOUR,
    LedgerHour,
    LostBatch,
    check_ledger_hour,
    lost_totals,
    next_late,
    next_ledger,
    next_lost,
    no_duplicates,
)
from rollup.table.tombstones import Tombstone, retention_applied

__all__ = [
    "EMPTY_LEDGER_HOUR",
    "Changes",
    "DataFile",
    "LedgerHour",
    "LostBatch",
    "RollupInvariantError",
    "RollupManifestError",
    "Snapshot",
    "TableState",
    "apply",
    "check_ledger_hour",
    "describe_file",
    "format_created_at",
    "parse_created_at",
]

MANIFEST_SCHEMA = "lightmetrics.rollup_manifest.v1"
COMMIT_ID_PATTERN = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{0,63}")
_CREATED_AT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z")


@dataclass(frozen=True, slots=True)
class DataFile:
    """One Parquet file of a table, at ``path`` (an object key relative to the store root)."""

    path: str
    table: str
    partition: keys.UtcHour
    row_count: int
    size_bytes: int
    min: Mapping[str, Any] = field(default_factory=dict)
    max: Mapping[str, Any] = field(default_factory=dict)
    added_version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "partition": {"date": self.partition.day.isoformat(), "hour": self.partition.hour},
            "row_count": self.row_count,
            "size_bytes": self.size_bytes,
            "min": dict(self.min),
            "max": dict(self.max),
            "added_version": self.added_version,
        }


@dataclass(frozen=True, slots=True)
class TableState:
    """A table in a snapshot: its columns (``[{"name", "type"}]``) and live data files."""

    columns: tuple[Mapping[str, str], ...]
    data_files: tuple[DataFile, ...] = ()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One committed (or about to be committed) state of the whole dataset. Read-only."""

    version: int
    previous_manifest_key: str | None
    created_at: str
    owner_epoch: int
    commit_id: str
    tables: Mapping[str, TableState]
    tombstones: tuple[Tombstone, ...] = ()
    removed_files: tuple[str, ...] = ()
    ledger_files: tuple[str, ...] = ()
    ledger_hours: Mapping[str, LedgerHour] = field(default_factory=dict)
    retention: Mapping[str, str] = field(default_factory=dict)
    ledger_late: Mapping[str, LedgerHour] = field(default_factory=dict)
    ledger_lost: tuple[LostBatch, ...] = ()

    @property
    def lost_hours(self) -> dict[str, LedgerHour]:
        """Per accepted hour, the totals of the batches acknowledged as lost."""
        return lost_totals(self.ledger_lost)

    @property
    def manifest_key(self) -> str:
        """Where this snapshot is (to be) stored: unique per commit attempt."""
        return keys.rollup_manifest_key(self.version, self.commit_id)

    def data_files(self, table: str) -> tuple[DataFile, ...]:
        state = self.tables.get(table)
        return state.data_files if state is not None else ()

    def reachable_keys(self) -> set[str]:
        """Every object this snapshot needs: its manifest, data, ledger and tombstone files."""
        paths = {self.manifest_key, *self.ledger_files, *(t.key for t in self.tombstones)}
        for state in self.tables.values():
            paths.update(f.path for f in state.data_files)
        return paths

    def to_json(self) -> bytes:
        """UTF-8 JSON in exactly the PROTOCOL §4 shape and key order."""
        document: dict[str, Any] = {
            "schema": MANIFEST_SCHEMA,
            "version": self.version,
            "previous_manifest_key": self.previous_manifest_key,
            "created_at": self.created_at,
            "owner_epoch": self.owner_epoch,
            "commit_id": self.commit_id,
            "tables": {
                name: {
                    "columns": [dict(c) for c in state.columns],
                    "data_files": [f.to_dict() for f in state.data_files],
                }
                for name, state in self.tables.items()
            },
            "tombstones": [t.to_dict() for t in self.tombstones],
            "removed_files": list(self.removed_files),
            "ledger": {
                "files": list(self.ledger_files),
                "hours": {hour: totals.to_dict() for hour, totals in self.ledger_hours.items()},
            },
        }
        if self.retention:
            document["retention"] = dict(self.retention)
        if self.ledger_late:
            document["ledger"]["late_excluded"] = {
                hour: totals.to_dict() for hour, totals in self.ledger_late.items()
            }
        if self.ledger_lost:
            document["ledger"]["lost"] = {
                hour: {
                    **totals.to_dict(),
                    "acknowledged": [
                        b.to_dict() for b in self.ledger_lost if b.accepted_hour == hour
                    ],
                }
                for hour, totals in self.lost_hours.items()
            }
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Snapshot:
        """Parse and validate a stored snapshot; `RollupManifestError` on any problem."""
        try:
            from rollup.table.manifest_codec import parse_snapshot  # the codec imports this module

            return parse_snapshot(json.loads(data))
        except RollupManifestError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise RollupManifestError(f"invalid rollup snapshot: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class Changes:
    """What one commit does to its base.

    ``removed_files`` are paths of the base's data files this commit supersedes (e.g.
    ``rollup_1m`` files rewritten with late data); ``ledger_delta`` holds, per accepted
    hour, the totals of only the batches newly included by this commit, which must be in
    ``added_ledger_files``. ``added_tombstones`` are deletes this commit adds (their
    files already written); the commit sets their ``added_version``.
    """

    added_files: tuple[DataFile, ...] = ()
    removed_files: tuple[str, ...] = ()
    added_ledger_files: tuple[str, ...] = ()
    ledger_delta: Mapping[str, LedgerHour] = field(default_factory=dict)
    added_tombstones: tuple[Tombstone, ...] = ()
    retention: Mapping[str, str] = field(default_factory=dict)
    """New retention cutoffs (table → first hour kept); files before them must be removed."""
    late_delta: Mapping[str, LedgerHour] = field(default_factory=dict)
    """Per accepted hour, the part of ``ledger_delta`` that is late and excluded."""
    removed_ledger_files: tuple[str, ...] = ()
    """Ledger files this commit merged into one of ``added_ledger_files`` (same hour)."""
    added_lost: tuple[LostBatch, ...] = ()
    """Batches acknowledged as lost: part of ``ledger_delta`` (their ledger file added)."""


def format_created_at(unix_ns: int) -> str:
    """RFC 3339 UTC, whole seconds, ``Z``: the snapshot's ``created_at``."""
    moment = datetime.fromtimestamp(unix_ns // 1_000_000_000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_created_at(text: str) -> datetime:
    """The inverse of `format_created_at` (fractions allowed); `ValueError` if malformed."""
    if not _CREATED_AT.fullmatch(text):
        raise ValueError(f"created_at must be RFC 3339 UTC ending in Z, got {text!r}")
    head, _, frac = text[:-1].partition(".")
    moment = datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    if frac:
        moment = moment.replace(microsecond=int(frac[:6].ljust(6, "0")))
    return moment


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
        ledger_hours=ledger_hours,
        retention=retention,
        ledger_late=next_late(base, changes),
        ledger_lost=next_lost(base, changes, version),
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


def describe_file(
    table: str,
    path: str,
    partition: keys.UtcHour,
    rows: Any,
    *,
    size_bytes: int,
    added_version: int,
) -> DataFile:
    """The `DataFile` record of a written Parquet file holding ``rows`` (a pyarrow Table),
    with its row count and column statistics (`schemas.file_stats`)."""
    mins, maxs = schemas.file_stats(rows)
    return DataFile(
        path=path,
        table=table,
        partition=partition,
        row_count=rows.num_rows,
        size_bytes=size_bytes,
        min=mins,
        max=maxs,
        added_version=added_version,
    )
