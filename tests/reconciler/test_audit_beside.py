"""The full audit runs beside the steady pass (PROTOCOL §3.9): while an audit's listing
takes many loop intervals, the daemon keeps cataloging what the log names, and compaction
deletes no input until the audit is done (it pinned the files it reads)."""

from __future__ import annotations

import asyncio
import random

from chaos.sim.runtime import SimClock, run_virtual
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.records import latest_audit, latest_completed_audit
from reconciler.audit.run import run_full_audit
from reconciler.daemon import Reconciler
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    catalog_keys,
    context,
    log_rows,
    make_batch,
    make_settings,
    write_batch,
    write_batches,
)
from tests.reconciler.test_lease import SlowListings

LOOP_S = 10.0
LISTING_S = 20 * LOOP_S


def test_the_steady_pass_catalogs_while_an_audit_lists_for_many_intervals() -> None:
    async def main() -> tuple[bool, set[str], set[str], set[str], bool]:
        clock = SimClock()
        memory = MemoryStore(clock=clock)
        first = await write_batches(memory, agents=1, per_agent=3, start_ns=clock.now_ns())
        store = SlowListings(memory, slow_prefix=keys.ACCEPTED_PREFIX, delay_s=LISTING_S)
        reconciler = Reconciler(
            store=store,  # type: ignore[arg-type]
            settings=make_settings(loop_interval_s=LOOP_S),
            clock=clock,
            rng=random.Random(1),
            owner="reconciler-a",
        )
        task = asyncio.create_task(reconciler.run())
        await asyncio.sleep(3 * LOOP_S)  # the first audit (ever) is due at once: it lists
        # A collector logs new batches while the audit still lists accepted/v1/.
        later = await write_batches(
            memory, agents=1, per_agent=3, first_agent=1, start_ns=clock.now_ns()
        )
        await log_rows(memory, clock, later, writer_id="c1")
        await asyncio.sleep(3 * LOOP_S)
        running = await latest_audit(memory, catalog_only=True)
        audit_still_running = running is not None and running.status == "running"
        cataloged_meanwhile = await catalog_keys(memory)
        # The ranged listing (PROTOCOL §3.9) makes two slow listings in turn: the
        # delimiter listing of its plan, then the ranges (in parallel).
        await asyncio.sleep(2 * LISTING_S)
        completed = await latest_completed_audit(memory) is not None
        await reconciler.stop(grace_s=5.0)
        await task
        return (
            audit_still_running,
            cataloged_meanwhile,
            {b.key for b in later},
            {b.key for b in first},
            completed,
        )

    running, cataloged, logged, unlogged, completed = run_virtual(main)
    assert running  # the audit was listing all along ...
    assert logged <= cataloged  # ... and the steady pass cataloged the logged batches
    assert not unlogged & cataloged  # only what no log row named waits for the audit
    assert completed


class CreatesWhileListed:
    """Creates ``batch`` (advancing the clock past the settle margin first) the moment the
    audit lists accepted/."""

    def __init__(self, inner: MemoryStore, clock: object, batch: object) -> None:
        self.inner, self.url, self._clock, self._batch = inner, inner.url, clock, batch
        self.gets: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def get(self, key: str) -> tuple[bytes, str]:
        self.gets.append(key)
        return await self.inner.get(key)

    async def list(self, prefix: str, start_after: str | None = None):  # type: ignore[no-untyped-def]
        if prefix.startswith(keys.ACCEPTED_PREFIX) and self._batch is not None:
            batch, self._batch = self._batch, None
            self._clock.advance(120.0)  # type: ignore[attr-defined]  # past the settle margin
            await write_batch(self.inner, batch)  # type: ignore[arg-type]
        async for info in self.inner.list(prefix, start_after):
            yield info


async def test_an_audit_leaves_records_created_after_its_start_to_the_steady_pass(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    """PROTOCOL §3.7: a completed audit promises the records that existed at its start; one
    created while it lists is the steady pass's (from the log), not read by the audit."""
    old = await write_batches(memory_store, agents=1, per_agent=2)
    young = make_batch(5, 0, clock.now_ns() + 120 * keys.NS_PER_S)
    store = CreatesWhileListed(memory_store, clock, young)
    ctx = await context(store, clock)  # type: ignore[arg-type]

    record = await run_full_audit(ctx)

    assert record.status == "completed"
    assert young.key not in store.gets and young.key not in await catalog_keys(memory_store)
    assert {b.key for b in old} <= await catalog_keys(memory_store)
