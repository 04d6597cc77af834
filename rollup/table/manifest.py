"""The rollup dataset's snapshot model (PROTOCOL §4).

Pure: no I/O. A `Snapshot` is one immutable manifest
(``rollup/v1/manifests/v<version>-<commit-id>.json``); `Snapshot.to_json` writes exactly
the PROTOCOL §4 shape and `rollup.table.manifest_codec.snapshot_from_json` reads it back,
validating everything (`RollupManifestError` names the field and the problem).
`rollup.table.transition.apply(base, changes)` builds the next snapshot from the current
one and checks every invariant against the base, raising `RollupInvariantError`
("expected version 6, found 7") before anything is written.

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
from rollup.table.data_file import DataFile
from rollup.table.ledger_retracted import RetractedBatch, retracted_json, retracted_totals
from rollup.table.manifest_errors import RollupInvariantError, RollupManifestError
from rollup.table.manifest_ledger import (
    EMPTY_LEDGER_HOUR,
    LedgerHour,
    LostBatch,
    check_ledger_hour,
    lost_totals,
)
from rollup.table.tombstones import Tombstone

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
    "check_ledger_hour",
    "format_created_at",
    "parse_created_at",
]

MANIFEST_SCHEMA = "lightmetrics.rollup_manifest.v1"
COMMIT_ID_PATTERN = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{0,63}")
_CREATED_AT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z")


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
    ledger_retracted: tuple[RetractedBatch, ...] = ()
    """Batches removed after their key was retracted (`rollup.table.ledger_retracted`)."""

    @property
    def retracted_hours(self) -> dict[str, LedgerHour]:
        """Per accepted hour, the totals of the retracted batches."""
        return retracted_totals(self.ledger_retracted)

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
        if self.ledger_retracted:
            document["ledger"]["retracted"] = retracted_json(self.ledger_retracted)
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


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
    added_retracted: tuple[RetractedBatch, ...] = ()
    """Included batches removed because their key was retracted: their digests leave the
    hours' totals for ``retracted`` (their hours' ledger files rewritten without them)."""
    restored: tuple[tuple[str, str], ...] = ()
    """``(accepted_hour, manifest_id)`` of retracted batches this commit includes again."""


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
