"""The acceptor's group-commit part (PROTOCOL §3.10): whether a frame joins the open
bundle, its place there, and the bundle's write under a request of its own."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from index.log_writer import IndexLogWriter
from protocol.clock import Clock
from protocol.records import AcceptedManifest

from ..in_flight import InFlight, InFlightLimits
from ..store_calls import BudgetedRequest
from .bundle_write import write_bundle
from .bundler import Bundler, BundleSpot, Placement, SentBundle
from .options import BundleOptions


class BundledSteps:
    def __init__(
        self,
        options: BundleOptions,
        clock: Clock,
        collector_id: str,
        index_log: IndexLogWriter,
        new: Callable[[float], BudgetedRequest],
    ) -> None:
        """``new(budget_s)``: a `BudgetedRequest` with the acceptor's store,
        retry policy and observer (the bundle's write is a request of its own)."""
        self.options = options
        self._clock = clock
        self._collector_id = collector_id
        self._index_log = index_log
        self._new_request = new
        self.bundler = Bundler(
            limits=options.limits,
            clock=clock,
            write=self.write,
            on_raw_put=options.on_raw_put,
            on_slot_wait=options.on_slot_wait,
        )

    async def place(
        self,
        request: BudgetedRequest,
        frame: bytes,
        sha: str,
        *,
        resend: bool,
        ts_range: tuple[int, int] | None,
    ) -> Placement | None:
        """The frame's place (`Bundler.place`), or None when it is not bundled (the gate
        is off, a flagged re-send, older than the points retention). When in a bundle,
        step 1 is done and its requests are counted in ``request``. Raises
        `BundlesFull` (429) or `BudgetExhausted` (503)."""
        now_ns = self._clock.now_ns()
        if not self.options.bundles(resend=resend, ts_range=ts_range, now_ns=now_ns):
            return None
        placement = await self.bundler.place(frame, sha, request.deadline)
        if placement.spot is not None:
            request.ops += placement.spot.ops
        return placement

    def another_manifest(self, spot: BundleSpot, stored: AcceptedManifest, size: int) -> None:
        """The frame at ``spot`` (``size`` bytes) found its identity's manifest already
        there: unless it names these very bytes (an identical bundle written before, whose
        frames these are), no manifest names them: dead."""
        ours = (stored.raw_blob_key, stored.raw_offset) == (spot.key, spot.offset)
        if not ours and self.options.on_dead_bytes is not None:
            self.options.on_dead_bytes(size)

    async def write(
        self, frames: Sequence[bytes], shas: Sequence[str], write_by: float
    ) -> SentBundle:
        """Step 1 for a bundle of these frames, done by ``write_by`` (monotonic; the
        bundler's, or spool landing's). Raises `BudgetExhausted`."""
        request = self._new_request(write_by - self._clock.monotonic())
        written = await write_bundle(
            request, frames, shas, collector_id=self._collector_id, index_log=self._index_log
        )
        offsets = [entry.offset for entry in written.bundle.entries]
        return SentBundle(written.bundle.key, offsets, written.ops)


class InFlightBytes:
    """The bundler's `ByteAccount`: the worker's in-flight account (`collector.in_flight`)
    under ``http.max_in_flight_bytes``; a request alone in flight is always charged (the
    cap bounds concurrency, not one frame)."""

    def __init__(self, in_flight: InFlight, limits: InFlightLimits) -> None:
        self._in_flight = in_flight
        self._limits = limits

    def try_charge(self, size: int) -> bool:
        return self._in_flight.try_reserve(0, size, self._limits, always_if_alone=True)

    def release(self, size: int) -> None:
        self._in_flight.release(0, size)
