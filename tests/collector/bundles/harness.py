"""An acceptor with group commit over a memory store whose raw writes can be held (a
helper, not tests): the first frame's write holds the only slot while later frames join
the open bundle, so which frames share a bundle is decided by the test, not by timing."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable
from typing import Any

from chaos.faulty_store import FaultyStore
from collector.accept import Accepted, BatchAcceptor, IdentityConflictFound
from collector.bundles.bundler import BundleLimits
from collector.bundles.options import BundleOptions
from index.log_writer import IndexLogWriter
from protocol import keys, records
from protocol.clock import ManualClock
from protocol.frame import decode_header
from store.base import ObjectStore
from store.memory import MemoryStore
from store.retry import Backoff
from tests.collector.conftest import make_frame


class HeldStore:
    """Wraps a store (a fresh `MemoryStore` by default); its raw writes (frame blobs and
    bundles) wait for `release` while `held` (only the write of key `hold_only` when
    set). Everything else is the inner store's."""

    def __init__(self, inner: ObjectStore | None = None) -> None:
        self.inner: ObjectStore = inner if inner is not None else MemoryStore()
        self.url = self.inner.url
        self.held = False
        self.hold_only: str | None = None
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        raw = key.startswith(("raw-blobs/", "raw-bundles/"))
        if self.held and raw and self.hold_only in (None, key):
            await self.release.wait()
        return await self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)


class BundleHarness:
    def __init__(
        self,
        *,
        enabled: bool = True,
        budget_s: float = 5.0,
        limits: BundleLimits | None = None,
        points_retention_s: float | None = None,
        memory: HeldStore | None = None,
    ) -> None:
        self.clock = ManualClock()
        self.memory = memory or HeldStore()
        self.store = FaultyStore(self.memory, seed=3)
        self.enabled = enabled
        self.raw_puts: list[int] = []
        self.dead_bytes = 0
        self.ops: list[tuple[str, str]] = []
        self.index_log = IndexLogWriter(
            store=self.store,
            clock=self.clock,
            rng=random.Random(1),
            writer_id="collector-b",
            flush_rows=10_000,
            max_buffered_rows=10_000,
        )
        self.acceptor = BatchAcceptor(
            store=self.store,
            collector_id="collector-b",
            clock=self.clock,
            rng=random.Random(2),
            index_log=self.index_log,
            budget_s=budget_s,
            backoff=Backoff(attempts=6, base_s=0.001, cap_s=0.01),
            observe_store_op=lambda op, result: self.ops.append((op, result)),
            bundles=BundleOptions(
                limits=limits
                or BundleLimits(max_in_flight=1, send_margin_s=min(1.0, budget_s / 2)),
                enabled=lambda: self.enabled,
                points_retention_s=points_retention_s,
                on_raw_put=self.raw_puts.append,
                on_dead_bytes=self._dead,
            ),
        )

    def _dead(self, size: int) -> None:
        self.dead_bytes += size

    async def accept(
        self, frame: bytes, *, resend: bool = False, ts_range: tuple[int, int] | None = None
    ) -> Accepted | IdentityConflictFound:
        """Accept ``frame`` (points of the last second unless ``ts_range`` says)."""
        sha = frame_sha(frame)
        now_ns = self.clock.now_ns()
        ts_range = ts_range or (now_ns - 1_000_000_000, now_ns)
        return await self.acceptor.accept(
            decode_header(frame), frame, sha, resend=resend, ts_range=ts_range
        )

    async def held_then_bundled(
        self, first: bytes, rest: list[bytes]
    ) -> list[Accepted | IdentityConflictFound | BaseException]:
        """``first`` takes the only write slot (its frame blob's PUT held); ``rest`` join
        the open bundle meanwhile; then the write is let go. Answers in that order."""
        self.memory.held = True
        tasks = [asyncio.create_task(self.accept(first))]
        await wait_until(lambda: self.acceptor.bundled is not None and self.bundler_busy())
        tasks += [asyncio.create_task(self.accept(frame)) for frame in rest]
        for _ in range(5):
            await asyncio.sleep(0)  # every later frame has joined the open bundle
        self.memory.held = False
        self.memory.release.set()
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    def bundler_busy(self) -> bool:
        assert self.acceptor.bundled is not None
        return self.acceptor.bundled.bundler.in_flight > 0

    async def manifest(self, frame: bytes) -> records.AcceptedManifest:
        header = decode_header(frame)
        identity = keys.BatchIdentity(
            header.agent_id, header.boot_id, header.seq_start, header.seq_end
        )
        body, _ = await self.memory.get(keys.accepted_manifest_key(identity))
        return records.AcceptedManifest.from_json(body, reads_bundles=True)

    def op_names(self) -> list[str]:
        return [op for op, _ in self.ops]


def frame_sha(frame: bytes) -> str:
    return hashlib.sha256(frame).hexdigest()


def frames(n: int, *, agent: str = "agent-b", value: float = 1.0) -> list[bytes]:
    """``n`` valid frames of distinct identities (seq 0, 10, 20, ...)."""
    return [make_frame(agent, seq_start=10 * i, value=value) for i in range(n)]


async def wait_until(condition: Callable[[], bool], *, rounds: int = 1000) -> None:
    """Yield to the loop until ``condition()`` holds (bounded: a hang fails the test)."""
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")
