"""Retracted batches in a snapshot's ledger (PROTOCOL §3.7 "Retraction", §4.1). Pure.

When the counting catalog row of an included batch's key becomes ``retracted`` (an
operator retracted a phantom row), the rollup removes the batch in one commit
(`rollup.lifecycle.retraction`): its points leave the tables, its ledger row leaves the
ledger files of its hour, and its digest moves from the hour's totals — ``ledger.hours``
(included, or retired: a property of hours), with its part of ``late_excluded`` or
``lost`` — to the hour's ``retracted`` totals. ``ledger.retracted`` holds each such batch
(operator actions: few), so that a later real record of the key, planned and included
again, moves its digest back in the commit that includes it (``restored``).

``verify`` keeps comparing the catalog hour without retracted rows with ``ledger.hours``:
catalog = included + retired + late_excluded + lost, and ``retracted`` beside it.

JSON (``ledger.retracted``): per hour ``{"batches", "records", "setsum", "retracted":
[{"manifest_id", "frame_sha256", "record_count", "from", "added_version"}]}``; ``from``
says which totals it left (``included`` | ``late_excluded`` | ``lost``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from protocol import keys
from protocol.setsum import MODULUS, Setsum, batch_term
from rollup.table.manifest_errors import RollupInvariantError, RollupManifestError
from rollup.table.manifest_ledger import EMPTY_LEDGER_HOUR, LedgerHour, LostBatch

PARTS = ("included", "late_excluded", "lost")
MAX_LATE_SEARCH = 2
"""The largest subset `in_late_part` searches for (its cost is linear in the hour's rows)."""


@dataclass(frozen=True, slots=True)
class RetractedBatch:
    """A batch the rollup had included and removed after its key was retracted.
    ``part``: the totals its digest left (`PARTS`); ``added_version``: the snapshot that
    removed it (0 until committed)."""

    manifest_id: str
    frame_sha256: str
    record_count: int
    accepted_hour: str
    part: str = "included"
    added_version: int = 0

    def __post_init__(self) -> None:
        try:
            keys.UtcHour.parse_iso(self.accepted_hour)
            keys.parse_manifest_id(self.manifest_id)
            keys.check_sha256(self.frame_sha256)
        except (keys.KeyFormatError, ValueError) as exc:
            raise RollupManifestError(f"retracted batch: {exc}") from None
        if self.part not in PARTS or self.record_count < 0 or self.added_version < 0:
            raise RollupManifestError(f"retracted batch {self.manifest_id}: bad part or counts")

    @property
    def totals(self) -> LedgerHour:
        term = Setsum().add(self.manifest_id, self.frame_sha256)
        return LedgerHour(1, self.record_count, term.hex)

    def to_dict(self) -> dict[str, Any]:
        return {
            "manifest_id": self.manifest_id,
            "frame_sha256": self.frame_sha256,
            "record_count": self.record_count,
            "from": self.part,
            "added_version": self.added_version,
        }

    @classmethod
    def from_dict(cls, hour: str, entry: Mapping[str, Any]) -> RetractedBatch:
        try:
            return cls(
                manifest_id=str(entry["manifest_id"]),
                frame_sha256=str(entry["frame_sha256"]),
                record_count=int(entry["record_count"]),
                accepted_hour=hour,
                part=str(entry["from"]),
                added_version=int(entry["added_version"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RollupManifestError(f"ledger.retracted.{hour}: {exc!r}") from None


def minus(total: LedgerHour, part: LedgerHour, what: str) -> LedgerHour:
    """``total`` without ``part``; `RollupInvariantError` if it does not hold it."""
    if part.batches > total.batches or part.records > total.records:
        raise RollupInvariantError(f"{what}: cannot remove {part} from {total}")
    setsum = Setsum.from_hex(total.setsum) - Setsum.from_hex(part.setsum)
    return LedgerHour(total.batches - part.batches, total.records - part.records, setsum.hex)


def in_late_part(
    late: LedgerHour,
    hour: LedgerHour,
    batch: tuple[str, str],
    others: Iterable[tuple[str, str]],
) -> bool | None:
    """Whether ``batch`` ((manifest_id, frame_sha256), one of the hour's ledger rows) is in
    the hour's ``late_excluded`` part ``late`` of its totals ``hour``; ``others`` are the
    hour's other ledger rows. Ledger rows do not say which batches were late; the setsums
    do: the late part is the setsum of exactly its batches, so ``batch`` is in it when
    ``late.batches - 1`` of the others make up the rest of it (or, searching the smaller
    side, when ``hour.batches - late.batches - 1`` of them make up the part that is not
    late, it is not). None when both sides are larger than `MAX_LATE_SEARCH` + 1."""
    if not late.batches:
        return False
    if late.batches == hour.batches:
        return True
    term = batch_term(*batch)
    late_sum = Setsum.from_hex(late.setsum).value
    rest_sum = (Setsum.from_hex(hour.setsum).value - late_sum) % MODULUS
    in_late, in_rest = late.batches - 1, hour.batches - late.batches - 1
    if min(in_late, in_rest) > MAX_LATE_SEARCH:
        return None
    terms = {batch_term(*other) for other in others}
    if in_late <= in_rest:
        return _sums_to((late_sum - term) % MODULUS, in_late, terms)
    return not _sums_to((rest_sum - term) % MODULUS, in_rest, terms)


def _sums_to(target: int, size: int, terms: set[int]) -> bool:
    """Whether ``size`` (at most 2) distinct ``terms`` sum to ``target`` modulo 2^256."""
    if size == 0:
        return target == 0
    if size == 1:
        return target in terms
    return any((other := (target - t) % MODULUS) in terms and other != t for t in terms)


def retracted_totals(batches: Iterable[RetractedBatch]) -> dict[str, LedgerHour]:
    hours: dict[str, LedgerHour] = {}
    for batch in batches:
        hours[batch.accepted_hour] = (
            hours.get(batch.accepted_hour, EMPTY_LEDGER_HOUR) + batch.totals
        )
    return dict(sorted(hours.items()))


def retracted_json(batches: tuple[RetractedBatch, ...]) -> dict[str, Any]:
    """``ledger.retracted`` of a snapshot."""
    return {
        hour: {
            **totals.to_dict(),
            "retracted": [b.to_dict() for b in batches if b.accepted_hour == hour],
        }
        for hour, totals in retracted_totals(batches).items()
    }


def parse_retracted(document: Any) -> tuple[RetractedBatch, ...]:
    """``ledger.retracted`` (absent in snapshots written before it: empty); the totals must
    be those of the batches listed."""
    if not isinstance(document, dict):
        raise RollupManifestError("ledger.retracted must be an object")
    parsed: list[RetractedBatch] = []
    for hour, part in document.items():
        entries = part.get("retracted") if isinstance(part, dict) else None
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise RollupManifestError(f"ledger.retracted.{hour}.retracted must list objects")
        batches = [RetractedBatch.from_dict(hour, entry) for entry in entries]
        totals = LedgerHour(part.get("batches"), part.get("records"), part.get("setsum"))
        if retracted_totals(batches).get(hour) != totals:
            raise RollupManifestError(f"ledger.retracted.{hour}: totals are not its batches'")
        parsed += batches
    return tuple(parsed)


@dataclass(frozen=True, slots=True)
class RetractedLedger:
    """The ledger parts a commit's retractions change (`next_retracted`)."""

    hours: dict[str, LedgerHour]
    late: dict[str, LedgerHour]
    lost: tuple[LostBatch, ...]
    retracted: tuple[RetractedBatch, ...]


def next_retracted(
    base_retracted: tuple[RetractedBatch, ...],
    hours: Mapping[str, LedgerHour],
    late: Mapping[str, LedgerHour],
    lost: tuple[LostBatch, ...],
    *,
    added: tuple[RetractedBatch, ...],
    restored: tuple[tuple[str, str], ...],
    included: Mapping[str, LedgerHour],
    ledger_file_hours: set[str | None],
    version: int,
) -> RetractedLedger:
    """Move ``added``'s digests from the hours' totals (and their late or lost part) to
    ``retracted``, and ``restored`` ((hour, manifest_id)s included again by this commit,
    whose digests ``included`` — the commit's ledger delta — already adds) out of it."""
    held = {(b.accepted_hour, b.manifest_id): b for b in base_retracted}
    hours, late = dict(hours), dict(late)
    lost_ids = {b.manifest_id for b in lost}
    for batch in added:
        where = f"retraction of {batch.manifest_id} in {batch.accepted_hour}"
        # Retracted twice without a restore between: its digest would leave twice.
        if (batch.accepted_hour, batch.manifest_id) in held:
            raise RollupInvariantError(f"{where}: the batch is already retracted")
        # Its ledger row must leave the ledger files of its hour in this same commit.
        if batch.accepted_hour not in ledger_file_hours:
            raise RollupInvariantError(f"{where}: no rewritten ledger file of its hour")
        hour = batch.accepted_hour
        hours[hour] = minus(hours.get(hour, EMPTY_LEDGER_HOUR), batch.totals, where)
        if batch.part == "late_excluded":
            late[hour] = minus(late.get(hour, EMPTY_LEDGER_HOUR), batch.totals, where)
        if batch.part == "lost" and batch.manifest_id not in lost_ids:
            raise RollupInvariantError(f"{where}: the batch is not lost")
    gone = {b.manifest_id for b in added if b.part == "lost"}
    per_hour: dict[str, int] = {}
    for hour, manifest_id in restored:
        # Only a batch held as retracted can come back, and it must be included again.
        if held.pop((hour, manifest_id), None) is None:
            raise RollupInvariantError(f"restored {manifest_id} in {hour} is not retracted")
        per_hour[hour] = per_hour.get(hour, 0) + 1
    for hour, count in per_hour.items():
        if included.get(hour, EMPTY_LEDGER_HOUR).batches < count:
            raise RollupInvariantError(f"hour {hour}: restored batches are not included again")
    return RetractedLedger(
        hours=dict(sorted(hours.items())),
        late={h: t for h, t in sorted(late.items()) if t.batches},
        lost=tuple(b for b in lost if b.manifest_id not in gone),
        retracted=tuple(held.values()) + tuple(replace(b, added_version=version) for b in added),
    )
