"""Spool mode lands in bundles (PROTOCOL §3.10 "Writing", spool mode; §3.4).

`SpoolBundles` is used by `collector.local_spool.lander.SpoolLander` while group commit is in
effect (the acceptor has a bundler and the store's feature gate says so). A landing round
takes a *window* of spooled frames in acknowledgement order (`window_end`): the longest
prefix holding at most one frame per identity, closing as a bundle does (``max_frames``,
``max_bytes``) and at most as many frames as can all have their manifests created in
time (below). Then:

1. the window is written as one bundle (`BundledSteps.write`: step 1 for all of them,
   with the §3.5 collector side on the bundle on a 412);
2. each frame's manifest is created *one after another, in acknowledgement order*
   (`BatchAcceptor.accept_placed`): a frame's create waits until every earlier frame of
   the round has landed, and a later round starts only when this one ended, so frames of
   one identity land in acknowledgement order across bundles (the frame answered 200 is
   the accepted one, the one answered 409 the quarantined one, as §3.4 requires);
3. every create is sent no later than the bundle's 200 (or its proof HEAD) plus
   ``gc.mark_grace`` less the settle margin (``send_window_s``; measured from before the
   bundle PUT was sent, which is earlier: the safe side). Frames whose create could not
   be sent by then stay in the spool and restart at step 1 in a later round (their bytes
   in this bundle are dead).

PROTOCOL §3.10 asks for ``gc.mark_grace ≥ settle margin + the time to send
bundle_max_frames creates``, checked at start. The time a create takes is not known at
start; a create may take up to the request budget, so instead of refusing to start, a
window holds at most ``send_window_s // request_budget_s`` frames (defaults: about 50):
every create of a window can be sent in time even when each takes its whole budget, and
the per-create deadline above is what keeps the rule. Fewer than two: no bundles (frame
blobs, as before).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from protocol import keys
from protocol.clock import Clock
from protocol.frame import FrameHeader

from ..accept import AcceptanceUnavailable, Accepted, BatchAcceptor, IdentityConflictFound
from ..store_calls import BudgetExhausted
from .bundler import BundleSpot


@dataclass(frozen=True, slots=True)
class SpooledFrame:
    """A spooled frame read back for landing."""

    path: Path
    header: FrameHeader
    frame: bytes
    sha: str

    @property
    def identity(self) -> keys.BatchIdentity:
        return self.header.identity


class SpoolBundles:
    def __init__(self, *, acceptor: BatchAcceptor, clock: Clock, send_window_s: float) -> None:
        """``send_window_s``: ``gc.mark_grace_s`` less the settle margin."""
        self._acceptor = acceptor
        self._clock = clock
        self._send_window_s = send_window_s
        self._budget_s = acceptor.budget_s  # a create may take the whole request budget

    @property
    def max_frames(self) -> int:
        """Frames a window may hold now: 1 (no bundles) unless group commit is in effect."""
        bundled = self._acceptor.bundled
        if bundled is None or not bundled.options.enabled():
            return 1
        fits = math.floor(self._send_window_s / self._budget_s)
        return max(1, min(bundled.options.limits.max_frames, fits))

    @property
    def max_bytes(self) -> int:
        bundled = self._acceptor.bundled
        return 0 if bundled is None else bundled.options.limits.max_bytes

    def window_end(self, frames: Sequence[SpooledFrame]) -> int:
        """How many of ``frames`` (acknowledgement order) the window takes: stops before a
        second frame of an identity, and closes as a bundle does."""
        cap, max_bytes = self.max_frames, self.max_bytes
        seen: set[keys.KeyIdentity] = set()
        size = 0
        for end, item in enumerate(frames):
            identity = item.identity.key_identity
            if end >= cap or identity in seen or (end and size >= max_bytes):
                return end
            seen.add(identity)
            size += len(item.frame)
        return len(frames)

    async def land(
        self, window: Sequence[SpooledFrame]
    ) -> AsyncIterator[tuple[SpooledFrame, Accepted | IdentityConflictFound]]:
        """Write the window as one bundle, then create its frames' manifests one after
        another, yielding each outcome; ends early (the rest stay spooled) when the send
        window closes. Raises `AcceptanceUnavailable` (the round ends: order is kept)."""
        bundled = self._acceptor.bundled
        assert bundled is not None and len(window) >= 2
        started = self._clock.monotonic()  # before the PUT: earlier than its 200 or HEAD
        if bundled.options.on_raw_put is not None:
            bundled.options.on_raw_put(len(window))
        try:
            sent = await bundled.write(
                [item.frame for item in window],
                [item.sha for item in window],
                started + self._budget_s,
            )
        except BudgetExhausted:
            raise AcceptanceUnavailable("the spool's bundle was not written in time") from None
        send_by = started + self._send_window_s
        for item, offset in zip(window, sent.offsets, strict=True):
            if self._clock.monotonic() >= send_by:
                return  # the rest restart at step 1 in a later round
            spot = BundleSpot(sent.key, offset, len(window), sent.ops)
            result = await self._acceptor.accept_placed(
                item.header, item.frame, item.sha, spot, send_by
            )
            yield item, result
