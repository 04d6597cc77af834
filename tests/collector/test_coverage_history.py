"""`collector.query.coverage`: answers never wait on the history's catalog reads.

A query collector that starts on a long history reads every sealed catalog hour's
totals once, which for a busy hour takes about a minute. These worlds make that read
slow (an hour's read waits for a gate the test opens) or fail, and check that an answer
comes back within ``history_wait_s`` with a conservative ``sealed_through_ns``, that
nothing is read twice, that a failure reaches an answer and the reading resumes, and
that an hour whose new catalog file is being read is not trusted meanwhile.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import pytest

import collector.query.coverage as coverage_module
from collector.query.coverage import Coverage
from index.catalog import CatalogWriter
from index.rows import accepted_row
from protocol import keys
from protocol.clock import ManualClock
from protocol.records import AcceptedManifest
from rollup.table.ledger import LedgerRow
from rollup.table.manifest import LedgerHour, Snapshot
from rollup.table.owner import OwnerLease
from store.base import ObjectStore
from store.errors import Unavailable
from store.fs import FileSystemStore
from tests.collector.test_live_query import completed_audit
from tests.rollup.dataset_builder import catalog_manifests, commit_rows

NS = 1_000_000_000
H0 = keys.UtcHour(date(2026, 11, 21), 10)
HOURS = [H0, H0.next(), H0.next().next()]
END = HOURS[-1].next()  # the audit seals the three hours
MARGIN_S = 5
WAIT_S = 0.05  # short: every answer that cannot wait for a gated read returns after it
ENOUGH = 600  # x WAIT_S: how long a test waits for reads the gate let through


def manifest(hour: keys.UtcHour, seq: int) -> AcceptedManifest:
    body_sha = f"{hour.start_ns + seq:064x}"[-64:]
    return AcceptedManifest(
        agent_id="agent-a",
        boot_id=str(uuid.UUID(int=7)),
        seq_start=seq,
        seq_end=seq,
        record_count=1,
        frame_sha256=body_sha,
        frame_bytes=100,
        raw_blob_key=keys.raw_blob_key(body_sha),
        accepted_at_unix_ns=hour.start_ns + 60 * NS + seq,
        collector_id="c1",
    )


@dataclass
class HourReads:
    """`read_catalog_totals` as the coverage sees it: each hour's read waits for
    ``gate`` (when set) and fails while ``failures`` lasts; ``reads`` counts them."""

    real: Callable[..., Awaitable[LedgerHour]]
    gate: asyncio.Event | None = None
    failures: int = 0
    reads: Counter[str] = field(default_factory=Counter)

    async def __call__(self, store: object, hour: keys.UtcHour) -> LedgerHour:
        self.reads[hour.iso] += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise Unavailable(
                "get", keys.index_catalog_hour_prefix(hour), "the store did not answer"
            )
        return await self.real(store, hour)


@dataclass
class History:
    store: FileSystemStore
    clock: ManualClock
    snapshot: Snapshot
    reads: HourReads
    coverage: Coverage


@pytest.fixture
async def history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> History:
    clock = ManualClock(END.start_ns + 600 * NS)
    store = FileSystemStore(tmp_path / "store", clock=clock)
    manifests = [manifest(hour, seq) for seq, hour in enumerate(HOURS)]
    await catalog_manifests(store, manifests, clock=clock)
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    loaded = await commit_rows(
        store, owner, clock, ledger=[LedgerRow.of_manifest(m) for m in manifests]
    )
    await owner.release()
    await completed_audit(store, END.start_ns + (MARGIN_S + 60) * NS)
    reads = HourReads(coverage_module.read_catalog_totals)
    monkeypatch.setattr(coverage_module, "read_catalog_totals", reads)
    coverage = Coverage(
        store,
        settle_margin_s=MARGIN_S,
        refresh_interval_s=0.0,
        monotonic=clock.monotonic,
        history_wait_s=WAIT_S,
    )
    return History(store, clock, loaded.snapshot, reads, coverage)


async def sealed(history: History) -> int:
    # Bounded: an answer that waited longer than its history_wait_s would fail here.
    return await asyncio.wait_for(history.coverage.sealed_through_ns(history.snapshot), 30)


async def sealed_once_read(history: History, expected: int) -> int:
    """Answers until one reaches ``expected`` (the reads the gate let through finish),
    at most `ENOUGH` of them."""
    for _ in range(ENOUGH):
        got = await sealed(history)
        if got == expected:
            return got
    return got


async def write_again(history: History, hour: keys.UtcHour) -> None:
    """A new catalog file in ``hour`` (an audit's superseding row: the same record again),
    with its ``catalog-created`` entry."""
    again = accepted_row(manifest(hour, HOURS.index(hour)))
    epoch = 9 + HOURS.index(hour)  # a writer's names are unique within its epoch
    writer = CatalogWriter(
        store=history.store, clock=history.clock, rng=random.Random(epoch), epoch=epoch
    )
    await writer.write(again.hour, [again], writer="audit-00000000000000a2")


async def test_an_answer_does_not_wait_for_history_it_has_not_read(history: History) -> None:
    history.reads.gate = asyncio.Event()
    assert await sealed(history) == 0  # nothing read yet: nothing promised
    assert await sealed(history) == 0
    assert history.coverage.read_through_ns == 0  # the gauge's value
    assert sum(history.reads.reads.values()) == 1  # one reader, waiting on the first hour
    history.reads.gate.set()
    assert await sealed_once_read(history, END.start_ns) == END.start_ns
    assert history.coverage.read_through_ns == END.start_ns
    assert history.reads.reads == {hour.iso: 1 for hour in HOURS}  # each hour read once
    await sealed(history)
    assert sum(history.reads.reads.values()) == len(HOURS)  # and never again


async def test_a_failed_read_reaches_an_answer_and_reading_resumes(history: History) -> None:
    history.coverage = Coverage(
        history.store,
        settle_margin_s=MARGIN_S,
        refresh_interval_s=0.0,
        monotonic=history.clock.monotonic,
        history_wait_s=30,
    )
    history.reads.failures = 1
    with pytest.raises(Unavailable, match="did not answer"):
        await sealed(history)
    assert await sealed(history) == END.start_ns
    assert history.reads.reads == {HOURS[0].iso: 2, HOURS[1].iso: 1, HOURS[2].iso: 1}


async def test_an_hour_whose_new_file_is_being_read_is_not_trusted(history: History) -> None:
    assert await sealed_once_read(history, END.start_ns) == END.start_ns
    # A new catalog file lands in the middle hour (an audit's superseding row: the same
    # record again); the next answer notices it and the hour is read again, slowly.
    await write_again(history, HOURS[1])
    history.reads.gate = asyncio.Event()
    assert await sealed(history) == HOURS[1].start_ns  # its cached totals are not trusted
    assert history.coverage.read_through_ns == HOURS[1].start_ns
    assert history.reads.reads[HOURS[1].iso] == 2
    history.reads.gate.set()
    assert await sealed_once_read(history, END.start_ns) == END.start_ns
    assert history.reads.reads == {HOURS[0].iso: 1, HOURS[1].iso: 2, HOURS[2].iso: 1}


async def test_close_stops_a_reader_in_progress(history: History) -> None:
    history.reads.gate = asyncio.Event()
    assert await sealed(history) == 0
    await asyncio.wait_for(history.coverage.close(), 5)  # not waiting for the gate
    history.reads.gate.set()
    assert await sealed_once_read(history, END.start_ns) == END.start_ns
    assert history.reads.reads[HOURS[0].iso] == 2  # the cancelled read, then a new one


async def test_entries_not_read_yet_leave_no_cached_hour_trusted(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a long quiet spell the new ``catalog-created`` entries can be many: they are
    read by the reader too, and until they are, any cached hour may be one they name."""
    assert await sealed_once_read(history, END.start_ns) == END.start_ns
    gate = asyncio.Event()
    real = coverage_module.catalog_hour_of_entry

    async def gated(store: ObjectStore, entry_key: str) -> keys.UtcHour | None:
        await gate.wait()
        return await real(store, entry_key)

    monkeypatch.setattr(coverage_module, "catalog_hour_of_entry", gated)
    await write_again(history, HOURS[2])
    assert await sealed(history) == HOURS[0].start_ns  # the first cached hour
    assert history.coverage.read_through_ns == HOURS[0].start_ns
    gate.set()
    assert await sealed_once_read(history, END.start_ns) == END.start_ns
    assert history.reads.reads == {HOURS[0].iso: 1, HOURS[1].iso: 1, HOURS[2].iso: 2}


async def test_entries_are_listed_a_bounded_number_at_a_time(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert await sealed_once_read(history, END.start_ns) == END.start_ns
    monkeypatch.setattr(coverage_module, "MAX_PENDING_ENTRIES", 1)
    for hour in HOURS:
        await write_again(history, hour)
    assert await sealed(history) == HOURS[0].start_ns  # one entry read, two not listed
    assert await sealed_once_read(history, END.start_ns) == END.start_ns
    assert history.reads.reads == {hour.iso: 2 for hour in HOURS}  # each read again once
