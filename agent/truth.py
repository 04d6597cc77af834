"""What an agent run meant to send, and what became of it: the ground truth that tests,
the demo and benchmarks check collectors and rollups against.

A `PlannedFrame` is one frame to send (bytes already built). `GroundTruth` records every
frame handed to the spool (`record_sent`) and the final outcome of each delivery
(`record_outcome`); `GroundTruth.accepted` is what the collectors should now hold: per
identity, the frame that got a 200. Value sums use `math.fsum`, so they do not depend on
the order batches were delivered in.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from protocol.keys import BatchIdentity


class BatchKind(enum.StrEnum):
    ORIGINAL = "original"  # a new frame under a fresh identity
    DUPLICATE = "duplicate"  # byte-identical resend of a delivered ORIGINAL
    CONFLICT = "conflict"  # different points under a delivered ORIGINAL's identity
    RECOVERED = "recovered"  # found pending in the spool at start (an earlier run's)


@dataclass(frozen=True, slots=True)
class PlannedFrame:
    """One frame to send. ``point_count``/``value_sum`` describe its points (value_sum is
    `math.fsum` of the finite values); ``want_duplicate``/``want_conflict`` ask the runner
    to send a duplicate / conflicting frame once this one is delivered."""

    kind: BatchKind
    identity: BatchIdentity
    frame: bytes
    frame_sha256: str
    point_count: int
    value_sum: float
    want_duplicate: bool = False
    want_conflict: bool = False
    source_index: tuple[int, int] | None = None  # (agent index, batch index) when synthetic


@dataclass(frozen=True, slots=True)
class TruthRecord:
    kind: BatchKind
    identity: BatchIdentity
    frame_sha256: str
    point_count: int
    value_sum: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "agent_id": self.identity.agent_id,
            "boot_id": str(self.identity.boot_id),
            "seq_start": self.identity.seq_start,
            "seq_end": self.identity.seq_end,
            "frame_sha256": self.frame_sha256,
            "point_count": self.point_count,
            "value_sum": self.value_sum,
        }


@dataclass(frozen=True, slots=True)
class Totals:
    batches: int
    points: int
    value_sum: float


class GroundTruth:
    """Append-only record of one run (not thread-safe; the runner calls it from its
    event loop)."""

    def __init__(self) -> None:
        self.sent: list[TruthRecord] = []
        self._outcomes: dict[tuple[BatchKind, BatchIdentity, str], str] = {}

    def record_sent(self, record: TruthRecord) -> None:
        """``record`` was appended to the spool: it will be delivered or parked."""
        self.sent.append(record)

    def record_outcome(self, record: TruthRecord, outcome: str) -> None:
        """The final outcome (an `agent.uploader.Outcome` value) of ``record``'s delivery."""
        self._outcomes[(record.kind, record.identity, record.frame_sha256)] = outcome

    def outcome_of(self, record: TruthRecord) -> str | None:
        return self._outcomes.get((record.kind, record.identity, record.frame_sha256))

    @property
    def originals(self) -> dict[BatchIdentity, TruthRecord]:
        """Every ORIGINAL or RECOVERED frame sent, by identity."""
        return {
            r.identity: r for r in self.sent if r.kind in (BatchKind.ORIGINAL, BatchKind.RECOVERED)
        }

    @property
    def accepted(self) -> dict[BatchIdentity, TruthRecord]:
        """Per identity, the frame that got a 200: what the collectors now hold from
        this run (a frame delivered as a duplicate of an earlier run counts too)."""
        held: dict[BatchIdentity, TruthRecord] = {}
        for record in self.sent:
            if self.outcome_of(record) in ("accepted", "duplicate"):
                held.setdefault(record.identity, record)
        return held

    @property
    def conflicts_sent(self) -> list[TruthRecord]:
        return [r for r in self.sent if r.kind is BatchKind.CONFLICT]

    @property
    def duplicates_sent(self) -> list[TruthRecord]:
        return [r for r in self.sent if r.kind is BatchKind.DUPLICATE]

    def totals(self, records: Iterable[TruthRecord] | None = None) -> Totals:
        """Batches, points and value sum of ``records`` (default: `accepted`)."""
        chosen = list(self.accepted.values() if records is None else records)
        return Totals(
            batches=len(chosen),
            points=sum(r.point_count for r in chosen),
            value_sum=math.fsum(r.value_sum for r in chosen),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every sent frame with its outcome, and the accepted totals."""
        totals = self.totals()
        return {
            "sent": [{**r.to_dict(), "outcome": self.outcome_of(r)} for r in self.sent],
            "accepted_totals": {
                "batches": totals.batches,
                "points": totals.points,
                "value_sum": totals.value_sum,
            },
        }


def truth_record(planned: PlannedFrame) -> TruthRecord:
    return TruthRecord(
        planned.kind,
        planned.identity,
        planned.frame_sha256,
        planned.point_count,
        planned.value_sum,
    )


def finite_sum(values: Iterable[float]) -> float:
    """`math.fsum` of the finite values (NaN and ±Inf are skipped, as rollups do)."""
    return math.fsum(v for v in values if math.isfinite(v))
