"""What a local spool has landed: identity -> ``frame_sha256``, for the retry horizon.

PROTOCOL §3.4: once a spooled frame has landed its file is gone, yet an agent may still
send a frame of that identity for as long as it retries (``gc.retry_horizon_s``). The
spool answers such a frame from this memory: the landed hash again is a duplicate (200),
any other is a conflict (409 naming the landed hash). Without it the spool would answer
200 and the store would quarantine the frame when landing, after the agent deleted it.

Kept in SQLite (``<spool_dir>/landed.sqlite3``, write-ahead log, ``synchronous=FULL``:
every `remember` is fsync'd before it returns, and the spool removes a frame's file only
after that), so it survives a restart, answers in one indexed read whatever its size
(admission cost does not grow with the spooled files or the landed ones), and holds
almost nothing in memory. Bounded on disk:

- by time: rows older than the retry horizon (by this host's clock when landed) are
  deleted by `prune`, which the lander calls every round. After the horizon no agent
  retries the batch, so nothing is lost by forgetting it;
- by count: at most ``max_entries`` rows (``ingest.spool_landed_max_entries``, about 95
  bytes each on disk, measured); past it the oldest are forgotten early and a warning is
  logged. A conflicting frame of a forgotten identity is answered 200 and quarantined
  when it lands, as if the memory had never held it: size the bound for the landing rate
  times the horizon (the default, 10 million, covers 58 batches/s for the default 48 h).

Rows are keyed by the first 16 bytes of the SHA-256 of the identity (agent SHA-256,
boot_id, both sequence numbers): either agent form of a key names the same row, and a
collision would need ~2^64 identities.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import structlog

from protocol import keys

log = structlog.get_logger("collector.spool")
FILE_NAME = "landed.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS landed (
    n INTEGER PRIMARY KEY,          -- landing order (a replaced row moves to the end)
    identity BLOB NOT NULL UNIQUE,  -- identity_key()
    sha BLOB NOT NULL,              -- frame_sha256 of the batch the store holds, 32 bytes
    landed_ns INTEGER NOT NULL      -- when it landed, this host's clock
)
"""


class LandedMemoryError(Exception):
    """The memory file cannot be opened or read; the message names it."""


def identity_key(identity: keys.KeyIdentity) -> bytes:
    whole = (
        bytes.fromhex(identity.agent_sha256)
        + identity.boot_id.bytes
        + identity.seq_start.to_bytes(8, "big")
        + identity.seq_end.to_bytes(8, "big")
    )
    return hashlib.sha256(whole).digest()[:16]


class LandedMemory:
    """One writer (the lander) and one reader (admission, under the spool's lock), each
    with its own connection, each used by one thread at a time (``asyncio.to_thread``)."""

    def __init__(self, directory: Path, *, horizon_s: float, max_entries: int) -> None:
        if horizon_s <= 0 or max_entries < 1:
            raise ValueError("horizon_s must be > 0 and max_entries >= 1")
        self.path = directory / FILE_NAME
        self._horizon_ns = int(horizon_s * keys.NS_PER_S)
        self._max_entries = max_entries
        try:
            self._writer = self._connect()
            self._writer.execute("PRAGMA journal_mode=WAL")
            self._writer.execute(_SCHEMA)
            self._reader = self._connect()
        except sqlite3.Error as exc:
            raise LandedMemoryError(
                f"cannot open the spool's landed memory {self.path}: {exc} (move it aside "
                "to start without it: conflicts with batches it remembered are then found "
                "when landing)"
            ) from None

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA synchronous=FULL")  # each commit fsyncs the log
        return connection

    def get(self, identity: keys.KeyIdentity) -> str | None:
        """The landed ``frame_sha256`` of ``identity``, if remembered."""
        row = self._reader.execute(
            "SELECT sha FROM landed WHERE identity = ?", (identity_key(identity),)
        ).fetchone()
        return bytes(row[0]).hex() if row else None

    def remember(self, identity: keys.KeyIdentity, sha: str, now_ns: int) -> None:
        """Record (durably, before returning) that the store holds ``sha`` for ``identity``."""
        self._writer.execute(
            "INSERT OR REPLACE INTO landed (identity, sha, landed_ns) VALUES (?, ?, ?)",
            (identity_key(identity), bytes.fromhex(keys.check_sha256(sha)), now_ns),
        )

    def prune(self, now_ns: int) -> int:
        """Forget what landed before the horizon, then the oldest past ``max_entries``.

        Rows are in landing order, so the expired ones are a prefix: the cost is the rows
        deleted, not the rows kept (no index on time)."""
        expired = self._writer.execute(
            "DELETE FROM landed WHERE n < coalesce("
            "(SELECT n FROM landed WHERE landed_ns >= ? ORDER BY n LIMIT 1),"
            "(SELECT max(n) + 1 FROM landed))",
            (now_ns - self._horizon_ns,),
        ).rowcount
        early = self._writer.execute(
            "DELETE FROM landed WHERE n <= (SELECT max(n) FROM landed) - ?",
            (self._max_entries,),
        ).rowcount
        if early:
            log.warning(
                "spool_landed_memory_full",
                forgotten_early=early,
                max_entries=self._max_entries,
                detail="raise ingest.spool_landed_max_entries: conflicts with these "
                "batches are now found only when landing",
            )
        return expired + early

    def close(self) -> None:
        self._reader.close()
        self._writer.close()
