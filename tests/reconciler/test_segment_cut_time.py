"""Segments are named by their cut time (PROTOCOL §3.7, issue 31 item 2).

A duplicate's or a re-send's log row carries the stored record's old ``accepted_at``. A
segment named by its oldest row's time would sort before the readers' positions minus the
lookback (300 s, the default) and never be listed, and with it every new batch cut in the
same flush: cataloged, rolled up and shown live only after the next full audit. Named by
its cut time it is listed by the next steady pass and the next poll of the live follower.
"""

from __future__ import annotations

import random

from collector.query.sources import LogFollower
from collector.query.window import LiveWindow
from config import Settings
from index.log_writer import IndexLogWriter
from protocol import keys
from protocol.clock import ManualClock
from reconciler.steady import SteadyScanner
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    HOUR_NS,
    catalog_keys,
    context,
    log_rows,
    log_rows_of,
    make_batch,
    make_settings,
    write_batch,
)

S = keys.NS_PER_S


async def test_a_flush_with_a_20_minute_old_duplicates_row_is_cataloged_and_shown_live(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    settings = make_settings(lookback_s=300.0)
    assert settings.reconciler.lookback_s == 300.0 == Settings().reconciler.lookback_s
    ctx = await context(memory_store, clock, settings=settings)
    scanner = SteadyScanner(ctx)
    window = LiveWindow(window_s=3600, max_points=10_000, max_bytes=1 << 24)
    follower = LogFollower(
        memory_store,
        window,
        clock=clock,
        poll_interval_s=1,
        lookback_s=Settings().log_lookback_floor_s(),
        max_pending=100,
        max_raw_bytes=1 << 20,
    )
    # Within one hour (an hour's end would split the old writer's flush by hour).
    clock.advance((HOUR_NS - clock.now_ns() % HOUR_NS) / S + 60)
    old = make_batch(0, 1, clock.now_ns())
    await write_batch(memory_store, old)
    await log_rows(memory_store, clock, [old], writer_id="c1")
    await scanner.run_pass()
    await follower.poll_once()
    # 20 minutes of other traffic move both readers' positions on.
    for minute in range(1, 21):
        clock.advance(60)
        other = make_batch(1, minute, clock.now_ns())
        await write_batch(memory_store, other)
        await log_rows(memory_store, clock, [other], writer_id="c2")
        await scanner.run_pass()
        await follower.poll_once()

    # One flush: a re-send of ``old`` answered as a duplicate (its row carries the stored
    # record's accepted_at, 20 minutes ago), and a new batch.
    clock.advance(1)
    new = make_batch(2, 1, clock.now_ns())
    await write_batch(memory_store, new)
    writer = IndexLogWriter(store=memory_store, clock=clock, rng=random.Random(9), writer_id="c3")
    for row in log_rows_of([old, new]):
        assert writer.append(row)
    await writer.flush()
    cut_ns = clock.now_ns()
    clock.advance(1)
    result = await scanner.run_pass()
    assert result.segments_read == 1
    assert new.key in await catalog_keys(memory_store)
    await follower.poll_once()
    assert new.manifest.identity.manifest_id in window
    [segment] = [
        info.key async for info in memory_store.list(keys.INDEX_LOG_PREFIX) if "-c3-" in info.key
    ]
    assert keys.parse_index_log_segment_key(segment).time_ns == cut_ns
