"""Synthetic load: N agents x M batches x K points, deterministic from a seed.

Every agent has a host, a region and a fixed set of series (CPU per core, memory, HTTP
requests by method and status, disk bytes); each point picks one of them. Everything —
agent ids, boot ids, timestamps, values, and which batches get a duplicate or a
conflict — comes from ``random.Random`` streams seeded by strings derived from
`LoadSpec.seed` and the (agent, batch) position, so the same spec yields the same frames,
byte for byte, in any order and on any machine.

- A **duplicate** is the original frame's exact bytes, sent again after the original
  was delivered (the collector must answer 200 duplicate).
- A **conflict** has the original's agent_id, boot_id and sequence range but other
  values, hence another frame_sha256 (the collector must answer 409). It is sent only
  after the original was delivered, so which frame the collectors hold is deterministic.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from agent.truth import BatchKind, PlannedFrame, finite_sum
from protocol.frame_encode import encode_frame, points_table
from protocol.keys import BatchIdentity

NS_PER_S = 1_000_000_000
REGIONS = ("us-east-1", "eu-west-1", "ap-southeast-2")
HTTP_METHODS = ("GET", "POST", "PUT")
HTTP_STATUSES = ("200", "404", "500")


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """A synthetic fleet. ``start_ns`` is the timestamp of every agent's first point;
    agent ``a``'s points are ``interval_ns`` apart, offset by ``a`` milliseconds."""

    agents: int = 1
    batches: int = 10
    points_per_batch: int = 100
    duplicate_rate: float = 0.0
    conflict_rate: float = 0.0
    seed: int = 0
    start_ns: int = 1_760_000_000 * NS_PER_S
    interval_ns: int = NS_PER_S
    agent_prefix: str = "synthetic-agent"
    compress: bool = True
    zstd_level: int = 3

    def __post_init__(self) -> None:
        if self.agents < 1 or self.batches < 0 or self.points_per_batch < 1:
            raise ValueError("need agents >= 1, batches >= 0, points_per_batch >= 1")
        for name in ("duplicate_rate", "conflict_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {rate}")
        if self.start_ns < 0 or self.interval_ns < 1:
            raise ValueError("need start_ns >= 0 and interval_ns >= 1")

    @property
    def total_batches(self) -> int:
        return self.agents * self.batches

    def agent_id(self, agent: int) -> str:
        return f"{self.agent_prefix}-{agent:04d}"

    def boot_id(self, agent: int) -> uuid.UUID:
        rng = random.Random(f"{self.seed}/boot/{agent}")
        return uuid.UUID(bytes=rng.randbytes(16), version=4)


@dataclass(frozen=True, slots=True)
class _Series:
    metric: str
    labels: dict[str, str]
    low: float
    high: float


def _agent_series(spec: LoadSpec, agent: int) -> list[_Series]:
    rng = random.Random(f"{spec.seed}/series/{agent}")
    base = {"host": f"host-{agent:04d}", "region": REGIONS[rng.randrange(len(REGIONS))]}
    series = [
        _Series("cpu_usage_percent", {**base, "cpu": str(cpu)}, 0.0, 100.0)
        for cpu in range(rng.randint(2, 4))
    ]
    series.append(_Series("memory_used_bytes", dict(base), 2.0e8, 8.0e9))
    series += [
        _Series("http_requests_total", {**base, "method": method, "status": status}, 0.0, 50.0)
        for method in HTTP_METHODS
        for status in HTTP_STATUSES
    ]
    series.append(_Series("disk_written_bytes_total", {**base, "device": "sda"}, 0.0, 1.0e7))
    return series


class SyntheticLoad:
    """Builds the frames of a `LoadSpec`. Frames are built on demand (`originals` is a
    generator), so a large fleet never sits in memory at once."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self._series = [_agent_series(spec, a) for a in range(spec.agents)]

    def originals(self) -> Iterator[PlannedFrame]:
        """Every original frame, batch 0 of every agent first, then batch 1, ..."""
        for batch in range(self.spec.batches):
            for agent in range(self.spec.agents):
                yield self.original(agent, batch)

    def original(self, agent: int, batch: int) -> PlannedFrame:
        rng = random.Random(f"{self.spec.seed}/batch/{agent}/{batch}")
        # Decided first, from the same stream, so the plan does not depend on K.
        want_duplicate = rng.random() < self.spec.duplicate_rate
        want_conflict = rng.random() < self.spec.conflict_rate
        return self._frame(BatchKind.ORIGINAL, agent, batch, rng, want_duplicate, want_conflict)

    def duplicate_of(self, original: PlannedFrame) -> PlannedFrame:
        """The same bytes, as a DUPLICATE."""
        return PlannedFrame(
            BatchKind.DUPLICATE,
            original.identity,
            original.frame,
            original.frame_sha256,
            original.point_count,
            original.value_sum,
            source_index=original.source_index,
        )

    def conflict_of(self, original: PlannedFrame) -> PlannedFrame:
        """Other values under ``original``'s identity (same agent, boot, seq range)."""
        if original.source_index is None:
            raise ValueError("only synthetic originals have a conflict twin")
        agent, batch = original.source_index
        rng = random.Random(f"{self.spec.seed}/conflict/{agent}/{batch}")
        conflict = self._frame(BatchKind.CONFLICT, agent, batch, rng, False, False)
        if conflict.frame_sha256 == original.frame_sha256:  # pragma: no cover - 2^-256
            raise AssertionError("conflict frame equals its original")
        return conflict

    def followups(self, delivered: PlannedFrame) -> list[PlannedFrame]:
        """What to send once ``delivered`` (an original) got its 200."""
        extra: list[PlannedFrame] = []
        if delivered.kind is BatchKind.ORIGINAL and delivered.want_duplicate:
            extra.append(self.duplicate_of(delivered))
        if delivered.kind is BatchKind.ORIGINAL and delivered.want_conflict:
            extra.append(self.conflict_of(delivered))
        return extra

    def _frame(
        self,
        kind: BatchKind,
        agent: int,
        batch: int,
        rng: random.Random,
        want_duplicate: bool,
        want_conflict: bool,
    ) -> PlannedFrame:
        spec = self.spec
        k = spec.points_per_batch
        first_point = batch * k
        agent_offset_ns = agent * 1_000_000
        series = self._series[agent]
        ts_ns: list[int] = []
        metrics: list[str] = []
        values: list[float] = []
        labels: list[dict[str, str]] = []
        for i in range(k):
            chosen = series[rng.randrange(len(series))]
            ts_ns.append(spec.start_ns + agent_offset_ns + (first_point + i) * spec.interval_ns)
            metrics.append(chosen.metric)
            # Rounded to milli-units: readable in queries, exact enough for sums.
            values.append(round(rng.uniform(chosen.low, chosen.high), 3))
            labels.append(chosen.labels)
        identity = BatchIdentity(
            spec.agent_id(agent), spec.boot_id(agent), first_point, first_point + k - 1
        )
        frame = encode_frame(
            agent_id=identity.agent_id,
            boot_id=identity.boot_id,
            seq_start=identity.seq_start,
            points=points_table(ts_ns, metrics, values, labels),
            compress=spec.compress,
            zstd_level=spec.zstd_level,
        )
        return PlannedFrame(
            kind,
            identity,
            frame,
            hashlib.sha256(frame).hexdigest(),
            k,
            finite_sum(values),
            want_duplicate=want_duplicate,
            want_conflict=want_conflict,
            source_index=(agent, batch),
        )
