"""`bench.gc` with orphan bundles (issue 33, PROTOCOL §3.10): bundles no record names,
planted at real time the way a collector writes them, and a store that counts the bytes
the GC runs read.

A planted bundle holds ``--bundle-frames`` frames of about ``--bundle-frame-bytes`` each
(default 100 x ~10 KiB: ~1 MiB), each frame of one of `AGENTS` agents (one boot each) at
a sequence range of its own that no manifest ever names: every frame is unknown, so the
bundle is an orphan the GC may delete only whole, after rule 7 read every frame's
manifest key and listed each agent/boot pair's quarantine prefixes. Half the bundles have
a ``blob`` log row (the steady pass nominates them), half none (only the audit's orphan
file finds them). The store's feature record says ``bundles: true`` first, as it must
before any bundle is written.

Frames are made from one encoded template per agent by re-stamping ``seq_start``,
``seq_end`` and the CRC (an encode costs ~20 ms; 100,000 of them would take minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import random
import struct
import uuid
import zlib
from collections import Counter
from collections.abc import Iterator

from index.log_writer import IndexLogWriter
from index.rows import blob_row
from protocol import keys
from protocol.bundle import encode_bundle
from protocol.clock import SystemClock
from protocol.frame import HEADER_STRUCT
from protocol.frame_encode import encode_frame, points_table
from protocol.records import FeatureRecord
from reconciler.gc.bounded import for_each_bounded
from store.base import ObjectStore
from store.counting import CountingStore

AGENTS = 16
BOOT = uuid.UUID("9c0b0e5e-0000-4000-8000-000000000033")
CONCURRENCY = 8
_SEQS = struct.Struct(">QQ")
_SEQ_AT = 24  # PROTOCOL §1: seq_start, seq_end follow magic..boot_id (bytes 24-40)


def template(agent_id: str, frame_bytes: int) -> tuple[bytes, int]:
    """An encoded frame of about ``frame_bytes`` and its point count (sized by a first
    encode of 100 points: the encoding compresses)."""
    points = 100
    for _ in range(2):  # the size per point shrinks as frames grow: a second step
        probe, points = _encoded(agent_id, points)
        points = max(1, frame_bytes * points // len(probe))
    return _encoded(agent_id, points)


def _encoded(agent_id: str, points: int) -> tuple[bytes, int]:
    now = SystemClock().now_ns()
    table = points_table(
        [now + n for n in range(points)],
        [f"bench.gc.bundle.metric.{n:06d}" for n in range(points)],
        [float(n) * 1.0001 for n in range(points)],
        [None] * points,
    )
    return encode_frame(agent_id=agent_id, boot_id=BOOT, seq_start=0, points=table), points


def restamp(frame: bytes, points: int, seq_start: int) -> bytes:
    """The frame at another sequence range (its identity), with its CRC made anew."""
    body = (
        frame[:_SEQ_AT]
        + _SEQS.pack(seq_start, seq_start + points - 1)
        + frame[_SEQ_AT + _SEQS.size : -4]
    )
    return body + zlib.crc32(body).to_bytes(4, "big")


async def plant_orphan_bundles(
    store: ObjectStore, args: argparse.Namespace, *, rng: random.Random
) -> tuple[set[str], int]:
    """Turn the gate on, then write ``args.bundles`` orphan bundles (module doc); the
    bundles' hashes and their bytes in all."""
    assert HEADER_STRUCT.size >= _SEQ_AT + _SEQS.size
    record = FeatureRecord(bundles=True, written_by="bench.gc", written_at_unix_ns=1)
    with contextlib.suppress(Exception):  # already on (a store seeded twice)
        await store.put(keys.INDEX_FEATURES_KEY, record.to_json(), if_none_match=True)
    clock = SystemClock()
    log = IndexLogWriter(store=store, clock=clock, rng=rng, writer_id="bench-gc-bundler")
    templates = [
        template(f"gcbench-bundle-{a:02d}", args.bundle_frame_bytes) for a in range(AGENTS)
    ]
    hashes: set[str] = set()
    sizes = [0]

    async def plant(b: int) -> None:
        frames = []
        for j in range(args.bundle_frames):
            body, points = templates[j % AGENTS]
            seq = (b * args.bundle_frames + j) * points  # unique per agent: no twin
            frames.append(restamp(body, points, seq))
        bundle = encode_bundle(frames)
        await store.put(bundle.key, bundle.data, if_none_match=True)
        if b % 2 == 0:
            log.append(blob_row(bundle.sha256, clock.now_ns(), bundle=True))
        hashes.add(bundle.sha256)
        sizes[0] += len(bundle.data)

    await for_each_bounded(range(args.bundles), plant, CONCURRENCY)
    await log.flush()
    if log.buffered:
        raise RuntimeError(f"the index log kept {log.buffered} rows unflushed")
    return hashes, sizes[0]


_READING = contextvars.ContextVar[str | None]("bench_gc_reading", default=None)


class ByteCountingStore(CountingStore):
    """A `CountingStore` that also sums the bytes of GET answers read within `reading`
    (the GC runs, and the tasks they start)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.bytes_read: Counter[str] = Counter()

    @contextlib.contextmanager
    def reading(self, name: str) -> Iterator[None]:
        token = _READING.set(name)
        try:
            yield
        finally:
            _READING.reset(token)

    def _read(self, n: int) -> None:
        if (name := _READING.get()) is not None:
            self.bytes_read[name] += n

    async def get(self, key: str) -> tuple[bytes, str]:
        body, etag = await super().get(key)
        self._read(len(body))
        return body, etag

    async def get_if_none_match(self, key: str, etag: str) -> tuple[bytes, str] | None:
        got = await super().get_if_none_match(key, etag)
        self._read(len(got[0]) if got else 0)
        return got

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        body = await super().get_range(key, offset, length)
        self._read(len(body))
        return body
