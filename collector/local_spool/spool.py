"""Local spool acceptance (PROTOCOL §3.4, ``ingest.acceptance = "local_spool"``).

The collector acknowledges a batch once its frame is fsync'd into a local directory, and
a lander (`collector.local_spool.lander`) runs the acceptance protocol (`collector.accept`) on
spooled frames every ``ingest.object_landing_interval_ms``. A restart lands whatever the
spool still holds. Single collector process only: with two, each would decide
acceptance locally.

**Acknowledgement order.** Every spooled frame's file name carries a sequence number
taken, under the spool's lock, when it was admitted; the file is fsync'd (and its
directory) before the answer. The lander lands in that order, also after a restart (the
names are rebuilt into the same order), so of two frames of one identity the one
answered 200 is the one the store accepts and the one answered 409 is quarantined,
whatever their hashes.

**What the answer can say.** Each identity has a winner: the ``frame_sha256`` the spool
landed for it (`collector.local_spool.landed`, remembered durably for the retry horizon), else
its first spooled frame. A frame with the winner's hash is a duplicate (200); any other
is a conflict (409 naming the winner, the frame spooled once so that landing quarantines
it: record written, blob kept). The one limit (PROTOCOL §3.4): when the store held the
identity before the spool did (another writer, or a landed memory forgotten past its
horizon or bound), the spooled frame is quarantined when it lands although it was
answered 200; its file is removed only once a HEAD saw the quarantine record.

Layout: ``<spool_dir>/pending/<identity-name>.<ack:020d>.<sha256>.lmbatch`` (written to
``tmp/``, fsync'd, renamed, directory fsync'd), where ``<identity-name>`` is
`protocol.keys.identity_name`, which keeps PROTOCOL §3's 255-byte rule (``agent=h-<sha256>``
for agent_ids too long to spell in hex). Names without ``<ack>`` (written before it
existed) land first, in name order. Frames that cannot be decoded any more, and files
whose names are not spool names, are moved to ``<spool_dir>/unreadable/`` for an operator.

Admission cost does not grow with the number of spooled files: the spool keeps, in
memory, its files in acknowledgement order and which hashes each identity has spooled
(built by one directory scan at start-up, kept exact by `add` and the lander's removals),
and asks the landed memory one indexed read. `add` runs shielded from its caller: a
request cancelled during the durable write does not stop the write or its bookkeeping,
so the counters and the index always describe exactly the files in ``pending/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from protocol import keys

from .landed import LandedMemory

log = structlog.get_logger("collector.spool")
SUFFIX = ".lmbatch"
_TAIL_RE = r"(?:\.(\d{20}))?\.([0-9a-f]{64})" + SUFFIX.replace(".", r"\.")


class SpoolFull(Exception):
    """The spool holds as much as it may; answer 503 until the lander catches up."""


@dataclass(frozen=True, slots=True)
class SpoolAnswer:
    duplicate: bool
    conflict_sha256: str | None  # the winner's hash, when this frame is not the winner


@dataclass(frozen=True, slots=True)
class Spooled:
    """One file in ``pending/``."""

    path: Path
    identity: keys.KeyIdentity
    sha: str
    size: int


def file_name(identity: keys.BatchIdentity, ack: int, sha: str) -> str:
    return keys.identity_name(identity, f".{ack:020d}.{keys.check_sha256(sha)}{SUFFIX}")


def parse_file_name(name: str) -> tuple[keys.KeyIdentity, int | None, str]:
    """``(identity, ack sequence or None, sha256)``; raises `keys.KeyFormatError`."""
    identity, (ack, sha) = keys.parse_identity_name(name, _TAIL_RE)
    return identity, (int(ack) if ack is not None else None), sha


class LocalSpool:
    def __init__(
        self,
        directory: Path,
        *,
        max_pending_bytes: int,
        retry_horizon_s: float,
        max_landed: int,
        max_pending_frames: int = 100_000,
        refuse_new: Callable[[], None] = lambda: None,
    ) -> None:
        """``refuse_new``: raises when no new frame may be spooled now (its exception
        reaches `add`'s caller; the collector's clock check)."""
        self._refuse_new = refuse_new
        self.pending_dir = directory / "pending"
        self.tmp_dir = directory / "tmp"
        self.unreadable_dir = directory / "unreadable"
        for made in (self.pending_dir, self.tmp_dir, self.unreadable_dir):
            made.mkdir(parents=True, exist_ok=True)
        for leftover in self.tmp_dir.iterdir():  # partial writes of a crashed process
            leftover.unlink(missing_ok=True)
        self.landed_memory = LandedMemory(
            directory, horizon_s=retry_horizon_s, max_entries=max_landed
        )
        _fsync_directory(directory)  # the memory's file, if it was just created
        self._max_bytes = max_pending_bytes
        self._max_frames = max_pending_frames
        self._lock = asyncio.Lock()
        self._files: dict[str, Spooled] = {}  # file name -> file, in acknowledgement order
        self._spooled: dict[keys.KeyIdentity, list[str]] = {}  # hashes, in the same order
        self._bytes = 0
        self._adding: set[asyncio.Task[SpoolAnswer]] = set()
        self._next_ack = self._scan()

    def _scan(self) -> int:
        """The one directory scan, at start-up: index ``pending/`` in acknowledgement order
        and return the next sequence number."""
        found: list[tuple[tuple[int, int, str], Spooled]] = []
        for path in self.pending_dir.iterdir():
            try:
                identity, ack, sha = parse_file_name(path.name)
            except keys.KeyFormatError:
                log.error("spool_file_not_a_spool_name", path=str(path))
                path.rename(self.unreadable_dir / path.name)
                continue
            order = (0, 0, path.name) if ack is None else (1, ack, "")
            found.append((order, Spooled(path, identity, sha, path.stat().st_size)))
        found.sort(key=lambda pair: pair[0])
        for _, spooled in found:
            self._note(spooled)
        return max((order[1] + 1 for order, _ in found if order[0]), default=0)

    @property
    def frames(self) -> int:
        return len(self._files)

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    def pending(self) -> list[Path]:
        """The spooled files, in acknowledgement order (read from memory, not the disk)."""
        return [spooled.path for spooled in self._files.values()]

    async def add(self, identity: keys.BatchIdentity, sha: str, frame: bytes) -> SpoolAnswer:
        """Make the frame durable, or say it already is. Raises `SpoolFull`, or what
        ``refuse_new`` raises (nothing spooled).

        Runs as its own task, shielded: cancelling the caller (a client gone mid-request)
        neither interrupts the write nor leaves a written file out of the counters."""
        self._refuse_new()
        task = asyncio.ensure_future(self._add(identity, sha, frame))
        self._adding.add(task)
        task.add_done_callback(self._added)
        return await asyncio.shield(task)

    def _added(self, task: asyncio.Task[SpoolAnswer]) -> None:
        self._adding.discard(task)
        if not task.cancelled() and task.exception() is not None:  # retrieved: no warning
            log.debug("spool_add_failed", error=str(task.exception()))

    async def _add(self, identity: keys.BatchIdentity, sha: str, frame: bytes) -> SpoolAnswer:
        key = identity.key_identity
        async with self._lock:  # one writer: answers and counters stay exact
            spooled = self._spooled.get(key, [])
            landed = await asyncio.to_thread(self.landed_memory.get, key)
            winner = landed if landed is not None else (spooled[0] if spooled else None)
            if sha == winner:
                return SpoolAnswer(duplicate=True, conflict_sha256=None)
            if sha not in spooled:  # a conflicting frame is spooled once, to be quarantined
                if len(self._files) >= self._max_frames or (
                    self._bytes + len(frame) > self._max_bytes
                ):
                    raise SpoolFull(f"spool holds {len(self._files)} frames, {self._bytes} bytes")
                name = file_name(identity, self._next_ack, sha)
                self._next_ack += 1
                await asyncio.to_thread(self._write_durably, name, sha, frame)
                self._note(Spooled(self.pending_dir / name, key, sha, len(frame)))
            return SpoolAnswer(duplicate=False, conflict_sha256=winner)

    def _note(self, spooled: Spooled) -> None:
        self._files[spooled.path.name] = spooled
        self._spooled.setdefault(spooled.identity, []).append(spooled.sha)
        self._bytes += spooled.size

    def _forget(self, path: Path) -> None:
        spooled = self._files.pop(path.name)
        hashes = self._spooled.get(spooled.identity, [])
        with contextlib.suppress(ValueError):
            hashes.remove(spooled.sha)
        if not hashes:
            self._spooled.pop(spooled.identity, None)
        self._bytes -= spooled.size

    def _write_durably(self, name: str, sha: str, frame: bytes) -> None:
        # Named by hash, not identity: the identity name may already use all 255 bytes.
        temporary = self.tmp_dir / f"{sha}.{os.getpid()}.tmp"
        target = self.pending_dir / name
        try:
            with temporary.open("wb") as handle:
                handle.write(frame)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, target)
            _fsync_directory(self.pending_dir)
        except BaseException:
            # Not acknowledged: leave nothing the index does not know about.
            temporary.unlink(missing_ok=True)
            target.unlink(missing_ok=True)
            raise

    async def landed(self, path: Path, identity: keys.KeyIdentity, sha: str, now_ns: int) -> None:
        """The store holds ``sha`` for ``identity`` (this frame's or, for a quarantined
        frame, the accepted one): remember it durably, then delete the spooled file."""
        await asyncio.to_thread(self.landed_memory.remember, identity, sha, now_ns)
        # Under the lock, and only after the memory holds it: an admission sees the frame
        # spooled or landed, never neither.
        async with self._lock:
            self._drop(path, None)

    async def set_aside(self, path: Path) -> None:
        """Move a frame that cannot be decoded to ``unreadable/`` for an operator (or, if
        its file is gone, forget it)."""
        async with self._lock:
            self._drop(path, self.unreadable_dir / path.name)

    def _drop(self, path: Path, destination: Path | None) -> None:
        """Delete (or move) a spooled file and forget it, with no await in between: a
        cancelled lander cannot leave the index naming a file that is gone."""
        if destination is None:
            path.unlink(missing_ok=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.rename(destination)
        self._forget(path)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Let admissions still writing (their requests may be gone) finish, then close."""
        if self._adding:
            await asyncio.wait(set(self._adding), timeout=timeout_s)
        self.landed_memory.close()


def _fsync_directory(path: Path) -> None:
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
