"""A durable on-disk spool of frames: nothing is sent before it is here, nothing leaves
it before a 200.

Layout of a spool directory (one process owns it at a time, see `SpoolLocked`)::

    LOCK                               flock held while the spool is open
    tmp/                               half-written files; emptied on open
    pending/<name>.lmbatch             exact frame bytes, waiting to be sent
    parked/conflict/<name>.lmbatch     409: kept for an operator, never retried
    parked/conflict/<name>.json        sidecar: status, response, reason, identity
    parked/poison/<name>.lmbatch       400/413/415 (or unreadable in the spool)
    parked/poison/<name>.json

``<name>`` is ``<number:012d>-<sha256[:12]>``: the number orders entries (FIFO) and is
never reused within a spool; the hash prefix helps whoever reads the directory.

Contracts:
- `Spool.append` writes the frame to ``tmp/``, fsyncs it, renames it into ``pending/``
  and fsyncs ``pending/``; only then does it return. A frame the producer was told about
  survives kill -9 and power loss; a crash mid-append leaves at most a file in ``tmp/``,
  which the next `Spool.open` removes. Readers never see a partial frame in ``pending/``.
- Frames are stored as the exact bytes that will be sent, so a frame recovered after a
  crash is re-sent byte-identically under its original identity (never re-framed).
- `Spool.delete` (after a 200) does not fsync the directory: a crash may resurrect the
  entry, which is then re-sent and answered "200 duplicate" — harmless by PROTOCOL §2.
- `Spool.park` writes the sidecar atomically first, then renames the frame. A crash in
  between leaves the frame pending (it is re-sent and parked again) and an orphan sidecar,
  which `Spool.open` removes.
- Bounded: `append` raises `SpoolFull` (before any I/O) when the pending frames or bytes
  would exceed the limits; producers back off instead of the spool growing. Parked
  entries do not count against the limits (they are an operator's to clear).

`Spool` is safe to call from several threads (the agent runs `append` in a worker thread
so fsync does not stall the event loop).
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import json
import os
import re
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from protocol.frame import FrameError, decode_header
from protocol.keys import BatchIdentity

_NAME_RE = re.compile(r"(\d{12})-([0-9a-f]{12})")
_SUFFIX = ".lmbatch"


class SpoolError(Exception):
    """Base of the spool's errors."""


class SpoolFull(SpoolError):
    """The pending limits are reached: deliver (or wait for) pending frames, then retry.
    Raised before any I/O, so nothing was written."""


class SpoolLocked(SpoolError):
    """Another process holds this spool directory open; use another directory."""


class ParkKind(enum.StrEnum):
    CONFLICT = "conflict"
    POISON = "poison"


@dataclass(frozen=True, slots=True)
class SpoolEntry:
    """One stored frame. ``path`` is where the frame lives while it is pending."""

    name: str
    identity: BatchIdentity
    frame_sha256: str
    size: int
    path: Path

    def read(self) -> bytes:
        """The exact frame bytes, as they were appended."""
        return self.path.read_bytes()


@dataclass(frozen=True, slots=True)
class ParkedEntry:
    kind: ParkKind
    name: str
    frame_path: Path
    sidecar: dict[str, Any]


def identity_of(frame: bytes) -> BatchIdentity:
    """The identity in ``frame``'s header. The header check includes the CRC-32 over the
    whole frame, so a frame damaged on disk is caught here too.

    Raises `FrameError` when the bytes are not a valid frame."""
    header = decode_header(frame)
    return BatchIdentity(header.agent_id, header.boot_id, header.seq_start, header.seq_end)


