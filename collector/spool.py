"""Local spool acceptance (PROTOCOL §3.4, ``ingest.acceptance = "local_spool"``).

The collector acknowledges a batch once its frame is fsync'd into a local directory, and
a lander runs the same acceptance protocol (`collector.accept`) on spooled frames every
``ingest.object_landing_interval_ms``. A restart lands whatever the spool still holds.
Single collector process only: with two, each would decide acceptance locally.

What the answer can and cannot say here (documented trade-off of this mode):
- ``duplicate`` is true only when the same frame is still in this spool;
- an identity conflict is answered 409 only when the spool holds the other frame; a
  conflict with an already landed batch is found when landing and quarantined then,
  after the agent was told 200.

Layout: ``<spool_dir>/pending/<manifest-id>.<sha256>.lmbatch`` (written to ``tmp/``,
fsync'd, renamed, directory fsync'd). The name carries the identity and the hash, so
looking for duplicates and conflicts needs no reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import structlog

from protocol import keys
from protocol.clock import Clock
from protocol.frame import FrameError, decode_header

from .accept import AcceptanceUnavailable, Accepted, BatchAcceptor

log = structlog.get_logger("collector.spool")
SUFFIX = ".lmbatch"


class SpoolFull(Exception):
    """The spool holds as much as it may; answer 503 until the lander catches up."""


@dataclass(frozen=True, slots=True)
class SpoolAnswer:
    duplicate: bool
    conflict_sha256: str | None  # another frame for this identity is still spooled


class LocalSpool:
    def __init__(
        self, directory: Path, *, max_pending_bytes: int, max_pending_frames: int = 100_000
    ) -> None:
        self.pending_dir = directory / "pending"
        self.tmp_dir = directory / "tmp"
        self.pending_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        for leftover in self.tmp_dir.iterdir():  # partial writes of a crashed process
            leftover.unlink(missing_ok=True)
        self._max_bytes = max_pending_bytes
        self._max_frames = max_pending_frames
        self._lock = asyncio.Lock()
        files = self.pending()
        self._bytes = sum(path.stat().st_size for path in files)
        self._frames = len(files)

    def pending(self) -> list[Path]:
        return sorted(self.pending_dir.glob(f"*{SUFFIX}"))

    async def add(self, identity: keys.BatchIdentity, sha: str, frame: bytes) -> SpoolAnswer:
        """Make the frame durable, or say it already is. Raises `SpoolFull`."""
        async with self._lock:  # one writer: duplicate/conflict checks and counters stay exact
            spooled = [
                path.name[len(identity.manifest_id) + 1 : -len(SUFFIX)]
                for path in sorted(self.pending_dir.glob(f"{identity.manifest_id}.*{SUFFIX}"))
            ]
            if sha in spooled:
                return SpoolAnswer(duplicate=True, conflict_sha256=None)
            # A conflicting frame is spooled too: landing quarantines it (409 now, record later).
            conflict = spooled[0] if spooled else None
            if self._frames >= self._max_frames or self._bytes + len(frame) > self._max_bytes:
                raise SpoolFull(f"spool holds {self._frames} frames, {self._bytes} bytes")
            name = f"{identity.manifest_id}.{sha}{SUFFIX}"
            await asyncio.to_thread(self._write_durably, name, frame)
            self._frames += 1
            self._bytes += len(frame)
            return SpoolAnswer(duplicate=False, conflict_sha256=conflict)

    def _write_durably(self, name: str, frame: bytes) -> None:
        temporary = self.tmp_dir / f"{name}.{os.getpid()}.tmp"
        with temporary.open("wb") as handle:
            handle.write(frame)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.pending_dir / name)
        directory = os.open(self.pending_dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def remove(self, path: Path) -> None:
        size = path.stat().st_size
        path.unlink()
        self._frames -= 1
        self._bytes -= size


@dataclass
class LandingReport:
    landed: int = 0
    duplicates: int = 0
    conflicts: int = 0
    unreadable: int = 0
    deferred: int = 0


class SpoolLander:
    """Moves spooled frames into the store with the acceptance protocol."""

    def __init__(
        self, *, spool: LocalSpool, acceptor: BatchAcceptor, clock: Clock, interval_s: float
    ) -> None:
        self._spool = spool
        self._acceptor = acceptor
        self._clock = clock
        self._interval_s = interval_s

    async def land_once(self) -> LandingReport:
        report = LandingReport()
        for path in self._spool.pending():
            frame = await asyncio.to_thread(path.read_bytes)
            sha = hashlib.sha256(frame).hexdigest()
            try:
                header = decode_header(frame)
            except FrameError as exc:  # damaged on local disk after it was acknowledged
                log.error("spooled_frame_unreadable", path=str(path), error=str(exc))
                path.rename(path.with_suffix(".unreadable"))
                report.unreadable += 1
                continue
            try:
                result = await self._acceptor.accept(header, frame, sha)
            except AcceptanceUnavailable as exc:
                log.warning("landing_deferred", error=str(exc), pending=len(self._spool.pending()))
                report.deferred += 1
                break  # the store is not answering: try again next round, in order
            if isinstance(result, Accepted):
                report.duplicates += result.duplicate
                report.landed += not result.duplicate
            else:
                report.conflicts += 1
                log.warning("landing_found_conflict", quarantine_key=result.quarantine_key)
            self._spool.remove(path)
        return report

    async def run(self) -> None:
        """Land every interval until cancelled."""
        while True:
            try:
                await self.land_once()
            except Exception:
                log.exception("landing_failed")
            await self._clock.sleep(self._interval_s)

    async def drain(self, timeout_s: float) -> None:
        """A last landing round on shutdown; what is left lands after the restart."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self.land_once()
