"""Retraction as PROTOCOL §3.7 says, the reconciler's side (issue 31 item 5).

``lm-reconciler retract`` writes only a record; the lease holder's audit writes a
``retracted`` row — a copy of the row that counts, in every hour where the key has a row —
so the key counts as absent everywhere (hour totals, the planner, the live query), is no
phantom again, and is not written twice. After a retraction a log row of the key is read
back before it counts (a collector re-logging the phantom catalogs nothing), and only a
record the store returns supersedes the ``retracted`` row: a key really accepted later
counts again, once.
"""

from __future__ import annotations

import random

import pyarrow.compute as pc

from index.catalog_tables import read_hour_table, read_hour_totals
from index.log_writer import IndexLogWriter
from index.rows import accepted_row
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.run import run_full_audit
from reconciler.retractions import retract
from reconciler.steady import SteadyScanner
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    HOUR_NS,
    context,
    make_batch,
    write_batch,
    write_batches,
)
from tests.reconciler.test_audit_checks import problem_subjects

S = keys.NS_PER_S


async def counted_kinds(store: MemoryStore, hour: keys.UtcHour) -> dict[str, str]:
    table = (await read_hour_table(store, hour)).table
    return dict(zip(table.column("key").to_pylist(), table.column("kind").to_pylist(), strict=True))


async def test_an_audit_writes_the_retracted_rows_in_every_hour_and_the_key_counts_as_absent(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    real = await write_batches(memory_store, agents=1, per_agent=2)
    never = make_batch(7, 0, clock.now_ns())  # its manifest was never created
    ctx = await context(memory_store, clock)
    row = accepted_row(never.manifest, etag='"abc"')
    other_hour = accepted_row(
        never.manifest.model_copy(update={"accepted_at_unix_ns": clock.now_ns() + HOUR_NS}),
        etag='"abd"',
    )
    await ctx.catalog_writer.write(row.hour, [row], writer="steady")
    await ctx.catalog_writer.write(other_hour.hour, [other_hour], writer="steady")
    clock.advance(3 * 3600)
    await run_full_audit(ctx)
    assert await problem_subjects(memory_store, "phantom-row") == {never.key}
    before = await read_hour_totals(memory_store, row.hour)

    await retract(memory_store, clock, never.key, reason="no manifest: bug 12", by="alice")
    clock.advance(3600)
    assert (await run_full_audit(ctx)).status == "completed"

    for hour in (row.hour, other_hour.hour):
        assert (await counted_kinds(memory_store, hour))[never.key] == "retracted"
    after = await read_hour_totals(memory_store, row.hour)
    assert after.batches == before.batches - 1  # absent from the hour's totals
    assert {b.key for b in real} <= set(await counted_kinds(memory_store, row.hour))
    assert await problem_subjects(memory_store, "phantom-row") == set()
    files = [info.key async for info in memory_store.list(keys.INDEX_CATALOG_PREFIX)]
    clock.advance(3600)
    assert (await run_full_audit(ctx)).status == "completed"
    assert [info.key async for info in memory_store.list(keys.INDEX_CATALOG_PREFIX)] == files
    assert await problem_subjects(memory_store, "phantom-row") == set()


async def test_after_a_retraction_a_log_row_of_the_key_is_read_back_before_it_counts(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    never = make_batch(7, 0, clock.now_ns())
    ctx = await context(memory_store, clock)
    row = accepted_row(never.manifest, etag='"abc"')
    await ctx.catalog_writer.write(row.hour, [row], writer="steady")
    clock.advance(3 * 3600)
    await run_full_audit(ctx)
    await retract(memory_store, clock, never.key, reason="no manifest", by="alice")
    clock.advance(3600)
    await run_full_audit(ctx)
    assert (await counted_kinds(memory_store, row.hour))[never.key] == "retracted"

    # A collector logs the phantom again as its own create (a bug): read back, not found.
    writer = IndexLogWriter(store=memory_store, clock=clock, rng=random.Random(3), writer_id="c")
    writer.append(accepted_row(never.manifest, etag='"abc"', own_create=True))
    await writer.flush()
    result = await SteadyScanner(ctx).run_pass()
    assert result.segments_read == 1 and result.rows_cataloged == 0
    assert (await counted_kinds(memory_store, row.hour))[never.key] == "retracted"

    # Really accepted later (the store holds it now): it counts again, once.
    await write_batch(memory_store, never)
    clock.advance(3600)
    assert (await run_full_audit(ctx)).status == "completed"
    table = (await read_hour_table(memory_store, row.hour)).table
    counted = table.filter(pc.equal(table.column("key"), never.key))
    assert counted.num_rows == 1 and counted.column("kind").to_pylist() == ["accepted"]
    assert (await read_hour_totals(memory_store, row.hour)).batches == 1
