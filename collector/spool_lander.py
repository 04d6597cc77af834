"""Lands a local spool's frames in the store (PROTOCOL §3.4), in acknowledgement order.

Each round takes the spooled files in the order they were acknowledged (`LocalSpool.pending`)
and runs the acceptance protocol on each. An accepted (or duplicate) frame, and a conflict
whose quarantine record a HEAD saw, are remembered as landed (the hash the store holds)
and then removed from the spool. A conflict whose record is not there yet stays: the agent
was told 200, so the frame is the only trace of the conflict, and the next round tries
again (the protocol is idempotent). A store that does not answer ends the round, so
later frames never overtake earlier ones. After each round the landed memory forgets
what is past the retry horizon.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import dataclass

import structlog

from protocol import keys
from protocol.clock import Clock
from protocol.frame import FrameError, decode_header
from store.base import ObjectStore
from store.errors import NotFound, StoreError

from .accept import AcceptanceUnavailable, Accepted, BatchAcceptor
from .spool import LocalSpool

log = structlog.get_logger("collector.spool")


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
            try:
                frame = await asyncio.to_thread(path.read_bytes)
                header = decode_header(frame)
            except (OSError, FrameError) as exc:  # damaged or removed after it was acknowledged
                log.error("spooled_frame_unreadable", path=str(path), error=str(exc))
                await self._spool.set_aside(path)
                report.unreadable += 1
                continue
            sha = hashlib.sha256(frame).hexdigest()
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
            identity = keys.BatchIdentity(
                header.agent_id, header.boot_id, header.seq_start, header.seq_end
            )
            held = result.manifest if isinstance(result, Accepted) else result.accepted
            await self._spool.landed(
                path, identity.key_identity, held.frame_sha256, self._clock.now_ns()
            )
        await asyncio.to_thread(self._spool.landed_memory.prune, self._clock.now_ns())
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
