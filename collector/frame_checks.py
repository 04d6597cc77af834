"""Frame checks off the event loop (PROTOCOL §2: decoding never runs on the thread that
answers other requests).

`FrameChecker` runs the codec of `protocol.frame` on a small pool of threads of its
own (``http.decode_threads``), so a slow check delays neither ``/healthz`` nor the
store calls of other requests (which share the loop's default executor). Two steps, so
the caller can authorize in between: `header` (CRC over the whole frame, then the fixed
header) and `payload_sha256` (the payload checked by `protocol.frame.check_payload`,
which never expands a metric dictionary, then the frame's SHA-256). Work waiting for a
thread is bounded by the collector's in-flight caps.

`payload_slot` admits as many payload checks as there are threads: a request charges
the memory its check may allocate (`protocol.frame.payload_check_memory_bound`) only
once it holds a slot, so requests queued behind busy threads hold their body but no check
charge (~9 MiB for a 64 KiB frame) and do not turn each other away with 429s.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from protocol.frame import FrameError, FrameHeader, check_payload, decode_header, frame_time_range

T = TypeVar("T")


def time_range_or_none(frame: bytes) -> tuple[int, int] | None:
    """The frame's point-time range, for a frame checked before (a spooled frame, a
    receiver's; run it off the event loop); None for bytes that are not a valid frame
    (only tests hand the acceptor such bytes). A row without a range counts as
    overlapping every range (PROTOCOL §2 late batches)."""
    try:
        return frame_time_range(frame)
    except FrameError:
        return None


def _check_and_hash(
    body: bytes, header: FrameHeader, max_raw_bytes: int
) -> tuple[str, tuple[int, int]]:
    ts_range = check_payload(body, header, max_raw_bytes=max_raw_bytes)
    return hashlib.sha256(body).hexdigest(), ts_range


class FrameChecker:
    def __init__(self, *, threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lm-frame-check")
        self._slots = asyncio.Semaphore(threads)

    def payload_slot(self) -> asyncio.Semaphore:
        """Hold (``async with``) while charging for and running one `payload_sha256`."""
        return self._slots

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on the pool (the receivers' decoding; hold a
        `payload_slot` while it runs)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, function, *args)

    async def header(self, body: bytes) -> FrameHeader:
        """`protocol.frame.decode_header`: raises FrameError."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, decode_header, body)

    async def payload_sha256(
        self, body: bytes, header: FrameHeader, max_raw_bytes: int
    ) -> tuple[str, tuple[int, int]]:
        """Check the payload (raises FrameError), then return the frame's SHA-256 and its
        points' (min, max) time in unix ns."""
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, _check_and_hash, body, header, max_raw_bytes
        )

    def close(self) -> None:
        """Stop the threads once the checks already queued are done."""
        self._pool.shutdown(wait=False, cancel_futures=True)
