"""The daemon merges catalog files beside the steady pass (PROTOCOL §3.9): while one merge
takes many loop intervals, the steady pass goes on cataloging what the log names."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

from chaos.sim.runtime import SimClock, run_virtual
from index import catalog
from protocol import keys
from protocol.clock import ManualClock
from reconciler.daemon import Reconciler
from reconciler.steady import SteadyScanner
from store.memory import MemoryStore
from tests.reconciler.conftest import catalog_keys, log_rows, make_settings, write_batches
from tests.reconciler.test_compaction import HOUR, compacting_context

LOOP_S = 10.0
HOUR_NS = 3600 * keys.NS_PER_S


class HeldMerges:
    """A store whose first ``put_file`` of a catalog file (only a merge uploads a file)
    waits until `release` — a merge that takes as long as the test wants."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner, self.url = inner, inner.url
        self.merge_started = asyncio.Event()
        self._release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def release(self) -> None:
        self._release.set()

    async def put_file(self, key: str, path: str, **conditions: Any) -> str:
        if key.startswith(keys.INDEX_CATALOG_PREFIX) and not self._release.is_set():
            self.merge_started.set()
            await self._release.wait()
        return await self.inner.put_file(key, path, **conditions)


def test_the_steady_pass_catalogs_while_a_merge_takes_many_intervals() -> None:
    async def main() -> tuple[bool, set[str], set[str], int]:
        clock = SimClock()
        memory = MemoryStore(clock=clock)
        store = HeldMerges(memory)
        reconciler = Reconciler(
            store=store,  # type: ignore[arg-type]
            settings=make_settings(loop_interval_s=LOOP_S),
            clock=clock,
            rng=random.Random(1),
            owner="reconciler-a",
        )
        task = asyncio.create_task(reconciler.run())
        # Two passes each catalog a batch of an hour long settled: two files, so the
        # next pass merges the hour.
        old = clock.now_ns() - 4 * HOUR_NS
        for n in range(2):
            batches = await write_batches(
                memory, agents=1, per_agent=2, first_agent=n, start_ns=old
            )
            await log_rows(memory, clock, batches, writer_id=f"c{n}")
            await asyncio.sleep(2 * LOOP_S)
        await asyncio.wait_for(store.merge_started.wait(), 10 * LOOP_S)
        # The merge is held; a collector logs new batches meanwhile.
        later = await write_batches(
            memory, agents=1, per_agent=3, first_agent=5, start_ns=clock.now_ns()
        )
        await log_rows(memory, clock, later, writer_id="c9")
        await asyncio.sleep(3 * LOOP_S)
        merge_still_held = not store._release.is_set()
        cataloged_meanwhile = await catalog_keys(memory)
        store.release()
        await asyncio.sleep(3 * LOOP_S)
        hour = keys.UtcHour.from_unix_ns(old)
        files_left = len([i async for i in memory.list(keys.index_catalog_hour_prefix(hour))])
        await reconciler.stop(grace_s=5.0)
        await task
        return merge_still_held, cataloged_meanwhile, {b.key for b in later}, files_left

    held, cataloged, logged, files_left = run_virtual(main)
    assert held  # the merge waited all along ...
    assert logged <= cataloged  # ... and the steady pass cataloged the new batches
    assert files_left >= 1  # the merge finished once released (its inputs wait the grace)


async def test_a_file_written_while_a_settled_hour_merges_is_merged_by_the_next_run(
    clock: ManualClock,
) -> None:
    store = MemoryStore(clock=clock)
    batches = await write_batches(store, agents=3, per_agent=2)
    ctx, compactor = await compacting_context(store, clock)
    scanner = SteadyScanner(ctx)
    for part in (batches[:2], batches[2:4]):
        await log_rows(store, clock, part)
        await scanner.run_pass()
    clock.advance(3 * 3600)  # settled
    held = HeldMerges(store)
    merging = asyncio.create_task(
        compactor.merge(dataclasses.replace(ctx, store=held))  # type: ignore[arg-type]
    )
    await held.merge_started.wait()
    await log_rows(store, clock, batches[4:])  # a straggler, cataloged meanwhile
    await scanner.run_pass()
    held.release()
    assert (await merging).files_merged == 2
    assert compactor.pending == 2  # the hour (its straggler) and the merge's inputs
    second = await compactor.merge(ctx)  # the straggler's file was not forgotten
    assert second.hours_compacted == 1
    clock.advance(ctx.settings.reconciler.catalog_grace_s + 1)
    assert (await compactor.delete_inputs(ctx)).inputs_deleted == 4  # 2 + merged + straggler
    assert len(await catalog.list_hour_files(store, HOUR)) == 1
    assert await catalog_keys(store) == {b.key for b in batches}
    assert compactor.pending == 0
