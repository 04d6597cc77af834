"""JSON decoding of rollup snapshots (PROTOCOL §4), kept apart from the model in
`rollup.table.manifest` (`snapshot_from_json` is the public entry point).

Stored snapshots are read by other processes and by other versions of this code, so
everything is validated; unknown extra fields are ignored (additive v1 evolution). Every
problem raises `RollupManifestError` naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from protocol import keys
from rollup.table.ledger_retracted import parse_retracted
from rollup.table.manifest import (
    COMMIT_ID_PATTERN,
    MANIFEST_SCHEMA,
    DataFile,
    LedgerHour,
    RollupInvariantError,
    RollupManifestError,
    Snapshot,
    TableState,
    check_ledger_hour,
    parse_created_at,
)
from rollup.table.manifest_ledger import LostBatch, LostBatchError, lost_totals
from rollup.table.tombstones import Tombstone, TombstoneError


def _need(document: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in document:
        raise RollupManifestError(f"{where}: missing {name!r}")
    value = document[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise RollupManifestError(f"{where}.{name}: unexpected {type(value).__name__} {value!r}")
    return value


def _parse_tombstones(document: Mapping[str, Any]) -> tuple[tuple[Tombstone, ...], list[Any]]:
    """``(tombstones, removed_files)``. Snapshots written before deletes existed listed
    the removed data-file paths under ``tombstones`` (strings) and had no
    ``removed_files``: read them as removed files and no deletes."""
    entries = _need(document, "tombstones", list, "snapshot")
    if "removed_files" not in document and all(isinstance(e, str) for e in entries):
        return (), entries
    removed = _need(document, "removed_files", list, "snapshot")
    parsed: list[Tombstone] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise RollupManifestError(f"tombstones[{index}]: must be an object")
        try:
            parsed.append(Tombstone.from_dict(entry))
        except TombstoneError as exc:
            raise RollupManifestError(f"tombstones[{index}]: {exc}") from None
    return tuple(parsed), removed


def parse_snapshot(document: Any) -> Snapshot:
    if not isinstance(document, dict):
        raise RollupManifestError("rollup snapshot must be a JSON object")
    if document.get("schema") != MANIFEST_SCHEMA:
        raise RollupManifestError(
            f"schema must be {MANIFEST_SCHEMA!r}, got {document.get('schema')!r}"
        )
    version = _need(document, "version", int, "snapshot")
    previous = document.get("previous_manifest_key")
    # Version 1 starts the chain; every later version links to its predecessor.
    if version < 1 or (previous is None) != (version == 1):
        raise RollupManifestError(
            f"version {version} with previous_manifest_key {previous!r} is inconsistent"
        )
    if previous is not None and not (
        isinstance(previous, str) and previous.startswith(keys.ROLLUP_MANIFESTS_PREFIX)
    ):
        raise RollupManifestError(f"previous_manifest_key {previous!r} is not a manifest key")
    created_at = _need(document, "created_at", str, "snapshot")
    owner_epoch = _need(document, "owner_epoch", int, "snapshot")
    commit_id = _need(document, "commit_id", str, "snapshot")
    try:
        parse_created_at(created_at)
    except ValueError as exc:
        raise RollupManifestError(str(exc)) from None
    if owner_epoch < 1 or not COMMIT_ID_PATTERN.fullmatch(commit_id):
        raise RollupManifestError(f"bad owner_epoch {owner_epoch!r} or commit_id {commit_id!r}")
    tables = {
        name: _parse_table(name, state)
        for name, state in _need(document, "tables", dict, "snapshot").items()
    }
    tombstones, removed = _parse_tombstones(document)
    ledger = _need(document, "ledger", dict, "snapshot")
    files = _need(ledger, "files", list, "ledger")
    hours = _need(ledger, "hours", dict, "ledger")
    if not all(isinstance(p, str) for p in [*removed, *files]):
        raise RollupManifestError("removed_files and ledger.files must be lists of keys")
    ledger_hours: dict[str, LedgerHour] = {}
    for hour, totals in hours.items():
        ledger_hours[hour] = _ledger_hour(hour, totals, "ledger.hours")
    retention = document.get("retention", {})
    if not isinstance(retention, dict) or not all(
        isinstance(v, str) and _is_hour(v) for v in retention.values()
    ):
        raise RollupManifestError(f"retention must map tables to YYYY-MM-DDTHH, got {retention!r}")
    late = ledger.get("late_excluded", {})
    if not isinstance(late, dict):
        raise RollupManifestError("ledger.late_excluded must be an object")
    lost = _parse_lost(ledger.get("lost", {}))
    return Snapshot(
        version=version,
        previous_manifest_key=previous,
        created_at=created_at,
        owner_epoch=owner_epoch,
        commit_id=commit_id,
        tables=tables,
        tombstones=tombstones,
        removed_files=tuple(removed),
        ledger_files=tuple(files),
        ledger_hours=ledger_hours,
        retention=dict(retention),
        ledger_late={
            hour: _ledger_hour(hour, totals, "ledger.late_excluded")
            for hour, totals in late.items()
        },
        ledger_lost=lost,
        ledger_retracted=parse_retracted(ledger.get("retracted", {})),
    )


def _parse_lost(lost: Any) -> tuple[LostBatch, ...]:
    """``ledger.lost``: per hour, totals and the acknowledged batches; the totals must be
    the batches' (one fact, written twice for readers that only want the totals)."""
    if not isinstance(lost, dict):
        raise RollupManifestError("ledger.lost must be an object")
    parsed: list[LostBatch] = []
    for hour, part in lost.items():
        where = f"ledger.lost.{hour}"
        totals = _ledger_hour(hour, part, "ledger.lost")
        entries = _need(part, "acknowledged", list, where)
        batches = []
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise RollupManifestError(f"{where}.acknowledged[{index}] must be an object")
            try:
                batches.append(LostBatch.from_dict(hour, entry))
            except LostBatchError as exc:
                raise RollupManifestError(f"{where}.acknowledged[{index}]: {exc}") from None
        if lost_totals(batches).get(hour) != totals:
            raise RollupManifestError(f"{where}: totals are not those of its batches")
        parsed += batches
    return tuple(parsed)


