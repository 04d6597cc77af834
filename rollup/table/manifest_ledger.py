"""The ledger part of a rollup snapshot (PROTOCOL §4, §4.1) and its transition. Pure.

A snapshot's ledger is ``ledger.files`` (Parquet files of included batches, one accepted
hour each), ``ledger.hours`` (per accepted hour: batches, records, setsum over every row
of those files) and two parts of those totals that have no rows in any table:
``late_excluded`` (retention had dropped every hour their points fall in) and ``lost``
(a batch whose raw blob is gone or corrupt, so it can never be read, acknowledged by an
operator: `LostBatch`, `rollup.lifecycle.lost`). A lost batch is a ledger row like any other, so
``verify`` still finds catalog = ledger per hour — included + late_excluded + lost, with
``retired`` a property of hours, not of rows — the planner never plans it again, and
``sealed_through_ns`` and raw retention, which compare the catalog hour with
``ledger.hours``, move past its hour.

**Bounded** (issue 24 item 10): ``ledger.files`` is cumulative, so compaction merges an
hour's files into one (`rollup.lifecycle.compaction`); a commit may then remove ledger files, but
only those of hours it adds a file for (the merged one: same rows, same totals, checked
by the compaction before it commits). ``ledger.hours`` keeps one entry per accepted hour
(what ``verify``, raw retention and ``sealed_through_ns`` compare with the catalog).
``lost`` holds each acknowledged batch with who and why (operator actions: few).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from protocol import keys
from protocol.setsum import Setsum
from rollup.table.manifest_errors import RollupInvariantError

_HEX64 = re.compile(r"[0-9a-f]{64}")
LOST_PROBLEMS = ("missing-blob", "corrupt-blob", "bad-range")
"""Why a batch can be acknowledged as lost: the rollup's own problem kinds for a frame it
can never read (`rollup.job.frame_stage`; ``bad-range``: a bundled frame neither its
record's range nor its bundle's index serves, PROTOCOL §3.10)."""
_MAX_TEXT = 1024


@dataclass(frozen=True, slots=True)
class LedgerHour:
    """One accepted hour's ledger totals: ``setsum`` is 64 lowercase hex digits."""

    batches: int
    records: int
    setsum: str

    def __add__(self, other: LedgerHour) -> LedgerHour:
        total = Setsum.from_hex(self.setsum) + Setsum.from_hex(other.setsum)
        return LedgerHour(self.batches + other.batches, self.records + other.records, total.hex)

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "records": self.records, "setsum": self.setsum}


EMPTY_LEDGER_HOUR = LedgerHour(0, 0, Setsum().hex)


class LostBatchError(ValueError):
    """A lost-batch record is malformed; the message names the field."""


