"""Turning points into spooled frames: the agent's identity state for one boot.

Identity rule (PROTOCOL §1, identity ``(agent_id, boot_id, seq_start, seq_end)``): a
collector holds a given identity to one frame forever, so an agent must never put
different content under an identity it may already have sent. The design that makes this
hold across kill -9 without persisting a sequence counter:

- every process start is a new boot: `BatchProducer` takes a fresh random ``boot_id``
  and numbers rows from 0 under it;
- a frame is appended to the durable `Spool` before it is ever sent, and frames recovered
  from the spool after a crash are re-sent as stored (same bytes, old boot_id) — they are
  never re-framed;
- a sequence range is consumed as soon as writing its frame is attempted, so even a
  failed append (which might have left the file pending) is never followed by other
  content under the same seqs. Only `SpoolFull`, raised before any I/O, gives the range
  back.

So the only durable identity state is the spooled frames themselves.
"""

from __future__ import annotations

import uuid

import pyarrow as pa

from agent.spool import Spool, SpoolEntry, SpoolFull
from protocol.frame_encode import encode_frame
from protocol.keys import BatchIdentity


class BatchProducer:
    """Assigns identities for one agent boot, encodes frames and spools them (``spool``
    is needed only by `submit`).

    Not safe for concurrent `submit` calls on one instance (sequence numbers are handed
    out in call order); use one producer per agent."""

    def __init__(
        self,
        *,
        agent_id: str,
        spool: Spool | None = None,
        boot_id: uuid.UUID | None = None,
        first_seq: int = 0,
        compress: bool = True,
        zstd_level: int = 3,
    ) -> None:
        self.agent_id = agent_id
        self.boot_id = boot_id if boot_id is not None else uuid.uuid4()
        self.spool = spool
        self._next_seq = first_seq
        self._compress = compress
        self._zstd_level = zstd_level
        # Validates agent_id and boot_id up front (KeyFormatError) instead of mid-run.
        BatchIdentity(self.agent_id, self.boot_id, first_seq, first_seq)

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def frame(self, points: pa.Table) -> tuple[bytes, BatchIdentity]:
        """Encode ``points`` under the next sequence range and consume that range.

        For callers that spool the frame themselves: they must spool exactly these bytes
        (retrying the same bytes is fine) or never use the identity. Raises `ValueError`
        for an empty table and `protocol.frame.FrameError` for points a frame cannot
        carry (the range is not consumed then)."""
        frame, identity = self._encode(points)
        self._next_seq = identity.seq_end + 1
        return frame, identity

    def submit(self, points: pa.Table) -> SpoolEntry:
        """Frame ``points`` under the next sequence range and append it to the spool.

        When this returns the frame is durable and will be delivered (or parked).
        `SpoolFull`: nothing was written and the range is not consumed — retry later.
        Any other error: the range is consumed (the frame may be pending)."""
        if self.spool is None:
            raise RuntimeError("this producer has no spool; use frame() instead")
        frame, identity = self._encode(points)
        try:
            entry = self.spool.append(frame, identity)
        except SpoolFull:
            raise
        except BaseException:
            self._next_seq = identity.seq_end + 1
            raise
        self._next_seq = identity.seq_end + 1
        return entry

    def _encode(self, points: pa.Table) -> tuple[bytes, BatchIdentity]:
        if points.num_rows < 1:
            raise ValueError("a batch needs at least one point")
        identity = BatchIdentity(
            self.agent_id, self.boot_id, self._next_seq, self._next_seq + points.num_rows - 1
        )
        frame = encode_frame(
            agent_id=self.agent_id,
            boot_id=self.boot_id,
            seq_start=identity.seq_start,
            points=points,
            compress=self._compress,
            zstd_level=self._zstd_level,
        )
        return frame, identity
