"""Lands a local spool's frames in the store (PROTOCOL §3.4), in acknowledgement order.

Each round takes the spooled files in the order they were acknowledged (`LocalSpool.pending`)
and runs the acceptance protocol on each. An accepted (or duplicate) frame, and a conflict
whose quarantine record a HEAD saw, are remembered as landed (the hash the store holds)
and then removed from the spool. A conflict whose record is not there yet stays: the agent
was told 200, so the frame is the only trace of the conflict, and the next round tries
again (the protocol is idempotent). A store that does not answer ends the round, so
later frames never overtake earlier ones. After each round the landed memory forgets
what is past the retry horizon.

While group commit is in effect (PROTOCOL §3.10) a round lands windows of frames as
bundles (`collector.bundles.spool_landing`): at most one frame per identity per bundle,
the manifests created one after another in acknowledgement order, each within the GC's
mark grace of the bundle's write.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import dataclass
from pathlib import Path

import structlog

from protocol.clock import Clock
from protocol.frame import FrameError, decode_header
from store.base import ObjectStore
from store.errors import NotFound, StoreError

from ..accept import AcceptanceUnavailable, Accepted, BatchAcceptor, IdentityConflictFound
from ..bundles.spool_landing import SpoolBundles, SpooledFrame
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
        send_window_s: float = 0.0,
    ) -> None:
        """``send_window_s``: ``gc.mark_grace_s`` less the settle margin, the longest a
        bundle's manifest creates may follow its write (0: frame blobs only)."""
        self._spool = spool
        self._acceptor = acceptor
        self._store = store
        self._clock = clock
        self._interval_s = interval_s
        self._bundles = SpoolBundles(acceptor=acceptor, clock=clock, send_window_s=send_window_s)

    async def land_once(self) -> LandingReport:
        report = LandingReport()
        paths = self._spool.pending()
        next_path = 0
        while next_path < len(paths):
            window: list[SpooledFrame] = []
            while next_path < len(paths) and len(window) < self._bundles.max_frames:
                item = await self._read(paths[next_path], report)
                if item is not None:
                    if self._bundles.window_end([*window, item]) <= len(window):
                        break  # it starts the next window (its identity is in this one)
                    window.append(item)
                next_path += 1
            if not window:
                continue
            try:
                if len(window) == 1:
                    item = window[0]
                    result = await self._acceptor.accept(item.header, item.frame, item.sha)
                    await self._settle(item, result, report)
                    continue
                landed = 0
                async for item, result in self._bundles.land(window):
                    landed += 1
                    await self._settle(item, result, report)
                if landed < len(window):
                    report.deferred += len(window) - landed
                    log.warning("landing_send_window_closed", left=len(window) - landed)
                    break  # the rest restart at step 1 next round, in order
            except AcceptanceUnavailable as exc:
                log.warning("landing_deferred", error=str(exc), pending=self._spool.frames)
                report.deferred += 1
                break  # the store is not answering: try again next round, in order
        await asyncio.to_thread(self._spool.landed_memory.prune, self._clock.now_ns())
        return report

    async def _read(self, path: Path, report: LandingReport) -> SpooledFrame | None:
        try:
            frame = await asyncio.to_thread(path.read_bytes)
            header = decode_header(frame)
        except (OSError, FrameError) as exc:  # damaged or removed after it was acknowledged
            log.error("spooled_frame_unreadable", path=str(path), error=str(exc))
            await self._spool.set_aside(path)
            report.unreadable += 1
            return None
        return SpooledFrame(path, header, frame, hashlib.sha256(frame).hexdigest())

    async def _settle(
        self,
        item: SpooledFrame,
        result: Accepted | IdentityConflictFound,
        report: LandingReport,
    ) -> None:
        """Remember a landed frame and remove it from the spool; a conflict whose record
        is not there yet stays (the agent was told 200: it is the only trace)."""
        if isinstance(result, Accepted):
            report.duplicates += result.duplicate
            report.landed += not result.duplicate
        elif await self._recorded(result.quarantine_key):
            report.conflicts += 1
            log.warning("landing_found_conflict", quarantine_key=result.quarantine_key)
        else:
            log.warning("landing_conflict_not_recorded", quarantine_key=result.quarantine_key)
            report.deferred += 1
            return
        held = result.manifest if isinstance(result, Accepted) else result.accepted
        await self._spool.landed(
            item.path, item.identity.key_identity, held.frame_sha256, self._clock.now_ns()
        )

    async def _recorded(self, quarantine_key: str) -> bool:
        """Whether the quarantine record exists (a HEAD: the answer alone does not say),
        within the request budget: a HEAD that never answers must not stop the landing
        (the frame stays, and the next round asks again)."""
        try:
            async with asyncio.timeout(self._acceptor.budget_s):
                await self._store.head(quarantine_key)
        except NotFound:
            return False
        except (StoreError, TimeoutError) as exc:
            log.warning("quarantine_check_failed", key=quarantine_key, error=repr(exc))
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
