"""The first ``/v1/query`` answers of a query collector that starts on a long history:
``sealed_through_ns`` read in the background (`collector.query.coverage`, answers wait at
most ``query.history_wait_s``) against answers that wait for the whole history, the
baseline (what the coverage did before: every sealed hour read before the answer),
measured in the same run.

    python -m bench.coverage_history [--hours 200] [--rows 3600] [--latency-ms 20] [--rounds 3]
    python -m bench.coverage_history --entries 8640 [--hours 24] [--rounds 3]

MiniStack with `bench.delay_proxy` in front (every request ``--latency-ms`` longer, as
S3 from a nearby host); ``--hours`` sealed catalog hours of ``--rows`` batches each (one
catalog file an hour, as after compaction), a completed listing audit after them, and a
ledger that holds every batch (taken from one full read first). Then rounds, interleaved:
a fresh `Coverage` (a process that just started) answers until ``sealed_through_ns``
reaches the audit's limit, with the product's wait and with an unbounded one, and a
process restarted with ``query.history_cache_dir`` (`collector.query.history_cache`,
written by a process that read the history before the rounds). Prints the
first answer's latency, how many answers it took and the time until the history was
read, per round, and the medians. Processes started here are stopped by PID.

``--entries N``: a process that has read its history and then was not asked for a while
(the reconciler writes a catalog file every pass: ~8,600 a day). Each round a fresh
`Coverage` reads the history, ``N`` new ``catalog-created`` entries are planted (naming a
file of the current, unsealed hour, as the steady pass's do, so no hour is read again),
and the next answer is timed: the baseline reads them one after another before
answering (`collector.query.coverage.ENTRY_READERS` = 1 and no bound on the wait: what
the code did before), against the product's readers and wait.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa

from bench.catalog_hour import synthetic_rows
from bench.delay_proxy import DelayedStores, delayed_ministack
from collector.query import coverage as coverage_module
from collector.query.coverage import Coverage
from collector.query.history_cache import HistoryCache
from config.query_settings import QuerySettings
from index.audits import sealed_limit_ns
from index.catalog import CatalogWriter
from protocol import keys, records
from protocol.clock import ManualClock
from store.base import ObjectStore

PREFIX = "bench-coverage"
NS = 1_000_000_000
FIRST = keys.UtcHour.from_unix_ns(1_790_000_000 * NS)
MARGIN_S = 60.0
Timing = tuple[float, int, float]  # first answer s, answers, s until complete


def hours(count: int) -> list[keys.UtcHour]:
    out = [FIRST]
    while len(out) < count:
        out.append(out[-1].next())
    return out


async def plant(store: ObjectStore, count: int, rows: int) -> int:
    """``count`` catalog hours of ``rows`` batches and a completed audit after them;
    returns the audit's sealed limit."""
    writer = CatalogWriter(
        store=store, clock=ManualClock(FIRST.start_ns), rng=random.Random(1), epoch=1
    )
    rng = np.random.default_rng(7)
    for i, hour in enumerate(hours(count)):
        table = synthetic_rows(i * rows, rows, rng)
        stamps = pa.array(
            hour.start_ns + np.arange(rows, dtype=np.int64) * (3600 * NS // rows), pa.int64()
        )
        table = table.set_column(
            table.schema.get_field_index("time_unix_ns"), "time_unix_ns", stamps
        )
        await writer.write_table(hour, table, writer="steady")
    started = hours(count)[-1].next().start_ns + int(2 * MARGIN_S * NS)
    audit = records.AuditRecord(
        audit_id="00000000000000b1",
        started_at_unix_ns=started,
        completed_at_unix_ns=started + NS,
        status="completed",
        owner_epoch=1,
        catalog=True,
    )
    await store.put(keys.audit_key(started, audit.audit_id), audit.to_json())
    return sealed_limit_ns(started, int(MARGIN_S * NS))


def coverage(store: ObjectStore, wait_s: float, cache: Path | None = None) -> Coverage:
    """A process that just started; with ``cache``, its ``query.history_cache_dir``."""
    kept = HistoryCache(cache, store_name=PREFIX) if cache is not None else None
    return Coverage(
        store,
        settle_margin_s=MARGIN_S,
        refresh_interval_s=0.0,
        history_wait_s=wait_s,
        history_cache=kept,
    )


async def full_ledger(store: ObjectStore) -> Any:
    """A snapshot whose ledger holds every batch: the catalog totals of one full read."""
    reader = coverage(store, wait_s=1e9)
    await reader.sealed_through_ns(None)
    totals = dict(reader._catalog)
    await reader.close()
    return SimpleNamespace(ledger_hours=totals)


async def timed_answers(answering: Coverage, snapshot: Any, limit_ns: int) -> Timing:
    """(first answer's seconds, answers until sealed_through_ns reached the limit, seconds
    until then)."""
    started = time.perf_counter()
    first = None
    answers = 0
    while True:
        sealed = await answering.sealed_through_ns(snapshot)
        answers += 1
        first = time.perf_counter() - started if first is None else first
        if sealed >= limit_ns:
            return first, answers, time.perf_counter() - started


async def answers_until_read(
    store: ObjectStore, snapshot: Any, limit_ns: int, wait_s: float, cache: Path | None
) -> Timing:
    """`timed_answers` of a process that just started (with ``cache``: restarted, its
    history cache written by an earlier process)."""
    fresh = coverage(store, wait_s, cache)
    try:
        return await timed_answers(fresh, snapshot, limit_ns)
    finally:
        await fresh.close()


async def plant_entries(store: ObjectStore, epoch: int, count: int, hour: keys.UtcHour) -> None:
    """``count`` entries of writer epoch ``epoch``, each naming a file of ``hour``."""
    slots = asyncio.Semaphore(32)

    async def one(sequence: int) -> None:
        entry = records.CatalogCreated(
            catalog_key=keys.index_catalog_key(hour, epoch, sequence),
            rows=1,
            hour=hour.iso,
            writer="steady",
        )
        async with slots:
            await store.put(keys.catalog_created_key(epoch, sequence), entry.to_json())

    await asyncio.gather(*(one(sequence) for sequence in range(count)))


async def after_quiet_spell(
    stores: DelayedStores, snapshot: Any, limit_ns: int, epoch: int, entries: int, wait_s: float
) -> Timing:
    """`timed_answers` after ``entries`` new entries, of a process that had read its
    history."""
    warm = coverage(stores.delayed, 1e9)
    try:
        await warm.sealed_through_ns(snapshot)
        current = keys.UtcHour.from_unix_ns(limit_ns).next()
        await plant_entries(stores.direct, epoch, entries, current)
        warm._wait_s = wait_s
        return await timed_answers(warm, snapshot, limit_ns)
    finally:
        await warm.close()


async def run(
    count: int, rows: int, entries: int, latency_ms: float, rounds: int, work: Path
) -> None:
    """Rounds of the baseline and the product, interleaved: after a start (``entries``
    0) or after ``entries`` new entries; prints each and the medians."""
    wait, readers = QuerySettings().history_wait_s, coverage_module.ENTRY_READERS
    cache = work / "history-cache"
    if entries:
        modes: dict[str, tuple[float, int, Path | None]] = {
            "one after another, waits (baseline)": (1e9, 1, None),
            f"{readers} readers, waits <= {wait:g} s": (wait, readers, None),
        }
        done, what = "complete again after", f"after {entries} new entries"
    else:
        modes = {
            "waits for history (baseline)": (1e9, readers, None),
            f"waits <= {wait:g} s": (wait, readers, None),
            f"restarted with history_cache_dir, waits <= {wait:g} s": (wait, readers, cache),
        }
        done, what = "history read in", f"{count} hours of {rows} batches"
    firsts: dict[str, list[float]] = {m: [] for m in modes}
    totals: dict[str, list[float]] = {m: [] for m in modes}
    epoch = 100
    try:
        async with delayed_ministack(work, PREFIX, latency_ms) as stores:
            limit = await plant(stores.direct, count, rows)
            snapshot = await full_ledger(stores.direct)
            if not entries:  # an earlier process kept what it read
                await answers_until_read(stores.direct, snapshot, limit, 1e9, cache)
            for round_no in range(rounds):
                for mode, (wait_s, entry_readers, kept) in modes.items():
                    coverage_module.ENTRY_READERS = entry_readers
                    if entries:
                        epoch += 1
                        timing = await after_quiet_spell(
                            stores, snapshot, limit, epoch, entries, wait_s
                        )
                    else:
                        timing = await answers_until_read(
                            stores.delayed, snapshot, limit, wait_s, kept
                        )
                    first, answers, total = timing
                    firsts[mode].append(first)
                    totals[mode].append(total)
                    print(
                        f"round {round_no + 1}: {mode}: first answer {first:.3f} s, "
                        f"{answers} answer(s), {done} {total:.2f} s"
                    )
    finally:
        coverage_module.ENTRY_READERS = readers
    base, *ours = (statistics.median(firsts[m]) for m in modes)
    base_total, *ours_total = (statistics.median(totals[m]) for m in modes)
    for mode, first, total in zip(list(modes)[1:], ours, ours_total, strict=True):
        print(
            f"median first answer ({what}, {latency_ms:g} ms a request): baseline {base:.3f} s, "
            f"{mode} {first:.3f} s ({base / first:.1f}x sooner); {done} {base_total:.2f} s "
            f"against {total:.2f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=200)
    parser.add_argument("--rows", type=int, default=3600)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--entries", type=int, default=0, help="time answers after N entries")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lm-bench-coverage-") as work:
        asyncio.run(
            run(args.hours, args.rows, args.entries, args.latency_ms, args.rounds, Path(work))
        )


if __name__ == "__main__":
    main()
