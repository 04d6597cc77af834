"""Agent load for chaos runs, and the book of everything the agents were told.

`LoadDriver` runs ``lanes`` synthetic fleets (`agent.run_fleet`) side by side, each with
its own durable spool, wave after wave until told to stop; every wave is a fresh
`LoadSpec` derived from the run's seed (new identities), with duplicates and identity
conflicts. ``twins`` lanes replay another lane's waves byte for byte, at the same time,
through the collectors in another order: many copies of one batch race across
collectors. `LoadDriver.drain` finally re-sends whatever the spools still hold.

`AckBook` keeps, per delivery, the agent's view: what it sent, the answer, when the
attempt that got a 200 was sent and answered (for the outage check), and the value sums
of every frame sent (the ground truth the rollup must reproduce); and the orphan blobs
scenarios planted (for the GC coverage figure).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from agent import (
    DeliveryRecord,
    LoadSpec,
    Outcome,
    RunOptions,
    SpoolSettings,
    UploadPolicy,
    run_fleet,
)
from agent.truth import BatchKind
from protocol.keys import BatchIdentity
from store.retry import Backoff

log = structlog.get_logger("chaos.load")
NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Ack:
    """A 200 an agent received."""

    identity: BatchIdentity
    frame_sha256: str
    answered_sha256: str | None
    manifest_key: str | None
    duplicate: bool
    sent_at: float  # time.monotonic() of the attempt that got the 200
    answered_at: float


@dataclass(frozen=True, slots=True)
class FrameFacts:
    point_count: int
    value_sum: float


@dataclass
class AckBook:
    acks: list[Ack] = field(default_factory=list)
    conflicts: list[tuple[BatchIdentity, str, str | None]] = field(default_factory=list)
    frames: dict[str, FrameFacts] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    conflict_frames: set[str] = field(default_factory=set)
    """Hashes of the frames injected as identity conflicts: one still in a spool when its
    run ended comes back as "recovered", and its 409 is then just as expected."""
    waves: int = 0
    audited_unexpected: int = 0
    planted: dict[str, int] = field(default_factory=dict)
    """Orphan blobs a scenario planted (hash -> wall time ns): what the GC should delete
    unless an agent sends the frame after all."""

    def record(self, record: DeliveryRecord) -> None:
        now = time.monotonic()
        truth, result = record.truth, record.result
        if truth.kind is BatchKind.CONFLICT:
            self.conflict_frames.add(truth.frame_sha256)
        problem = self._unexpected(record)
        if problem is not None:
            self.unexpected.append(problem)
        self.frames.setdefault(truth.frame_sha256, FrameFacts(truth.point_count, truth.value_sum))
        self.outcomes[result.outcome.value] += 1
        self.kinds[truth.kind.value] += 1
        response: dict[str, Any] = result.response if isinstance(result.response, dict) else {}
        if result.outcome.delivered:
            latency = result.ack_latency_s or 0.0
            self.acks.append(
                Ack(
                    truth.identity,
                    truth.frame_sha256,
                    response.get("frame_sha256"),
                    response.get("manifest_key"),
                    bool(response.get("duplicate")),
                    now - latency,
                    now,
                )
            )
        elif result.outcome.value == "conflict":
            self.conflicts.append(
                (truth.identity, truth.frame_sha256, response.get("accepted_frame_sha256"))
            )

    def _unexpected(self, record: DeliveryRecord) -> str | None:
        """What the agent contract calls unexpected (as `agent.summary` does), knowing
        which recovered frames were injected conflicts."""
        kind, outcome = record.truth.kind, record.result.outcome
        where = f"{kind.value} {record.truth.identity} ({record.truth.frame_sha256[:12]})"
        conflict = kind is BatchKind.CONFLICT or record.truth.frame_sha256 in self.conflict_frames
        if outcome is Outcome.POISON:
            return f"{where} parked as poison: HTTP {record.result.status} {record.result.response}"
        if outcome is Outcome.CONFLICT and not conflict:
            return f"{where} parked as an identity conflict"
        if conflict and outcome.delivered:
            return f"{where} accepted although its identity was already taken"
        if kind is BatchKind.DUPLICATE and outcome is Outcome.ACCEPTED:
            return f"{where} answered as new although it was delivered before"
        return None

    def take_unexpected(self) -> list[str]:
        """The unexpected answers not yet handed to an audit round."""
        fresh = self.unexpected[self.audited_unexpected :]
        self.audited_unexpected = len(self.unexpected)
        return fresh

    @property
    def batches_sent(self) -> int:
        return sum(self.kinds.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "waves": self.waves,
            "deliveries": self.batches_sent,
            "by_kind": dict(sorted(self.kinds.items())),
            "by_outcome": dict(sorted(self.outcomes.items())),
            "acknowledged": len(self.acks),
            "acknowledged_identities": len({a.identity for a in self.acks}),
            "conflicts_answered": len(self.conflicts),
            "distinct_frames": len(self.frames),
            "unexpected": self.unexpected[:20],
        }


@dataclass(frozen=True, slots=True)
class LoadShape:
    lanes: int = 2
    twins: int = 0
    agents: int = 4
    batches: int = 6
    points_per_batch: int = 40
    duplicate_rate: float = 0.15
    conflict_rate: float = 0.08
    concurrency: int = 4
    wave_pause_s: float = 1.0
    max_waves: int = 10_000


class LoadDriver:
    def __init__(
        self,
        *,
        work_dir: Path,
        seed: int,
        shape: LoadShape,
        urls: list[str],
        book: AckBook,
        name: str = "load",
    ) -> None:
        self.work_dir = work_dir
        self.seed = seed
        self.shape = shape
        self.urls = urls
        self.book = book
        self.name = name
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        shape = self.shape
        for lane in range(shape.lanes):
            self._tasks.append(asyncio.create_task(self._lane(lane, twin_of=None)))
        for twin in range(shape.twins):
            lane = shape.lanes + twin
            self._tasks.append(asyncio.create_task(self._lane(lane, twin_of=twin % shape.lanes)))

    async def stop(self, timeout_s: float = 120.0) -> None:
        """Finish the wave in hand (bounded), then return."""
        self._stop.set()
        if not self._tasks:
            return
        done, pending = await asyncio.wait(self._tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                log.error("chaos_lane_failed", error=repr(task.exception()))
        self._tasks = []

    async def drain(self, *, rounds: int = 3) -> None:
        """Re-send what every lane's spool still holds (recovered frames)."""
        lanes = self.shape.lanes + self.shape.twins
        await asyncio.gather(
            *(self._wave(lane, wave=None, twin_of=None, rounds=rounds) for lane in range(lanes))
        )

    async def _lane(self, lane: int, *, twin_of: int | None) -> None:
        wave = 0
        while not self._stop.is_set() and wave < self.shape.max_waves:
            await self._wave(lane, wave=wave, twin_of=twin_of, rounds=2)
            wave += 1
            try:  # a pause between waves bounds the volume (and so GC and audit costs)
                await asyncio.wait_for(self._stop.wait(), self.shape.wave_pause_s)
            except TimeoutError:
                pass

    async def _wave(self, lane: int, *, wave: int | None, twin_of: int | None, rounds: int) -> None:
        shape = self.shape
        source = lane if twin_of is None else twin_of
        if wave is None:  # drain: nothing new, only what the spool holds
            spec = LoadSpec(agents=1, batches=0, seed=self.seed)
        else:
            spec = LoadSpec(
                agents=shape.agents,
                batches=shape.batches,
                points_per_batch=shape.points_per_batch,
                duplicate_rate=shape.duplicate_rate,
                conflict_rate=shape.conflict_rate,
                seed=_wave_seed(self.seed, self.name, source, wave),
                # From the seed, not from when the wave runs: a twin builds the same
                # frames, and the same seed replays the same keys (so the same faults).
                start_ns=1_760_000_000 * NS
                + _wave_seed(self.seed, "t", source, wave) % (48 * 3600) * NS,
                agent_prefix=f"chaos-{self.name}-l{source}-w{wave}",
            )
        urls = self.urls[lane % len(self.urls) :] + self.urls[: lane % len(self.urls)]
        options = RunOptions(
            policy=UploadPolicy(
                concurrency=shape.concurrency,
                request_timeout_s=15.0,
                backoff=Backoff(attempts=4, base_s=0.2, cap_s=2.0),
                max_retry_after_s=2.0,
            ),
            max_rounds=rounds,
            round_delay_s=1.0,
        )
        try:
            await run_fleet(
                urls=urls,
                token=None,
                spool=SpoolSettings(
                    directory=self.work_dir / f"spool-{self.name}-{lane}", fsync=False
                ),
                spec=spec,
                options=options,
                on_record=self.book.record,
            )
        except Exception as exc:  # a lane must not take the run down: record and go on
            log.error("chaos_wave_failed", lane=lane, wave=wave, error=repr(exc))
            self.book.unexpected.append(f"wave {self.name}/{lane}/{wave} failed: {exc!r}")
            return
        self.book.waves += 1


def _wave_seed(seed: int, name: str, lane: int, wave: int) -> int:
    digest = hashlib.sha256(f"{seed}/{name}/{lane}/{wave}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


__all__ = ["Ack", "AckBook", "FrameFacts", "LoadDriver", "LoadShape"]
