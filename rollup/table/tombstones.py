"""Tombstones: constant-time deletes of rollup rows (PROTOCOL §4.1). Pure, no I/O.

A `Tombstone` is one delete request: a series matcher (``metric`` and label
equalities), optionally an ``agent_id``, a half-open time range ``[start, end)`` on each
table's partition column (``ts`` for points, ``window_start`` for rollup_1m), the tables
it applies to, and who asked and why. ``lm-rollup delete`` writes it to
``rollup/v1/tombstones/<id>.json`` and commits it into the snapshot's ``tombstones``
(a tombstone stays in every later snapshot until retention has dropped its range).

Meanings decided here (PROTOCOL §4.1 is loose on them):
- **What it masks**: every row matching the predicate, whatever commit brought it. A
  late batch whose points fall in a deleted range is masked too: the range's ``end``
  defaults to the moment of the delete, so the series keeps being collected afterwards,
  and nothing that was acknowledged before the delete can reappear.
- **Where it is applied**: every writer applies the tombstones of the snapshot it commits
  on to the rows it writes (the Spark job to new points and to the ``rollup_1m`` hours it
  rewrites; compaction to what it rewrites). Because every commit swaps the pointer with
  If-Match on its base, a file added at version V was written knowing every tombstone of
  a version below V; so a file needs masking only by tombstones added at its own version
  or later (`pending_for`). That is the "recorded as applied" of PROTOCOL §4.1, carried by
  versions instead of a per-file list.
- **When it leaves the snapshot**: once retention dropped its whole range from every
  table it names (`retention_applied`); until then it stays, so a late batch is masked.
- ``agent_id`` exists only in ``points``: a tombstone with an agent applies to ``points``
  alone (``rollup_1m`` rows aggregate a series and do not know the agent).
- Matching on ``rollup_1m`` is per window: a window is masked when its ``window_start``
  lies in the range, so minute-aligned bounds delete whole minutes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from protocol import keys
from rollup.table import schemas
from rollup.table.data_file import DataFile

TOMBSTONE_SCHEMA = "lightmetrics.rollup_tombstone.v1"
_MAX_TEXT = 1024
_MAX_LABELS = 64
_NAME = re.compile(r"[^\x00-\x1f]{1,1024}")


class TombstoneError(ValueError):
    """A delete request or a stored tombstone is malformed; the message names the field."""


def _time_text(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class Tombstone:
    """One delete request; ``added_version`` is the snapshot version that committed it
    (0 until committed)."""

    id: str
    metric: str
    end: datetime
    tables: tuple[str, ...]
    requested_by: str
    reason: str
    created_at: str
    labels: tuple[tuple[str, str], ...] = ()
    agent_id: str | None = None
    start: datetime | None = None
    added_version: int = 0

    def __post_init__(self) -> None:
        keys.rollup_tombstone_key(self.id)  # validates the id
        for name, text in (("metric", self.metric), ("requested_by", self.requested_by)):
            if not _NAME.fullmatch(text):
                raise TombstoneError(f"{name}: must be 1-{_MAX_TEXT} printable characters")
        if not self.reason.strip() or len(self.reason) > _MAX_TEXT:
            raise TombstoneError(f"reason: must say why, in 1-{_MAX_TEXT} characters")
        if len(self.labels) > _MAX_LABELS or len({k for k, _ in self.labels}) != len(self.labels):
            raise TombstoneError(f"labels: at most {_MAX_LABELS}, each name once")
        for name, value in self.labels:
            if not _NAME.fullmatch(name) or len(value) > _MAX_TEXT:
                raise TombstoneError(f"labels: bad label {name!r}={value!r}")
        if self.agent_id is not None and not _NAME.fullmatch(self.agent_id):
            raise TombstoneError("agent_id: must be 1-1024 printable characters")
        if not self.tables or len(set(self.tables)) != len(self.tables):
            raise TombstoneError("tables: name at least one table, each once")
        for table in self.tables:
            if table in schemas.SERIES_TABLES:
                raise TombstoneError(
                    f"tables: {table} is the series index, derived from points: delete the "
                    "points (compaction then recomputes its rows)"
                )
            if table not in schemas.TABLES:
                raise TombstoneError(f"tables: unknown table {table!r} ({sorted(schemas.TABLES)})")
        if self.agent_id is not None and "rollup_1m" in self.tables:
            raise TombstoneError(
                "tables: rollup_1m has no agent_id column; a delete by agent applies to "
                "points only (delete by series to remove rollup_1m rows)"
            )
        for name, moment in (("from", self.start), ("to", self.end)):
            if moment is not None and moment.tzinfo is None:
                raise TombstoneError(f"{name}: needs a time zone")
        if self.start is not None and self.start >= self.end:
            raise TombstoneError(f"from ({self.start}) must be before to ({self.end})")
        if self.added_version < 0:
            raise TombstoneError("added_version: must be >= 0")

    @property
    def key(self) -> str:
        return keys.rollup_tombstone_key(self.id)

    def committed_at(self, version: int) -> Tombstone:
        return replace(self, added_version=version)

    def describe(self) -> str:
        """``cpu{host="a"} agent=x [from, to) in points,rollup_1m``: for history and logs."""
        labels = ",".join(f'{k}="{v}"' for k, v in self.labels)
        text = self.metric + (f"{{{labels}}}" if labels else "")
        if self.agent_id is not None:
            text += f" agent={self.agent_id}"
        start = _time_text(self.start) if self.start is not None else "-inf"
        return f"{text} [{start}, {_time_text(self.end)}) in {','.join(self.tables)}"

    def to_dict(self, *, with_version: bool = True) -> dict[str, Any]:
        document: dict[str, Any] = {
            "id": self.id,
            "metric": self.metric,
            "labels": dict(self.labels),
            "agent_id": self.agent_id,
            "from": _time_text(self.start) if self.start is not None else None,
            "to": _time_text(self.end),
            "tables": list(self.tables),
            "requested_by": self.requested_by,
            "reason": self.reason,
            "created_at": self.created_at,
        }
        if with_version:
            document["added_version"] = self.added_version
        return document

    def file_json(self) -> dict[str, Any]:
        """The request record stored at `key` (no version: it is written before the commit)."""
        return {"schema": TOMBSTONE_SCHEMA, **self.to_dict(with_version=False)}

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> Tombstone:
        """Parse a snapshot entry or a tombstone file; `TombstoneError` naming the field."""
        try:
            labels = document.get("labels") or {}
            if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
            ):
                raise TombstoneError("labels: must be an object of strings")
            start = document.get("from")
            tables = document["tables"]
            if not isinstance(tables, list):
                raise TombstoneError("tables: must be a list")
            return cls(
                id=_string(document, "id"),
                metric=_string(document, "metric"),
                labels=tuple(sorted(labels.items())),
                agent_id=document.get("agent_id"),
                start=schemas.parse_timestamp(start) if start is not None else None,
                end=schemas.parse_timestamp(_string(document, "to")),
                tables=tuple(tables),
                requested_by=_string(document, "requested_by"),
                reason=_string(document, "reason"),
                created_at=_string(document, "created_at"),
                added_version=int(document.get("added_version", 0)),
            )
        except KeyError as exc:
            raise TombstoneError(f"tombstone: missing {exc.args[0]!r}") from None
        except keys.KeyFormatError as exc:
            raise TombstoneError(f"id: {exc}") from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, TombstoneError):
                raise
            raise TombstoneError(f"tombstone: {exc}") from None


def _string(document: Mapping[str, Any], name: str) -> str:
    value = document[name]
    if not isinstance(value, str):
        raise TombstoneError(f"{name}: must be a string, got {value!r}")
    return value


def pending_for(
    tombstones: Iterable[Tombstone],
    table: str,
    *,
    added_version: int,
    hour: keys.UtcHour,
    metric_min: str | None = None,
    metric_max: str | None = None,
) -> tuple[Tombstone, ...]:
    """The tombstones a file of ``table`` for ``hour`` added at ``added_version`` still
    needs masked: those for the table, committed at that version or later (older ones were
    applied when the file was written), whose range meets the hour and whose metric can
    be in the file (its statistics, when known)."""
    hour_start = datetime.fromtimestamp(hour.start_ns // 1_000_000_000, tz=UTC)
    hour_end = hour_start + timedelta(hours=1)
    return tuple(
        t
        for t in tombstones
        if table in t.tables
        and t.added_version >= added_version
        and t.end > hour_start
        and (t.start is None or t.start < hour_end)
        and (metric_min is None or metric_min <= t.metric)
        and (metric_max is None or t.metric <= metric_max)
    )


def pending_on(tombstones: Iterable[Tombstone], data_file: DataFile) -> tuple[Tombstone, ...]:
    """`pending_for` a data file of a snapshot (its table, version, hour and statistics)."""
    return pending_for(
        tombstones,
        data_file.table,
        added_version=data_file.added_version,
        hour=data_file.partition,
        metric_min=data_file.min.get("metric"),
        metric_max=data_file.max.get("metric"),
    )


def retention_applied(tombstone: Tombstone, retention: Mapping[str, str]) -> bool:
    """Whether retention dropped the tombstone's whole range from every table it names:
    each has a cutoff (first hour kept, ``YYYY-MM-DDTHH``) at or after its ``end``. Such a
    tombstone can never match a row again — no row is ever written before a cutoff
    (`rollup.job.run`), and cutoffs only move forward — so a snapshot no longer carries it."""
    for table in tombstone.tables:
        first_kept = retention.get(table)
        if first_kept is None:
            return False
        start_ns = keys.UtcHour.parse_iso(first_kept).start_ns
        if datetime.fromtimestamp(start_ns // 1_000_000_000, tz=UTC) < tombstone.end:
            return False
    return True


def for_table(tombstones: Iterable[Tombstone], table: str) -> tuple[Tombstone, ...]:
    return tuple(t for t in tombstones if table in t.tables)


def needed_columns(table: str, tombstones: Sequence[Tombstone]) -> list[str]:
    """The columns `matches` reads for ``tombstones`` on ``table``."""
    if not tombstones:
        return []
    names = ["metric", schemas.PARTITION_COLUMN[table]]
    if any(t.labels for t in tombstones):
        names.append("labels")
    if any(t.agent_id is not None for t in tombstones):
        names.append("agent_id")
    return names


def matches(
    tombstones: Sequence[Tombstone],
    table: str,
    rows: pa.Table,
    *,
    time_column: pa.ChunkedArray | pa.Array | None = None,
) -> pa.ChunkedArray:
    """A boolean column: True where some tombstone masks the row (never null). The time
    compared is ``table``'s partition column of ``rows``, or ``time_column`` when given
    (the minute windows of raw points that feed ``rollup_1m``)."""
    hit = pa.chunked_array([pa.array(np.zeros(rows.num_rows, dtype=bool))])
    if not rows.num_rows:
        return hit
    if time_column is None:
        time_column = rows.column(schemas.PARTITION_COLUMN[table])
    for tombstone in tombstones:
        term = pc.equal(rows.column("metric"), tombstone.metric)
        for name, value in tombstone.labels:
            found = pc.map_lookup(rows.column("labels"), pa.scalar(name), "first")
            term = pc.and_(term, pc.equal(found, value))
        if tombstone.agent_id is not None:
            term = pc.and_(term, pc.equal(rows.column("agent_id"), tombstone.agent_id))
        end = pa.scalar(tombstone.end, type=time_column.type)
        term = pc.and_(term, pc.less(time_column, end))
        if tombstone.start is not None:
            start = pa.scalar(tombstone.start, type=time_column.type)
            term = pc.and_(term, pc.greater_equal(time_column, start))
        hit = pc.or_(hit, pc.fill_null(term, False))
    return hit


def masked_in_rollup(tombstones: Sequence[Tombstone], points: pa.Table) -> pa.ChunkedArray:
    """True for the ``points`` rows whose minute window ``rollup_1m``'s tombstones mask:
    what those rows contribute to that table is deleted (`matches` on the windows)."""
    windows = pc.floor_temporal(points.column("ts"), unit="minute")
    return matches(for_table(tombstones, "rollup_1m"), "rollup_1m", points, time_column=windows)


def drop_from_rollup(tombstones: Sequence[Tombstone], points: pa.Table) -> pa.Table:
    """``points`` rows without those whose ``rollup_1m`` window is deleted."""
    if not for_table(tombstones, "rollup_1m") or not points.num_rows:
        return points
    return points.filter(pc.invert(masked_in_rollup(tombstones, points)))


def drop_from_points(
    tombstones: Sequence[Tombstone], for_points: pa.Table, for_rollup: pa.Table
) -> tuple[pa.Table, pa.Table]:
    """New ``points`` rows without what each table's tombstones mask: ``(for points, for
    rollup_1m)`` (`drop_from_rollup`)."""
    kept_points, _ = drop_masked(for_table(tombstones, "points"), "points", for_points)
    return kept_points, drop_from_rollup(tombstones, for_rollup)


def drop_masked(
    tombstones: Sequence[Tombstone], table: str, rows: pa.Table
) -> tuple[pa.Table, int]:
    """``rows`` of ``table`` without the ones ``tombstones`` mask, and how many were dropped."""
    if not tombstones or not rows.num_rows:
        return rows, 0
    hit = matches(tombstones, table, rows)
    dropped = pc.sum(hit).as_py() or 0
    if not dropped:
        return rows, 0
    return rows.filter(pc.invert(hit)), dropped