def _is_hour(text: str) -> bool:
    try:
        keys.UtcHour.parse_iso(text)
    except keys.KeyFormatError:
        return False
    return True


def _ledger_hour(hour: str, totals: Any, where: str) -> LedgerHour:
    if not isinstance(totals, dict):
        raise RollupManifestError(f"{where}.{hour}: must be an object")
    parsed = LedgerHour(
        _need(totals, "batches", int, f"{where}.{hour}"),
        _need(totals, "records", int, f"{where}.{hour}"),
        _need(totals, "setsum", str, f"{where}.{hour}"),
    )
    try:
        check_ledger_hour(hour, parsed)
    except RollupInvariantError as exc:
        raise RollupManifestError(str(exc)) from None
    return parsed


def _parse_table(name: str, state: Any) -> TableState:
    where = f"tables.{name}"
    if not isinstance(state, dict):
        raise RollupManifestError(f"{where} must be an object")
    columns = _need(state, "columns", list, where)
    for column in columns:
        if not (isinstance(column, dict) and isinstance(column.get("name"), str)):
            raise RollupManifestError(f"{where}.columns: bad column {column!r}")
        _need(column, "type", str, f"{where}.columns")
    data_files = tuple(
        _parse_data_file(name, entry, f"{where}.data_files[{i}]")
        for i, entry in enumerate(_need(state, "data_files", list, where))
    )
    return TableState(tuple(dict(c) for c in columns), data_files)


def _parse_data_file(table: str, entry: Any, where: str) -> DataFile:
    if not isinstance(entry, dict):
        raise RollupManifestError(f"{where} must be an object")
    partition = _need(entry, "partition", dict, where)
    try:
        hour = keys.UtcHour.parse_iso(
            f"{_need(partition, 'date', str, where)}T{_need(partition, 'hour', int, where):02d}"
        )
    except keys.KeyFormatError as exc:
        raise RollupManifestError(f"{where}.partition: {exc}") from None
    path = _need(entry, "path", str, where)
    # Readers prune by the recorded partition: it must be the one in the path.
    if not path.startswith(f"{keys.ROLLUP_TABLES_PREFIX}{table}/{hour.partition}/"):
        raise RollupManifestError(f"{where}: path {path!r} is not in partition {hour.partition}")
    data_file = DataFile(
        path=path,
        table=table,
        partition=hour,
        row_count=_need(entry, "row_count", int, where),
        size_bytes=_need(entry, "size_bytes", int, where),
        min=_need(entry, "min", dict, where),
        max=_need(entry, "max", dict, where),
        added_version=_need(entry, "added_version", int, where),
    )
    if data_file.row_count < 0 or data_file.size_bytes < 0 or data_file.added_version < 1:
        raise RollupManifestError(f"{where}: negative count/size or added_version < 1")
    return data_file


def snapshot_from_json(data: bytes | str) -> Snapshot:
    """Parse and validate a stored snapshot; `RollupManifestError` on any problem."""
    try:
        return parse_snapshot(json.loads(data))
    except RollupManifestError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise RollupManifestError(f"invalid rollup snapshot: {exc!r}") from None