class Spool:
    """See the module docstring. Open with `Spool.open`; close (or use ``with``) to
    release the directory lock."""

    def __init__(
        self,
        directory: Path,
        *,
        lock_fd: int,
        max_pending_frames: int,
        max_pending_bytes: int,
        fsync: bool,
    ) -> None:
        self.directory = directory
        self.max_pending_frames = max_pending_frames
        self.max_pending_bytes = max_pending_bytes
        self._fsync_enabled = fsync
        self._lock_fd: int | None = lock_fd
        self._mutex = threading.Lock()
        self._pending: dict[str, SpoolEntry] = {}
        self._pending_bytes = 0
        self._reserved_frames = 0
        self._reserved_bytes = 0
        self._next_number = 0
        self.tmp_dir = directory / "tmp"
        self.pending_dir = directory / "pending"
        self.parked_dirs = {kind: directory / "parked" / kind.value for kind in ParkKind}

    # --- opening --------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        max_pending_frames: int = 10_000,
        max_pending_bytes: int = 1 << 30,
        fsync: bool = True,
    ) -> Self:
        """Create or reopen the spool at ``directory`` and recover it.

        Recovery: removes ``tmp/``'s leftovers and orphan sidecars, reads every pending
        frame's header (a frame whose header or CRC-32 check fails is parked as poison
        with reason ``unreadable_in_spool``) and continues numbering after the highest
        name seen.
        ``fsync=False`` skips fsync (benchmarks only: a crash may then lose frames).
        Raises `SpoolLocked` if another process has it open."""
        if max_pending_frames < 1 or max_pending_bytes < 1:
            raise ValueError("spool limits must be >= 1")
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(root / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise SpoolLocked(f"spool {root} is in use by another process") from None
        spool = cls(
            root,
            lock_fd=lock_fd,
            max_pending_frames=max_pending_frames,
            max_pending_bytes=max_pending_bytes,
            fsync=fsync,
        )
        try:
            spool._recover()
        except BaseException:
            spool.close()
            raise
        return spool

    def _recover(self) -> None:
        for path in (self.tmp_dir, self.pending_dir, *self.parked_dirs.values()):
            path.mkdir(parents=True, exist_ok=True)
        for leftover in self.tmp_dir.iterdir():
            leftover.unlink()
        highest = -1
        for parked in self.parked_dirs.values():
            for path in parked.iterdir():
                number = _number_of(path.name)
                highest = max(highest, number if number is not None else -1)
                frame_twin = path.with_suffix(_SUFFIX)
                if path.suffix == ".json" and not frame_twin.exists():
                    path.unlink()  # sidecar of a park that crashed before its rename
        for path in sorted(self.pending_dir.iterdir()):
            number = _number_of(path.name)
            if number is None or path.suffix != _SUFFIX:
                continue  # not ours; leave it for a human
            highest = max(highest, number)
            frame = path.read_bytes()
            try:
                identity = identity_of(frame)
            except FrameError as exc:
                self._park_unreadable(path, str(exc))
                continue
            self._remember(
                SpoolEntry(path.stem, identity, hashlib.sha256(frame).hexdigest(), len(frame), path)
            )
        self._next_number = highest + 1

    def _park_unreadable(self, path: Path, detail: str) -> None:
        target = self.parked_dirs[ParkKind.POISON]
        sidecar = {"status": None, "reason": "unreadable_in_spool", "detail": detail}
        self._write_atomically(target / f"{path.stem}.json", _json_bytes(sidecar))
        os.rename(path, target / path.name)
        self._fsync_dir(target)

    # --- producer side --------------------------------------------------------------------

    def append(self, frame: bytes, identity: BatchIdentity) -> SpoolEntry:
        """Store ``frame`` durably as a pending entry and return it.

        ``identity`` must be the identity encoded in ``frame`` (the producer just built
        it; it is checked against the bytes again on the next open). Raises `SpoolFull`
        before writing anything when the limits would be exceeded; `ValueError` for a
        frame larger than ``max_pending_bytes``; `OSError` from the disk (then the frame
        may or may not be pending: treat its identity as used)."""
        if len(frame) > self.max_pending_bytes:
            raise ValueError(
                f"frame of {len(frame)} bytes exceeds the spool's {self.max_pending_bytes}"
            )
        sha = hashlib.sha256(frame).hexdigest()
        with self._mutex:
            if (
                len(self._pending) + self._reserved_frames + 1 > self.max_pending_frames
                or self._pending_bytes + self._reserved_bytes + len(frame) > self.max_pending_bytes
            ):
                raise SpoolFull(
                    f"spool {self.directory} holds {len(self._pending)} frames / "
                    f"{self._pending_bytes} bytes (limits {self.max_pending_frames} / "
                    f"{self.max_pending_bytes})"
                )
            name = f"{self._next_number:012d}-{sha[:12]}"
            self._next_number += 1
            # Reserve the space now so concurrent appends respect the limits, but list
            # the entry as pending only once it is durable.
            self._reserved_frames += 1
            self._reserved_bytes += len(frame)
        path = self.pending_dir / f"{name}{_SUFFIX}"
        entry = SpoolEntry(name, identity, sha, len(frame), path)
        try:
            self._write_atomically(path, frame)
            self._fsync_dir(self.pending_dir)
        except BaseException:
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        else:
            with self._mutex:
                self._remember(entry)
        finally:
            with self._mutex:
                self._reserved_frames -= 1
                self._reserved_bytes -= len(frame)
        return entry

    # --- uploader side --------------------------------------------------------------------

    def pending(self) -> list[SpoolEntry]:
        """Pending entries, oldest first (a snapshot)."""
        with self._mutex:
            return sorted(self._pending.values(), key=lambda entry: entry.name)

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def delete(self, entry: SpoolEntry) -> None:
        """Remove a delivered entry (call only after a 200). Idempotent."""
        with self._mutex:
            self._forget(entry.name)
        with contextlib.suppress(FileNotFoundError):
            entry.path.unlink()

    def park(
        self,
        entry: SpoolEntry,
        kind: ParkKind,
        *,
        status: int | None,
        reason: str,
        response: Any = None,
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Move a pending entry to ``parked/<kind>/`` with a JSON sidecar and stop
        treating it as pending. Returns the parked frame's path."""
        target = self.parked_dirs[kind]
        sidecar = {
            "status": status,
            "reason": reason,
            "response": response,
            "agent_id": entry.identity.agent_id,
            "boot_id": str(entry.identity.boot_id),
            "seq_start": entry.identity.seq_start,
            "seq_end": entry.identity.seq_end,
            "frame_sha256": entry.frame_sha256,
            **(extra or {}),
        }
        self._write_atomically(target / f"{entry.name}.json", _json_bytes(sidecar))
        parked_path = target / f"{entry.name}{_SUFFIX}"
        os.rename(entry.path, parked_path)
        self._fsync_dir(target)
        self._fsync_dir(self.pending_dir)
        with self._mutex:
            self._forget(entry.name)
        return parked_path

    def parked(self, kind: ParkKind) -> list[ParkedEntry]:
        """Parked entries of one kind, oldest first, with their sidecars."""
        found: list[ParkedEntry] = []
        for path in sorted(self.parked_dirs[kind].glob(f"*{_SUFFIX}")):
            sidecar_path = path.with_suffix(".json")
            sidecar = json.loads(sidecar_path.read_text()) if sidecar_path.exists() else {}
            found.append(ParkedEntry(kind, path.stem, path, sidecar))
        return found

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Release the directory lock. Pending entries stay on disk for the next open."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------------

    def _remember(self, entry: SpoolEntry) -> None:
        self._pending[entry.name] = entry
        self._pending_bytes += entry.size

    def _forget(self, name: str) -> None:
        entry = self._pending.pop(name, None)
        if entry is not None:
            self._pending_bytes -= entry.size

    def _write_atomically(self, path: Path, data: bytes) -> None:
        """Write ``data`` to ``path`` via a fsync'd temporary file and a rename."""
        tmp = self.tmp_dir / f"{path.name}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                if self._fsync_enabled:
                    os.fsync(handle.fileno())
            os.rename(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise

    def _fsync_dir(self, directory: Path) -> None:
        if not self._fsync_enabled:
            return
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _number_of(filename: str) -> int | None:
    match = _NAME_RE.match(filename)
    return int(match.group(1)) if match else None


def _json_bytes(value: dict[str, Any]) -> bytes:
    return json.dumps(value, indent=2, sort_keys=True, default=str).encode("utf-8")
