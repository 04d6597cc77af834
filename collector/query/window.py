"""The live window: decoded frames of recently accepted batches, bounded in memory.

`LiveWindow` keeps `protocol.frame.Frame` objects (their Arrow points, decoded once) keyed
by ``manifest_id``, with the batch's accepted time and hour, for batches accepted within
``window_s`` of now, at most ``max_points`` points and ``max_bytes`` bytes in all: beyond
either the oldest batches (first added) are evicted. ``points`` rows (`rollup.table.points`) are
built only at query time, only for the rows a query matches (`collector.query_live`).

Memory account: ``max_bytes`` covers the batches held (each charged its points' Arrow
buffers) *and* the decodes in progress (`reserve` / `release`, `collector.query.decode`):
a decode reserves what it keeps before it allocates it (the decompressed payload, then
the points' decoded size, which a dictionary-encoded metric can make many times the
frame's size), evicting the oldest batches to make room; when even an empty window has no
room (other decodes hold it), the reservation is refused and the batch is lost.

A batch that leaves the window (evicted, expired, or never fetched: its blob could not be
read) is *dropped*: its ``manifest_id``, accepted time and ``ts`` range are remembered
(at most ``max_dropped``; past that, only the newest accepted time of the forgotten ones)
until the committed snapshot is known to hold it. An answer that may need a dropped batch
the snapshot lacks is never ``complete`` (`missing_dropped`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from protocol import keys
from protocol.frame import Frame
from rollup.table.columns import int64_column
from rollup.table.manifest import Snapshot

NS_PER_S = 1_000_000_000
UNKNOWN_RANGE = (-(2**63), 2**63 - 1)


@dataclass(frozen=True, slots=True)
class WindowBatch:
    manifest_id: str
    accepted_ns: int
    frame: Frame
    min_ts_ns: int
    max_ts_ns: int
    bytes: int  # charged to the window's memory account (`frame_bytes`)
    frame_sha256: str = ""  # the log row's (follower) or the manifest's (own batches)

    @property
    def accepted_hour(self) -> str:
        return keys.UtcHour.from_unix_ns(self.accepted_ns).iso

    @property
    def points(self) -> int:
        return int(self.frame.points.num_rows)


@dataclass(frozen=True, slots=True)
class DroppedBatch:
    manifest_id: str
    accepted_ns: int
    min_ts_ns: int
    max_ts_ns: int

    @property
    def accepted_hour(self) -> str:
        return keys.UtcHour.from_unix_ns(self.accepted_ns).iso


def frame_bytes(frame: Frame) -> int:
    """What a held frame is charged: the Arrow buffers of its points."""
    return int(frame.points.get_total_buffer_size())


def ts_range(frame: Frame) -> tuple[int, int]:
    ts = int64_column(frame.points.column("ts"))
    if len(ts) == 0:
        return UNKNOWN_RANGE
    return int(np.min(ts)), int(np.max(ts))


class LiveWindow:
    def __init__(
        self,
        *,
        window_s: float,
        max_points: int,
        max_bytes: int,
        max_dropped: int = 100_000,
    ) -> None:
        self.window_ns = int(window_s * NS_PER_S)
        self.max_points = max_points
        self.max_bytes = max_bytes
        self.max_dropped = max_dropped
        self._batches: OrderedDict[str, WindowBatch] = OrderedDict()
        self._dropped: OrderedDict[str, DroppedBatch] = OrderedDict()
        self._points = 0
        self._bytes = 0
        self._reserved = 0
        self.forgotten_through_ns: int | None = None
        """Newest accepted time of dropped batches no longer remembered one by one."""

    # --- filling -----------------------------------------------------------------------

    def add(
        self,
        manifest_id: str,
        accepted_ns: int,
        frame: Frame,
        *,
        now_ns: int,
        reserved: int = 0,
        frame_sha256: str = "",
    ) -> bool:
        """Keep one accepted batch; False when it is already held, too old, or larger
        than the account can hold. ``reserved``: what its decode reserved (`reserve`),
        released now that the frame itself is charged; ``frame_sha256``: the frame's
        digest as its log row or manifest names it (`live_part` matches it against the
        snapshot's retracted batches)."""
        self.release(reserved)
        if manifest_id in self._batches or accepted_ns < now_ns - self.window_ns:
            return False
        low, high = ts_range(frame)
        self._dropped.pop(manifest_id, None)
        batch = WindowBatch(
            manifest_id, accepted_ns, frame, low, high, frame_bytes(frame), frame_sha256
        )
        self._batches[manifest_id] = batch
        self._points += batch.points
        self._bytes += batch.bytes
        self.expire(now_ns, full=False)
        while self._batches and (
            self._bytes + self._reserved > self.max_bytes
            or (self._points > self.max_points and len(self._batches) > 1)
        ):
            self._drop(next(iter(self._batches)))
        return manifest_id in self._batches

    def reserve(self, size: int) -> bool:
        """Charge ``size`` bytes for a decode about to allocate them, evicting the oldest
        batches to make room; False (nothing charged) when there is no room even so."""
        if self._reserved + size > self.max_bytes:
            return False
        while self._batches and self._bytes + self._reserved + size > self.max_bytes:
            self._drop(next(iter(self._batches)))
        self._reserved += size
        return True

    def release(self, size: int) -> None:
        """Give back what `reserve` charged."""
        self._reserved -= size

    def lost(self, manifest_id: str, accepted_ns: int) -> None:
        """A batch the window should hold but cannot (its blob was unreadable)."""
        if manifest_id not in self._batches:
            self._remember(DroppedBatch(manifest_id, accepted_ns, *UNKNOWN_RANGE))

    def expire(self, now_ns: int, *, full: bool = True) -> None:
        """Drop batches accepted before ``now - window_s``. ``full=False`` looks only at
        the oldest end (batches arrive in about accepted order): cheap enough per add;
        the follower's polls and the queries run the full pass."""
        horizon = now_ns - self.window_ns
        if not full:
            while self._batches:
                oldest = next(iter(self._batches.values()))
                if oldest.accepted_ns >= horizon:
                    return
                self._drop(oldest.manifest_id)
            return
        stale = [m for m, b in self._batches.items() if b.accepted_ns < horizon]
        for manifest_id in stale:
            self._drop(manifest_id)

    def _drop(self, manifest_id: str) -> None:
        batch = self._batches.pop(manifest_id)
        self._points -= batch.points
        self._bytes -= batch.bytes
        self._remember(
            DroppedBatch(manifest_id, batch.accepted_ns, batch.min_ts_ns, batch.max_ts_ns)
        )

    def _remember(self, dropped: DroppedBatch) -> None:
        self._dropped[dropped.manifest_id] = dropped
        while len(self._dropped) > self.max_dropped:
            _, forgotten = self._dropped.popitem(last=False)
            self.forgotten_through_ns = max(self.forgotten_through_ns or 0, forgotten.accepted_ns)

    # --- reading -----------------------------------------------------------------------

    def __contains__(self, manifest_id: object) -> bool:
        return manifest_id in self._batches

    @property
    def batch_count(self) -> int:
        return len(self._batches)

    @property
    def point_count(self) -> int:
        return self._points

    @property
    def byte_count(self) -> int:
        """Bytes charged now: the batches held and the decodes in progress."""
        return self._bytes + self._reserved

    def batches(self) -> list[WindowBatch]:
        """The batches held now (a copy: safe to use from another thread)."""
        return list(self._batches.values())

    def dropped(self) -> list[DroppedBatch]:
        return list(self._dropped.values())

    def forget_committed(self, sealed_through_ns: int) -> None:
        """Dropped batches accepted before ``sealed_through_ns`` are in the snapshot."""
        for manifest_id in [
            m for m, d in self._dropped.items() if d.accepted_ns < sealed_through_ns
        ]:
            del self._dropped[manifest_id]
        if self.forgotten_through_ns is not None and self.forgotten_through_ns < sealed_through_ns:
            self.forgotten_through_ns = None

    def hours(self) -> set[str]:
        """Accepted hours of held and dropped batches (whose ledgers a query reads)."""
        return {b.accepted_hour for b in self._batches.values()} | {
            d.accepted_hour for d in self._dropped.values()
        }


def live_part(
    held: list[WindowBatch], committed: set[str], snapshot: Snapshot | None
) -> list[WindowBatch]:
    """The held batches a query counts as live: those whose ``manifest_id`` the snapshot's
    ledger lacks (``committed``: the ids it holds, `SnapshotSource.included`), less those
    the snapshot *retracted* (``ledger.retracted``, read with the manifest: no request).

    Why: when an operator retracts a phantom row, the rollup takes the batch out of its
    ledger and lists it in ``ledger.retracted``; the follower never sees the catalog's
    ``retracted`` row, so with a window longer than the retraction took, the phantom's
    frame is still held and, missing from the ledger, would come back as live rows.

    A batch is matched by its accepted hour, ``manifest_id`` and ``frame_sha256``: the
    ledger's whole identity of it. A real acceptance of that identity later is a
    different record, and it is not hidden when it is accepted in another hour or with
    other bytes. One accepted in the same hour with the same bytes cannot be told from
    the phantom by anything the snapshot holds (the window keeps one frame per
    ``manifest_id``, and those bytes are the phantom's); it is left out until the next
    rollup includes it again (which removes it from ``ledger.retracted``), and meanwhile
    its catalog row keeps the hour unsealed, so no answer covering it is ``complete``.
    A batch held without a digest (``""``) is never matched."""
    retracted = (
        {(b.accepted_hour, b.manifest_id, b.frame_sha256) for b in snapshot.ledger_retracted}
        if snapshot is not None
        else set()
    )
    return [
        b
        for b in held
        if b.manifest_id not in committed
        and (b.accepted_hour, b.manifest_id, b.frame_sha256) not in retracted
    ]


def missing_dropped(
    dropped: list[DroppedBatch],
    forgotten_through_ns: int | None,
    committed: set[str],
    *,
    sealed_through_ns: int,
    range_ns: tuple[int, int],
) -> int:
    """How many dropped batches an answer over ``range_ns`` (``ts``, half-open) may need
    and the snapshot lacks; forgotten ones count as one when they may not be committed."""
    low, high = range_ns
    missing = sum(
        1
        for d in dropped
        if d.accepted_ns >= sealed_through_ns
        and d.manifest_id not in committed
        and d.min_ts_ns < high
        and d.max_ts_ns >= low
    )
    if forgotten_through_ns is not None and forgotten_through_ns >= sealed_through_ns:
        missing += 1
    return missing
