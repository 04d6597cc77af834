"""The store `bench.gc` starts from: accepted batches, identity conflicts and planted
orphan raw blobs, written at real time the way collectors write them (see `bench.gc`)."""

from __future__ import annotations

import argparse
import hashlib
import random
import uuid
from dataclasses import dataclass, field

from collector.accept import Accepted, BatchAcceptor, IdentityConflictFound
from index.log_writer import IndexLogWriter
from index.rows import blob_row
from protocol import keys
from protocol.clock import SystemClock
from protocol.frame import decode_header
from protocol.frame_encode import encode_frame, points_table
from reconciler.gc.bounded import for_each_bounded
from store.base import ObjectStore

BOOT = uuid.UUID("9c0b0e5e-0000-4000-8000-000000000022")
POINTS = 10
CONCURRENCY = 16


@dataclass
class Seeded:
    accepted: int = 0
    conflicts: int = 0
    kept: set[str] = field(default_factory=set)
    """Hashes of blobs a record references: every one must survive."""
    orphans: set[str] = field(default_factory=set)
    """Hashes of the planted orphans: every one must be deleted."""
    kinds: dict[str, int] = field(default_factory=dict)
    """Planted orphans by kind."""
    orphan_bundles: set[str] = field(default_factory=set)
    """Hashes of the planted orphan bundles (`bench.gc_bundles`): every one must go."""
    bundle_bytes: int = 0
    bundle_frames: int = 0

    @property
    def candidates(self) -> int:
        return len(self.orphans) + len(self.orphan_bundles)

    def describe(self) -> str:
        kinds = ", ".join(f"{n} {kind}" for kind, n in self.kinds.items())
        bundles = (
            f", {len(self.orphan_bundles)} orphan bundles of {self.bundle_frames} frames "
            f"({self.bundle_bytes / len(self.orphan_bundles) / 2**20:.2f} MiB each; half "
            "with a blob log row)"
            if self.orphan_bundles
            else ""
        )
        return (
            f"{self.accepted} accepted batches ({self.conflicts} with a quarantined twin), "
            f"{len(self.orphans)} orphan frame blobs: {kinds or 'none'}{bundles}"
        )


def frame(agent_id: str, seq_start: int, variant: int = 0) -> bytes:
    """A valid frame of ``POINTS`` points; another ``variant`` is another frame of the same
    identity (a twin). The GC's proof reads a blob's identity from its header."""
    now = SystemClock().now_ns()
    table = points_table(
        [now + n for n in range(POINTS)],
        ["bench.gc"] * POINTS,
        [float(variant * 1000 + n) for n in range(POINTS)],
        [None] * POINTS,
    )
    return encode_frame(agent_id=agent_id, boot_id=BOOT, seq_start=seq_start, points=table)


def agent(n: int) -> str:
    return f"gcbench-{n % 16:02d}"


def long_agent(n: int) -> str:
    """A 128-byte agent id: its key segment is the ``h-`` form, and the proof also reads
    and lists the long form (PROTOCOL §3)."""
    return f"gcbench-long-{n:04d}-".ljust(128, "x")


async def seed(store: ObjectStore, args: argparse.Namespace, *, rng: random.Random) -> Seeded:
    """Write the batches, conflicts and orphans of ``args`` (see `bench.gc`)."""
    if args.twin_orphans > args.accepted - args.conflicts:
        raise ValueError("--twin-orphans must be <= --accepted - --conflicts")
    if args.twin_orphans + args.long_agent_orphans > args.orphans:
        raise ValueError("--twin-orphans + --long-agent-orphans must be <= --orphans")
    clock = SystemClock()
    log = IndexLogWriter(store=store, clock=clock, rng=rng, writer_id="bench-gc-collector")
    acceptor = BatchAcceptor(
        store=store, collector_id="bench-gc-collector", clock=clock, rng=rng, index_log=log
    )
    seeded = Seeded()

    async def accept(body: bytes) -> Accepted | IdentityConflictFound:
        sha = hashlib.sha256(body).hexdigest()
        return await acceptor.accept(decode_header(body), body, sha)

    async def one_batch(i: int) -> None:
        result = await accept(frame(agent(i), i * POINTS))
        if not isinstance(result, Accepted) or result.duplicate:
            raise RuntimeError(f"batch {i} not newly accepted: {result}")
        seeded.kept.add(result.manifest.frame_sha256)

    await for_each_bounded(range(args.accepted), one_batch, CONCURRENCY)
    seeded.accepted = args.accepted

    async def one_conflict(i: int) -> None:
        result = await accept(frame(agent(i), i * POINTS, variant=1))
        if not isinstance(result, IdentityConflictFound):
            raise RuntimeError(f"twin of batch {i} was not quarantined: {result}")
        seeded.kept.add(result.submitted_frame_sha256)

    await for_each_bounded(range(args.conflicts), one_conflict, CONCURRENCY)
    seeded.conflicts = args.conflicts

    planted: list[tuple[str, bytes, bool]] = []
    for n in range(args.twin_orphans):  # twins of accepted batches, no quarantine record
        i = args.conflicts + n
        planted.append(("twin of an accepted batch", frame(agent(i), i * POINTS, 2), False))
    for n in range(args.long_agent_orphans):
        planted.append(("128-byte agent id", frame(long_agent(n), 0), n % 2 == 0))
    fresh = args.orphans - len(planted)
    for n in range(fresh):  # identities no manifest ever came for
        logged = n % 2 == 0
        kind = "fresh identity, blob log row" if logged else "fresh identity, no log row"
        planted.append((kind, frame(f"gcbench-orphan-{n % 50:02d}", n * POINTS), logged))

    async def plant(item: tuple[str, bytes, bool]) -> None:
        _kind, body, logged = item
        sha = hashlib.sha256(body).hexdigest()
        await store.put(keys.raw_blob_key(sha), body, if_none_match=True)
        if logged:
            log.append(blob_row(sha, clock.now_ns()))
        seeded.orphans.add(sha)

    await for_each_bounded(planted, plant, CONCURRENCY)
    for kind, _body, _logged in planted:
        seeded.kinds[kind] = seeded.kinds.get(kind, 0) + 1
    await log.flush()
    if log.buffered:
        raise RuntimeError(f"the index log kept {log.buffered} rows unflushed")
    return seeded
