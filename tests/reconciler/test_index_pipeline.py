"""The reconciler on the index (PROTOCOL §3.7): steady pass from the log, audit by anti-join,
orphans from the blob join, compaction, planning from work markers (memory store)."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from index import catalog
from index.log_writer import IndexLogWriter
from index.rows import accepted_row, blob_row, quarantine_row
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit import run_full_audit
from reconciler.compaction import CatalogCompactor
from reconciler.orphans import decode_orphans
from reconciler.steady import SteadyScanner, read_checkpoint
from rollup.plan import make_plan
from store.base import ObjectInfo
from store.memory import MemoryStore

from .conftest import T0_NS, context, make_settings, write_batches, write_conflict


class CountingStore(MemoryStore):
    """A memory store that counts requests by operation and key prefix."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.calls: Counter[str] = Counter()

    def count(self, op: str, key: str) -> None:
        self.calls[f"{op} {key.split('/', 1)[0]}"] += 1

    async def get(self, key: str) -> tuple[bytes, str]:
        self.count("get", key)
        return await super().get(key)

    async def put(self, key: str, body: bytes, **kwargs: Any) -> str:
        self.count("put", key)
        return await super().put(key, body, **kwargs)

    async def head(self, key: str) -> ObjectInfo:
        self.count("head", key)
        return await super().head(key)

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:  # type: ignore[override]
        self.count("list", prefix)
        async for info in super().list(prefix, start_after):
            yield info


async def log_batches(store: MemoryStore, clock: ManualClock, batches: list[Any]) -> None:
    writer = IndexLogWriter(store=store, clock=clock, rng=random.Random(3), writer_id="c1")
    for batch in batches:
        writer.append(blob_row(batch.sha, batch.manifest.accepted_at_unix_ns))
        writer.append(accepted_row(batch.manifest))
    await writer.flush()


async def catalog_keys(store: MemoryStore) -> set[str]:
    found: set[str] = set()
    async for info in catalog.list_all_files(store):
        found.update(row.key for row in await catalog.read_file(store, info.key))
    return found


async def test_the_steady_pass_catalogs_what_the_log_names_reading_each_record_once(
    clock: ManualClock,
) -> None:
    store = CountingStore(clock)
    batches = await write_batches(store, agents=2, per_agent=5, derived_entries=False)
    await log_batches(store, clock, batches)
    await log_batches(store, clock, batches[:3])  # re-sent duplicates log their rows again
    ctx = await context(store, clock)
    scanner = SteadyScanner(ctx)
    store.calls.clear()

    result = await scanner.run_pass()

    assert result.complete and result.rows_cataloged == 10 and result.segments_read == 2
    assert await catalog_keys(store) == {b.key for b in batches}
    assert store.calls["get accepted"] == 10  # each manifest once, duplicates included
    assert len([k async for k in store.list(keys.ROLLUP_WORK_PREFIX)]) == result.catalog_files
    checkpoint = await read_checkpoint(store)
    assert checkpoint is not None and checkpoint.totals["accepted_rows"] == 13

    store.calls.clear()
    again = await scanner.run_pass()
    assert again.segments_read == 0 and again.records_read == 0
    assert store.calls["get accepted"] == 0 and store.calls["put index"] == 0


async def test_an_audit_catalogs_only_what_the_log_lost_and_lists_orphans(
    clock: ManualClock,
) -> None:
    store = CountingStore(clock)
    batches = await write_batches(store, agents=2, per_agent=5, derived_entries=False)
    conflict = await write_conflict(store, batches[0], T0_NS + 5)
    await log_batches(store, clock, batches[:6])  # the log lost the last four rows
    orphan = b"an orphan frame nobody references"
    orphan_sha = hashlib.sha256(orphan).hexdigest()
    await store.put(keys.raw_blob_key(orphan_sha), orphan)
    base = make_settings()
    settings = base.model_copy(
        update={"gc": base.gc.model_copy(update={"retry_horizon_s": 3600.0})}
    )
    ctx = await context(store, clock, settings=settings)
    await SteadyScanner(ctx).run_pass()
    clock.advance(2 * 3600)
    store.calls.clear()

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.catalog
    assert record.cataloged == 5  # four manifests and the quarantine record
    assert store.calls["get accepted"] == 4 and store.calls["get quarantine"] == 1
    assert await catalog_keys(store) == {b.key for b in batches} | {conflict.quarantine_key}
    body, _ = await store.get(keys.audit_orphans_key(record.started_at_unix_ns, record.audit_id))
    assert set(decode_orphans(body)) == {orphan_sha}
    assert record.orphans == 1 and record.blobs_listed == 12


async def test_a_referenced_blob_that_is_gone_is_a_problem_until_it_is_back(
    clock: ManualClock,
) -> None:
    store = MemoryStore(clock=clock)
    batches = await write_batches(store, agents=1, per_agent=2, derived_entries=False)
    frame = batches[0].frame
    await store.delete(keys.raw_blob_key(batches[0].sha))
    ctx = await context(store, clock)
    record = await run_full_audit(ctx)
    assert record.status == "completed" and record.problems == 1
    assert [k async for k in store.list(keys.RECONCILER_PROBLEMS_PREFIX + "missing-blob/")]
    await store.put(keys.raw_blob_key(batches[0].sha), frame)
    clock.advance(60)
    await run_full_audit(ctx)
    assert not [k async for k in store.list(keys.RECONCILER_PROBLEMS_PREFIX + "missing-blob/")]


async def test_compaction_merges_a_settled_hour_and_planning_reads_only_marked_hours(
    clock: ManualClock,
) -> None:
    store = CountingStore(clock)
    batches = await write_batches(store, agents=3, per_agent=4, derived_entries=False)
    compactor = CatalogCompactor()
    ctx = await context(store, clock)
    ctx = dataclasses.replace(ctx, on_catalog_written=compactor.touched)
    scanner = SteadyScanner(ctx)
    for part in (batches[:4], batches[4:8], batches[8:]):
        await log_batches(store, clock, part)
        await scanner.run_pass()
    hour = keys.UtcHour.from_unix_ns(T0_NS)
    assert len(await catalog.list_hour_files(store, hour)) == 3

    clock.advance(3 * 3600)  # the hour is settled (its end is older than the lookback)
    result = await compactor.run(ctx)
    assert result.hours_compacted == 1 and result.files_merged == 3
    clock.advance(ctx.settings.reconciler.catalog_grace_s + 1)
    assert (await compactor.run(ctx)).inputs_deleted == 3
    assert len(await catalog.list_hour_files(store, hour)) == 1
    assert await catalog_keys(store) == {b.key for b in batches}

    plan = await make_plan(store, None)
    assert sorted(item.manifest_id for item in plan.items) == sorted(
        b.manifest.identity.manifest_id for b in batches
    )
    assert plan.hours_checked == (hour.iso,)


async def test_quarantine_rows_reference_both_blobs(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    batches = await write_batches(store, agents=1, per_agent=1, derived_entries=False)
    conflict = await write_conflict(store, batches[0], T0_NS + 5)
    row = quarantine_row(conflict)
    assert set(row.referenced_shas) == {batches[0].sha, conflict.submitted_frame_sha256}
