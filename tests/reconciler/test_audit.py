"""Full audits: resumable from their record (same id, original start, finished groups not
listed again), incomplete when a repair write fails, bounded concurrency."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from chaos.faulty_store import Fault, FaultyStore
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit import DONE, FRONTIER, AuditProgress, run_full_audit
from reconciler.audit_records import latest_audit, latest_completed_audit
from store.base import ObjectInfo, ObjectStore
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    context,
    derived_keys_in,
    make_settings,
    write_batches,
    write_conflict,
)

T = TypeVar("T")


class RecordingStore:
    """Passes calls through, recording listings and the most calls in flight at once."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.lists: list[tuple[str, str | None]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def _counted(self, call: Awaitable[T]) -> T:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)  # let other tasks start theirs: calls overlap as on S3
            return await call
        finally:
            self.in_flight -= 1

    async def get(self, key: str) -> tuple[bytes, str]:
        return await self._counted(self.inner.get(key))

    async def head(self, key: str) -> ObjectInfo:
        return await self._counted(self.inner.head(key))

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        return await self._counted(
            self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)
        )

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        self.lists.append((prefix, start_after))
        async for info in self.inner.list(prefix, start_after):
            yield info

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def close(self) -> None:
        await self.inner.close()


def agent_group(agent: int) -> str:
    return f"{keys.ACCEPTED_PREFIX}agent={f'agent-{agent:03d}'.encode().hex()}/"


async def test_an_interrupted_audit_resumes_where_it_stopped(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=12, per_agent=5, derived_entries=False)
    await write_conflict(memory_store, batches[0], clock.now_ns(), derived_entries=False)
    settings = make_settings(concurrency=2)
    first = await context(memory_store, clock, settings=settings)

    def stop_early(progress: AuditProgress) -> None:
        if progress.manifests_seen >= 20:
            first.stopping.set()

    interrupted = await run_full_audit(first, progress=stop_early, progress_interval_s=0)
    assert interrupted.status == "running"
    stored = await latest_audit(memory_store)
    assert stored == interrupted
    finished = {g for g, cursor in interrupted.cursors.items() if cursor == DONE}
    frontier = interrupted.cursors[FRONTIER]
    finished |= {agent_group(a) for a in range(12) if agent_group(a) <= frontier}
    assert 4 <= len(finished) < 12

    clock.advance(5)
    await first.fence.release()
    recording = RecordingStore(memory_store)
    second = await context(recording, clock, owner="reconciler-b", settings=settings)
    resumed = await run_full_audit(second, progress_interval_s=0)

    assert resumed.status == "completed"
    assert resumed.audit_id == interrupted.audit_id
    assert resumed.started_at_unix_ns == interrupted.started_at_unix_ns
    assert resumed.owner_epoch == second.epoch == first.epoch + 1
    assert (resumed.manifests_seen, resumed.quarantines_seen) == (60, 1)
    listed = {prefix for prefix, _after in recording.lists}
    assert not listed & finished
    discovery = [after for prefix, after in recording.lists if prefix == keys.ACCEPTED_PREFIX]
    assert discovery and all(after is not None and after > frontier for after in discovery)
    assert await derived_keys_in(memory_store) >= set().union(*(b.derived_keys for b in batches))
    assert await latest_completed_audit(memory_store) == resumed


async def test_a_failed_repair_write_leaves_the_audit_running_and_the_rerun_completes_it(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=3, per_agent=4, derived_entries=False)
    faulty = FaultyStore(memory_store)
    victim = batches[5].entry_key("accepted-by-blob")
    faulty.script("put_if_none_match", victim, *[Fault.UNAVAILABLE] * 5)  # outlasts the retries
    ctx = await context(faulty, clock)

    failed = await run_full_audit(ctx, progress_interval_s=0)

    assert failed.status == "running"
    assert ctx.metrics.store_failures.labels("repair")._value.get() == 1
    assert victim not in await derived_keys_in(memory_store)
    assert await latest_completed_audit(memory_store) is None

    again = await run_full_audit(ctx, progress_interval_s=0)
    assert again.status == "completed" and again.audit_id == failed.audit_id
    assert victim in await derived_keys_in(memory_store)


async def test_store_calls_in_flight_stay_within_the_concurrency_setting(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    await write_batches(memory_store, agents=8, per_agent=20, derived_entries=False)
    recording = RecordingStore(memory_store)
    ctx = await context(recording, clock, settings=make_settings(concurrency=3))

    record = await run_full_audit(ctx, progress_interval_s=1e9)

    assert record.status == "completed" and record.manifests_seen == 160
    assert 1 < recording.max_in_flight <= 3
