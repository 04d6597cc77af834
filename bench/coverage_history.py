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
reaches the audit's limit, with the product's wait and with an unbounded one. Prints the
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


def coverage(store: ObjectStore, wait_s: float) -> Coverage:
    return Coverage(store, settle_margin_s=MARGIN_S, refresh_interval_s=0.0, history_wait_s=wait_s)


async def full_ledger(store: ObjectStore) -> Any:
    """A snapshot whose ledger holds every batch: the catalog totals of one full read."""
    reader = coverage(store, wait_s=1e9)
    await reader.sealed_through_ns(None)
    totals = dict(reader._catalog)
    await reader.close()
    return SimpleNamespace(ledger_hours=totals)


async def answers_until_read(
    store: ObjectStore, snapshot: Any, limit_ns: int, wait_s: float
) -> tuple[float, int, float]:
    """(first answer's seconds, answers until sealed_through_ns reached the limit, seconds
    until then) for a process that just started."""
    fresh = coverage(store, wait_s)
    started = time.perf_counter()
    first = None
    answers = 0
    try:
        while True:
            sealed = await fresh.sealed_through_ns(snapshot)
            answers += 1
            if first is None:
                first = time.perf_counter() - started
            if sealed >= limit_ns:
                return first, answers, time.perf_counter() - started
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
) -> tuple[float, int, float]:
    """(first answer's seconds, answers until complete again, seconds until then) after
    ``entries`` new entries, for a process that had read its history."""
    warm = coverage(stores.delayed, 1e9)
    try:
        await warm.sealed_through_ns(snapshot)
        current = keys.UtcHour.from_unix_ns(limit_ns).next()
        await plant_entries(stores.direct, epoch, entries, current)
        warm._wait_s = wait_s
        started = time.perf_counter()
        first = None
        answers = 0
        while True:
            sealed = await warm.sealed_through_ns(snapshot)
            answers += 1
            first = time.perf_counter() - started if first is None else first
            if sealed >= limit_ns:
                return first, answers, time.perf_counter() - started
    finally:
        await warm.close()


async def run_entries(
    count: int, rows: int, entries: int, latency_ms: float, rounds: int, work: Path
) -> None:
    product_wait, product_readers = QuerySettings().history_wait_s, coverage_module.ENTRY_READERS
    modes = {
        "one after another, waits (baseline)": (1e9, 1),
        f"{product_readers} readers, waits <= {product_wait:g} s": (product_wait, product_readers),
    }
    firsts: dict[str, list[float]] = {m: [] for m in modes}
    totals: dict[str, list[float]] = {m: [] for m in modes}
    epoch = 100
    try:
        async with delayed_ministack(work, PREFIX, latency_ms) as stores:
            limit = await plant(stores.direct, count, rows)
            snapshot = await full_ledger(stores.direct)
            for round_no in range(rounds):
                for mode, (wait_s, readers) in modes.items():
                    coverage_module.ENTRY_READERS = readers
                    epoch += 1
                    first, answers, total = await after_quiet_spell(
                        stores, snapshot, limit, epoch, entries, wait_s
                    )
                    firsts[mode].append(first)
                    totals[mode].append(total)
                    print(
                        f"round {round_no + 1}: {mode}: first answer {first:.3f} s, "
                        f"{answers} answer(s), complete again after {total:.2f} s"
                    )
    finally:
        coverage_module.ENTRY_READERS = product_readers
    base, ours = (statistics.median(firsts[m]) for m in modes)
    base_total, ours_total = (statistics.median(totals[m]) for m in modes)
    print(
        f"median first answer after {entries} new entries: baseline {base:.3f} s, ours "
        f"{ours:.3f} s ({base / ours:.1f}x sooner); complete again after {base_total:.2f} s "
        f"against {ours_total:.2f} s ({latency_ms:g} ms a request)"
    )


async def run(count: int, rows: int, latency_ms: float, rounds: int, work: Path) -> None:
    product = QuerySettings().history_wait_s
    modes = {"waits for history (baseline)": 1e9, f"waits <= {product:g} s": product}
    firsts: dict[str, list[float]] = {m: [] for m in modes}
    totals: dict[str, list[float]] = {m: [] for m in modes}
    async with delayed_ministack(work, PREFIX, latency_ms) as stores:
        limit = await plant(stores.direct, count, rows)
        snapshot = await full_ledger(stores.direct)
        for round_no in range(rounds):
            for mode, wait_s in modes.items():
                first, answers, total = await answers_until_read(
                    stores.delayed, snapshot, limit, wait_s
                )
                firsts[mode].append(first)
                totals[mode].append(total)
                print(
                    f"round {round_no + 1}: {mode}: first answer {first:.3f} s, "
                    f"{answers} answer(s), history read in {total:.1f} s"
                )
    base, ours = (statistics.median(firsts[m]) for m in modes)
    base_total, ours_total = (statistics.median(totals[m]) for m in modes)
    print(
        f"median first answer: baseline {base:.3f} s, ours {ours:.3f} s "
        f"({base / ours:.1f}x sooner); history read in {base_total:.1f} s against "
        f"{ours_total:.1f} s ({count} hours of {rows} batches, {latency_ms:g} ms a request)"
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
        if args.entries:
            asyncio.run(
                run_entries(
                    args.hours, args.rows, args.entries, args.latency_ms, args.rounds, Path(work)
                )
            )
        else:
            asyncio.run(run(args.hours, args.rows, args.latency_ms, args.rounds, Path(work)))


if __name__ == "__main__":
    main()
