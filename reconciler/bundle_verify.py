"""SHA verification of bundles while a full audit runs: `BundleVerifier` (PROTOCOL §3.10
Readers: "SHA verification walks ``raw-bundles/v1/`` with its own cursor at
``reconciler.verify_bytes_per_s``").

The frame blobs' verifier (`reconciler.audit.blob_verify`) paces by objects; a bundle is up
to the largest raw object (megabytes), so this one paces by bytes: before each bundle is
read, `ByteRate` takes its listed size at ``[reconciler] verify_bytes_per_s``. A bundle
is read whole (one GET) and checked by `protocol.bundle.check_bundle` — its SHA-256
against its key, footer, index CRC, the frames tiled from offset 0 and equal to the
index, each frame's CRC and ``frame_sha256`` — with the hash in a thread. One bundle at
a time: the rate bounds the work, and memory holds one bundle.

**Cursor**: ``AuditRecord.cursors[BUNDLE_VERIFY_CURSOR]``, kept and carried into the next
audit exactly as the frame blobs', walked by the same `reconciler.verify_walk.CursorWalk`
(the last key up to which every bundle was verified;
``""`` from the beginning; at the end of ``raw-bundles/v1/`` the round is complete, the
cursor goes back to ``""`` and this audit verifies no more bundles).

**Problems**: a bundle that fails becomes a ``corrupt-blob`` problem (subject: its key;
the GC never deletes it, `reconciler.gc.proof`); one that verifies resolves an open one. A
bundle listed larger than the largest bundle (``ingest`` settings) is a problem without
being read. One deleted since it was listed is skipped. A store error stops bundle
verification for this audit (logged, counted); it never keeps the audit from completing.

**Cost**: one LIST page per 1,000 bundles and one GET per bundle, at most
``verify_bytes_per_s`` bytes a second of audit time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from protocol import keys
from protocol.bundle import BundleError, check_bundle, max_bundle_bytes
from protocol.clock import Clock
from reconciler import store_calls
from reconciler.context import ReconcilerContext
from reconciler.problems import ProblemBook
from reconciler.verify_walk import CursorWalk
from store.base import ObjectInfo

BUNDLE_VERIFY_CURSOR = "verify:" + keys.RAW_BUNDLES_PREFIX
"""Key of the bundle verification cursor in `AuditRecord.cursors`."""
_CHECK_IN_THREAD_BYTES = 1 << 20


class ByteRate:
    """At most ``rate_per_s`` bytes a second on average, on the injected clock (tests
    with a `ManualClock` never really wait). A take larger than the allowance waits for
    its whole size: an object bigger than a second's worth is read after its time."""

    def __init__(self, *, rate_per_s: float, clock: Clock) -> None:
        if rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
        self._rate = rate_per_s
        self._clock = clock
        self._allowance = rate_per_s  # a second's worth to start with
        self._last = clock.monotonic()
        self._lock = asyncio.Lock()

    async def take(self, amount: int) -> None:
        async with self._lock:
            now = self._clock.monotonic()
            self._allowance = min(self._rate, self._allowance + (now - self._last) * self._rate)
            self._last = now
            if self._allowance < amount:
                await self._clock.sleep((amount - self._allowance) / self._rate)
                self._last = self._clock.monotonic()
                self._allowance = float(amount)
            self._allowance -= amount


class BundleVerifier(CursorWalk):
    """Verifies bundles from ``cursor`` on, one at a time; `run` until cancelled or the
    round ends (`reconciler.verify_walk.CursorWalk`)."""

    PREFIX = keys.RAW_BUNDLES_PREFIX
    NAME = "bundle"

    def __init__(
        self,
        ctx: ReconcilerContext,
        problems: ProblemBook,
        *,
        cursor: str,
        max_bundle_bytes: int,
        after_wait: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(ctx, problems, cursor=cursor, after_wait=after_wait)
        self._max_bytes = max_bundle_bytes
        self._rate = ByteRate(
            rate_per_s=ctx.reconciler_settings.verify_bytes_per_s, clock=ctx.clock
        )
        self.bytes_read = 0

    @classmethod
    def of(
        cls,
        ctx: ReconcilerContext,
        problems: ProblemBook,
        *,
        cursor: str,
        after_wait: Callable[[], Awaitable[None]] | None = None,
    ) -> BundleVerifier:
        """The audit's bundle verifier, bounded by the largest bundle the ingest settings
        allow (whether or not this store writes bundles yet: any collector may have)."""
        ingest = ctx.settings.ingest
        largest = max_bundle_bytes(
            bundle_max_bytes=ingest.bundle_max_bytes,
            max_frame_bytes=ingest.max_frame_bytes,
            bundle_max_frames=ingest.bundle_max_frames,
        )
        return cls(ctx, problems, cursor=cursor, max_bundle_bytes=largest, after_wait=after_wait)

    def summary(self) -> dict[str, object]:
        return {**super().summary(), "bytes_read": self.bytes_read}

    async def verify(self, info: ObjectInfo) -> None:
        key, size = info.key, info.size
        try:
            sha = keys.parse_raw_bundle_key(key)
        except keys.KeyFormatError:
            return  # not a bundle this protocol writes: not ours to judge
        if size > self._max_bytes:
            await self._corrupt(key, f"listed at {size} bytes, more than the largest bundle")
            return
        await self._rate.take(max(size, 1))
        await self.waited()
        body = await store_calls.read(self._ctx, key)
        if body is None:
            return  # deleted since it was listed
        self.bytes_read += len(body)
        try:
            if len(body) >= _CHECK_IN_THREAD_BYTES:
                await asyncio.to_thread(check_bundle, body, sha256=sha)
            else:
                check_bundle(body, sha256=sha)
        except BundleError as exc:
            await self._corrupt(key, f"bundle ({len(body)} bytes) fails its checks: {exc}")
            return
        self.verified += 1
        await self._problems.resolve("corrupt-blob", key)

    async def _corrupt(self, key: str, detail: str) -> None:
        self.problems += 1
        await self._problems.record("corrupt-blob", key, detail)