@dataclass(frozen=True, slots=True)
class LostBatch:
    """An accepted batch recorded in the ledger as lost: its blob is ``problem``
    (``missing-blob`` or ``corrupt-blob``: ``detail`` says what was found), acknowledged
    by ``acknowledged_by`` at ``acknowledged_at`` (RFC 3339 UTC) because ``reason``.
    ``added_version``: the snapshot that recorded it (0 until committed)."""

    manifest_id: str
    frame_sha256: str
    record_count: int
    accepted_hour: str
    manifest_key: str
    problem: str
    detail: str
    acknowledged_by: str
    reason: str
    acknowledged_at: str
    added_version: int = 0

    def __post_init__(self) -> None:
        try:
            keys.UtcHour.parse_iso(self.accepted_hour)
            keys.parse_manifest_id(self.manifest_id)
            keys.parse_accepted_manifest_key(self.manifest_key)
        except keys.KeyFormatError as exc:
            raise LostBatchError(str(exc)) from None
        if not _HEX64.fullmatch(self.frame_sha256):
            raise LostBatchError("frame_sha256: must be 64 lowercase hex digits")
        if self.record_count < 1 or self.added_version < 0:
            raise LostBatchError("record_count must be >= 1 and added_version >= 0")
        if self.problem not in LOST_PROBLEMS:
            raise LostBatchError(f"problem: must be one of {LOST_PROBLEMS}, got {self.problem!r}")
        for name in ("detail", "acknowledged_by", "reason", "acknowledged_at"):
            text = getattr(self, name)
            if not text.strip() or len(text) > _MAX_TEXT or any(ord(c) < 0x20 for c in text):
                raise LostBatchError(f"{name}: 1-{_MAX_TEXT} printable characters")

    def committed_at(self, version: int) -> LostBatch:
        return replace(self, added_version=version)

    def describe(self) -> str:
        return (
            f"{self.manifest_key}: {self.problem} ({self.detail}); acknowledged lost by "
            f"{self.acknowledged_by} at {self.acknowledged_at} in version "
            f"{self.added_version}: {self.reason}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "manifest_id": self.manifest_id,
            "frame_sha256": self.frame_sha256,
            "record_count": self.record_count,
            "manifest_key": self.manifest_key,
            "problem": self.problem,
            "detail": self.detail,
            "by": self.acknowledged_by,
            "reason": self.reason,
            "at": self.acknowledged_at,
            "added_version": self.added_version,
        }

    @classmethod
    def from_dict(cls, hour: str, entry: Mapping[str, Any]) -> LostBatch:
        """An entry of ``ledger.lost.<hour>.acknowledged``; `LostBatchError`."""
        try:
            fields = {
                "manifest_id": entry["manifest_id"],
                "frame_sha256": entry["frame_sha256"],
                "record_count": entry["record_count"],
                "manifest_key": entry["manifest_key"],
                "problem": entry["problem"],
                "detail": entry["detail"],
                "acknowledged_by": entry["by"],
                "reason": entry["reason"],
                "acknowledged_at": entry["at"],
                "added_version": entry["added_version"],
            }
        except KeyError as exc:
            raise LostBatchError(f"missing {exc.args[0]!r}") from None
        numbers = ("record_count", "added_version")
        for name, value in fields.items():
            wanted = int if name in numbers else str
            if not isinstance(value, wanted) or isinstance(value, bool):
                raise LostBatchError(f"{name}: unexpected {type(value).__name__}")
        return cls(accepted_hour=hour, **fields)


def lost_totals(lost: Iterable[LostBatch]) -> dict[str, LedgerHour]:
    """Per accepted hour, the totals of the lost batches (as `LedgerHour`)."""
    hours: dict[str, LedgerHour] = {}
    for batch in lost:
        one = LedgerHour(
            1, batch.record_count, Setsum().add(batch.manifest_id, batch.frame_sha256).hex
        )
        hours[batch.accepted_hour] = hours.get(batch.accepted_hour, EMPTY_LEDGER_HOUR) + one
    return dict(sorted(hours.items()))


def check_ledger_hour(hour: str, totals: LedgerHour) -> None:
    try:
        keys.UtcHour.parse_iso(hour)
    except keys.KeyFormatError as exc:
        raise RollupInvariantError(f"ledger hour {hour!r}: {exc}") from None
    if totals.batches < 0 or totals.records < 0:
        raise RollupInvariantError(f"ledger hour {hour}: negative batches or records")
    if totals.records < totals.batches:
        raise RollupInvariantError(f"ledger hour {hour}: fewer records than batches")
    if not _HEX64.fullmatch(totals.setsum):
        raise RollupInvariantError(f"ledger hour {hour}: setsum must be 64 lowercase hex")


def ledger_file_hour(key: str) -> str | None:
    """The accepted hour (``YYYY-MM-DDTHH``) a ledger key's partition names, or None."""
    rest = key.removeprefix(keys.ROLLUP_LEDGER_PREFIX)
    try:
        return keys.UtcHour.parse_partition(rest.rsplit("/", 1)[0]).iso
    except keys.KeyFormatError:
        return None


def no_duplicates(what: str, items: Iterable[str]) -> None:
    seen: set[str] = set()
    for item in items:
        if item in seen:
            raise RollupInvariantError(f"{what} lists {item!r} twice")
        seen.add(item)
