"""Local spool acceptance (PROTOCOL §3.4, ``ingest.acceptance = "local_spool"``).

The collector acknowledges a batch once its frame is fsync'd into a local directory, and
a lander runs the same acceptance protocol (`collector.accept`) on spooled frames every
``ingest.object_landing_interval_ms``. A restart lands whatever the spool still holds.
Single collector process only: with two, each would decide acceptance locally.

What the answer can and cannot say here (documented trade-off of this mode):
- ``duplicate`` is true only when the same frame is still in this spool;
- an identity conflict is answered 409 only when the spool holds the other frame; a
  conflict with an already landed batch is found when landing and quarantined then,
  after the agent was told 200. The spooled frame is then removed only once a HEAD saw
  its quarantine record (PROTOCOL §3.4: record written, blob kept); until then it stays
  and the next round tries again (the protocol is idempotent).

Layout: ``<spool_dir>/pending/<identity-name>.<sha256>.lmbatch`` (written to ``tmp/``,
fsync'd, renamed, directory fsync'd), where ``<identity-name>`` is
`protocol.keys.identity_name` (``agent=h-<sha256>`` for agent_ids too long to spell in
a 255-byte file name, PROTOCOL §3). Frames that cannot be decoded any more are moved to
``<spool_dir>/unreadable/`` (same name) for an operator.

Admission cost does not grow with the number of spooled files (PROTOCOL §3.4): the spool
keeps, in memory, which hashes each identity has spooled (built by one directory scan at
start-up, kept exact under the lock by `add` and `remove`), so duplicate and conflict
checks read no directory.
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
from store.base import ObjectStore
from store.errors import NotFound, StoreError

from .accept import AcceptanceUnavailable, Accepted, BatchAcceptor

log = structlog.get_logger("collector.spool")
SUFFIX = ".lmbatch"
_TAIL_BYTES = 1 + 64 + len(SUFFIX)  # ".<sha256>.lmbatch"


class SpoolFull(Exception):
    """The spool holds as much as it may; answer 503 until the lander catches up."""


@dataclass(frozen=True, slots=True)
class SpoolAnswer:
    duplicate: bool
    conflict_sha256: str | None  # another frame for this identity is still spooled


def _file_name(identity: keys.BatchIdentity, sha: str) -> str:
    return keys.identity_name(identity, f".{keys.check_sha256(sha)}{SUFFIX}")


def _split_name(name: str) -> tuple[str, str] | None:
    """``(identity part, sha256)`` of a spool file name; ``None`` for anything else."""
    if not name.endswith(SUFFIX) or len(name) <= _TAIL_BYTES:
        return None
    sha = name[-_TAIL_BYTES + 1 : -len(SUFFIX)]
    try:
        keys.check_sha256(sha)
    except keys.KeyFormatError:
        return None
    return (name[:-_TAIL_BYTES], sha) if name[-_TAIL_BYTES] == "." else None


class LocalSpool:
    def __init__(
        self, directory: Path, *, max_pending_bytes: int, max_pending_frames: int = 100_000
    ) -> None:
        self.pending_dir = directory / "pending"
        self.tmp_dir = directory / "tmp"
        self.unreadable_dir = directory / "unreadable"
        for made in (self.pending_dir, self.tmp_dir, self.unreadable_dir):
            made.mkdir(parents=True, exist_ok=True)
        for leftover in self.tmp_dir.iterdir():  # partial writes of a crashed process
            leftover.unlink(missing_ok=True)
        self._max_bytes = max_pending_bytes
        self._max_frames = max_pending_frames
        self._lock = asyncio.Lock()
        self._spooled: dict[str, list[str]] = {}  # identity part of the name -> hashes
        self._bytes = 0
        self._frames = 0
        for path in self.pending():  # the one directory scan: at start-up
            self._note(path.name, path.stat().st_size)

    @property
    def frames(self) -> int:
        return self._frames

    def pending(self) -> list[Path]:
        return sorted(self.pending_dir.glob(f"*{SUFFIX}"))

    async def add(self, identity: keys.BatchIdentity, sha: str, frame: bytes) -> SpoolAnswer:
        """Make the frame durable, or say it already is. Raises `SpoolFull`."""
        name = _file_name(identity, sha)
        async with self._lock:  # one writer: duplicate/conflict checks and counters stay exact
            spooled = self._spooled.get(name[:-_TAIL_BYTES], [])
            if sha in spooled:
                return SpoolAnswer(duplicate=True, conflict_sha256=None)
            # A conflicting frame is spooled too: landing quarantines it (409 now, record later).
            conflict = spooled[0] if spooled else None
            if self._frames >= self._max_frames or self._bytes + len(frame) > self._max_bytes:
                raise SpoolFull(f"spool holds {self._frames} frames, {self._bytes} bytes")
            await asyncio.to_thread(self._write_durably, name, sha, frame)
            self._note(name, len(frame))
            return SpoolAnswer(duplicate=False, conflict_sha256=conflict)

    def _note(self, name: str, size: int) -> None:
        parts = _split_name(name)
        if parts is not None:
            self._spooled.setdefault(parts[0], []).append(parts[1])
        self._frames += 1
        self._bytes += size

    def _forget(self, name: str, size: int) -> None:
        parts = _split_name(name)
        if parts is not None:
            hashes = self._spooled.get(parts[0], [])
            with contextlib.suppress(ValueError):
                hashes.remove(parts[1])
            if not hashes:
                self._spooled.pop(parts[0], None)
        self._frames -= 1
        self._bytes -= size

    def _write_durably(self, name: str, sha: str, frame: bytes) -> None:
        # Named by hash, not identity: the identity name may already use all 255 bytes.
        temporary = self.tmp_dir / f"{sha}.{os.getpid()}.tmp"
        with temporary.open("wb") as handle:
            handle.write(frame)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.pending_dir / name)
        _fsync_directory(self.pending_dir)

    def remove(self, path: Path) -> None:
        """Delete a landed (or quarantined) frame."""
        size = path.stat().st_size
        path.unlink()
        self._forget(path.name, size)

    def set_aside(self, path: Path) -> None:
        """Move a frame that cannot be decoded to ``unreadable/`` for an operator."""
        size = path.stat().st_size
        path.rename(self.unreadable_dir / path.name)
        self._forget(path.name, size)


def _fsync_directory(path: Path) -> None:
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


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
        self,
        *,
        spool: LocalSpool,
        acceptor: BatchAcceptor,
        store: ObjectStore,
        clock: Clock,
        interval_s: float,
    ) -> None:
        self._spool = spool
        self._acceptor = acceptor
        self._store = store
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
                self._spool.set_aside(path)
                report.unreadable += 1
                continue
            try:
                result = await self._acceptor.accept(header, frame, sha)
            except AcceptanceUnavailable as exc:
                log.warning("landing_deferred", error=str(exc), pending=self._spool.frames)
                report.deferred += 1
                break  # the store is not answering: try again next round, in order
            if isinstance(result, Accepted):
                report.duplicates += result.duplicate
                report.landed += not result.duplicate
            elif await self._recorded(result.quarantine_key):
                report.conflicts += 1
                log.warning("landing_found_conflict", quarantine_key=result.quarantine_key)
            else:
                # The agent was told 200: this frame is the only trace of the conflict.
                log.warning("landing_conflict_not_recorded", quarantine_key=result.quarantine_key)
                report.deferred += 1
                continue
            self._spool.remove(path)
        return report

    async def _recorded(self, quarantine_key: str) -> bool:
        """Whether the quarantine record exists (a HEAD: the answer alone does not say)."""
        try:
            await self._store.head(quarantine_key)
        except NotFound:
            return False
        except StoreError as exc:
            log.warning("quarantine_check_failed", key=quarantine_key, error=str(exc))
            return False
        return True

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
