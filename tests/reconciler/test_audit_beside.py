"""The full audit runs beside the steady pass (PROTOCOL §3.9): while an audit's listing
takes many loop intervals, the daemon keeps cataloging what the log names, and compaction
deletes no input until the audit is done (it pinned the files it reads)."""

from __future__ import annotations

import asyncio
import random

from chaos.sim_runtime import SimClock, run_virtual
from protocol import keys
from reconciler.audit_records import latest_audit, latest_completed_audit
from reconciler.daemon import Reconciler
from store.memory import MemoryStore
from tests.reconciler.conftest import catalog_keys, log_rows, make_settings, write_batches
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
        await asyncio.sleep(LISTING_S)
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
