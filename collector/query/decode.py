"""Decoding batches for the live window, charged to the window's memory account.

`LiveDecoder` decodes a frame in three steps on worker threads, never on the event loop,
at most ``DECODE_CONCURRENCY`` frames at a time, and reserves in the window
(`LiveWindow.reserve`, which evicts the oldest batches to make room) what a frame keeps
before it is allocated:

1. the header and its CRC (`protocol.frame.decode_header`; nothing kept);
2. the payload checked (`protocol.frame.open_payload`), reserved ``payload_raw_len``
   (the decompressed stream it keeps until step 3); this also yields the points'
   decoded size (`OpenedFrame.decoded_bytes`), refused past ``max_raw_bytes`` as at
   intake;
3. the points decoded, reserved that size (a dictionary-encoded metric can make it many
   times the frame's).

The check's own transient work (`protocol.frame.payload_check_memory_bound`, the same
as at intake) is bounded by the concurrency, not reserved: reserving its worst case per
frame would evict held batches for memory a normal frame never uses.

The decoded-size reservation is handed to the caller with the frame (`Decoded`), which
releases it by adding the frame to the window (`LiveWindow.add(..., reserved=...)`,
which charges the frame's own buffers instead) or by `Decoded.discard`: no frame is held
uncharged between its decode and the window.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from protocol.frame import Frame, decode_header, open_payload

from .window import LiveWindow

DECODE_CONCURRENCY = 2


class NoRoom(Exception):
    """The window's memory account cannot hold this decode (other decodes fill it)."""


@dataclass(frozen=True, slots=True)
class Decoded:
    frame: Frame
    reserved: int  # still charged to the window: pass to `LiveWindow.add` or `discard`

    def discard(self, window: LiveWindow) -> None:
        window.release(self.reserved)


class LiveDecoder:
    def __init__(self, window: LiveWindow, *, max_raw_bytes: int) -> None:
        self._window = window
        self._max_raw_bytes = max_raw_bytes
        self._running = asyncio.Semaphore(DECODE_CONCURRENCY)

    async def decode(self, body: bytes) -> Decoded:
        """Decode ``body`` as above. Raises `protocol.frame.FrameError` or `NoRoom`."""
        window = self._window
        async with self._running:
            header = await asyncio.to_thread(decode_header, body)
            stream = header.payload_raw_len
            if not window.reserve(stream):
                raise NoRoom(f"the payload takes {stream} bytes decompressed")
            try:
                opened = await asyncio.to_thread(
                    open_payload, body, header, max_raw_bytes=self._max_raw_bytes
                )
                size = opened.decoded_bytes
                if not window.reserve(size):
                    raise NoRoom(f"the points decode to {size} bytes")
                try:
                    frame = await asyncio.to_thread(opened.decode)
                except BaseException:
                    window.release(size)
                    raise
                return Decoded(frame, size)
            finally:
                window.release(stream)
