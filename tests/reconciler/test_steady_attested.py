"""The steady pass on store-attested rows (PROTOCOL §3.7): no request per own-create row,
a sampled read-back that supersedes a wrong claim, malformed rows as problems, and a
store whose ETags cannot attest read back in full."""

from __future__ import annotations

import dataclasses

from index.rows import IndexRow, accepted_row, blob_row
from protocol import keys
from protocol.clock import ManualClock
from protocol.records import ProblemRecord
from reconciler.steady import SteadyScanner
from store.counting import CountingStore
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    Batch,
    catalog_rows,
    context,
    keys_under,
    log_rows,
    make_settings,
    write_batches,
)


async def attested_rows(store: MemoryStore, batches: list[Batch]) -> list[IndexRow]:
    """What a collector logs for its own 200 creates: the stored body, its ETag, times."""
    rows: list[IndexRow] = []
    for i, batch in enumerate(batches):
        _body, etag = await store.get(batch.key)
        rows.append(blob_row(batch.sha, batch.manifest.accepted_at_unix_ns))
        rows.append(accepted_row(batch.manifest, etag=etag, own_create=True, ts_range=(i, i + 5)))
    return rows


async def test_own_create_rows_are_cataloged_without_a_request(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=3, per_agent=40)
    rows = await attested_rows(memory_store, batches)
    segments = await log_rows(memory_store, clock, rows=rows, writer_id="c1")
    store = CountingStore(memory_store)
    ctx = await context(store, clock, settings=make_settings(verify_sample_rate=0.0))
    store.clear()

    result = await SteadyScanner(ctx).run_pass()

    assert result.complete and result.rows_attested == len(batches)
    assert result.records_read == 0
    assert store.keys_of("get", keys.ACCEPTED_PREFIX) == []  # not one record read
    assert sorted(store.keys_of("get", keys.INDEX_LOG_PREFIX)) == sorted(segments)
    cataloged = await catalog_rows(memory_store)
    for i, batch in enumerate(batches):
        row = cataloged[batch.key]
        _body, etag = await memory_store.get(batch.key)
        assert row.etag == etag and (row.min_ts_ns, row.max_ts_ns) == (i, i + 5)
        assert row.source in segments  # the segment that named it


async def test_a_sampled_claim_that_differs_is_superseded_by_the_store(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=4)
    rows = await attested_rows(memory_store, batches)
    lying = dataclasses.replace(rows[3], record_count=999)  # a collector bug
    rows[3] = lying
    await log_rows(memory_store, clock, rows=rows, writer_id="c1")
    ctx = await context(memory_store, clock, settings=make_settings(verify_sample_rate=1.0))

    result = await SteadyScanner(ctx).run_pass()

    assert result.complete and result.mismatches == 1 and result.records_read == 4
    row = (await catalog_rows(memory_store))[lying.key]
    assert row.record_count == batches[1].manifest.record_count and row.source == "read-back"
    assert (row.min_ts_ns, row.max_ts_ns) == (1, 6)  # the log row's times, same frame


async def test_a_wrong_claim_outside_the_sample_waits_for_the_audit_but_no_row_is_malformed(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    """Malformed rows (identity not the key, blob key not the hash's) are never cataloged:
    a problem names their segment; the well-formed rows beside them are cataloged."""
    batches = await write_batches(memory_store, agents=1, per_agent=3)
    rows = await attested_rows(memory_store, batches)
    wrong_identity = dataclasses.replace(rows[1], key=batches[2].key)
    wrong_blob = dataclasses.replace(rows[3], raw_blob_key=keys.raw_blob_key("ab" * 32))
    good = rows[5]
    segments = await log_rows(
        memory_store, clock, rows=[wrong_identity, wrong_blob, good], writer_id="c1"
    )
    ctx = await context(memory_store, clock, settings=make_settings(verify_sample_rate=0.0))

    result = await SteadyScanner(ctx).run_pass()

    assert result.malformed == 2 and result.rows_cataloged == 1
    assert set(await catalog_rows(memory_store)) == {good.key}
    body, _ = await memory_store.get(keys.problem_key("malformed-log-row", segments[0]))
    assert "2 malformed row(s)" in ProblemRecord.from_json(body).detail


async def test_a_store_whose_etags_cannot_attest_reads_back_every_record(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=5)
    await log_rows(memory_store, clock, rows=await attested_rows(memory_store, batches))
    store = CountingStore(memory_store)
    ctx = await context(store, clock, settings=make_settings(verify_sample_rate=0.0))
    ctx = dataclasses.replace(ctx, etags_attest=False)

    result = await SteadyScanner(ctx).run_pass()

    assert result.rows_attested == 0 and result.records_read == 5
    assert sorted(store.keys_of("get", keys.ACCEPTED_PREFIX)) == sorted(b.key for b in batches)


async def test_read_derived_rows_are_read_once_and_not_when_attested_in_the_same_chunk(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=4)
    rows = await attested_rows(memory_store, batches[:2])
    # A duplicate answered by another collector: a read, own_create false, same key twice.
    read = [accepted_row(b.manifest, etag="x", own_create=False, ts_range=(0, 1)) for b in batches]
    await log_rows(memory_store, clock, rows=[*rows, *read, *read], writer_id="c2")
    store = CountingStore(memory_store)
    ctx = await context(store, clock, settings=make_settings(verify_sample_rate=0.0))
    store.clear()

    result = await SteadyScanner(ctx).run_pass()

    assert sorted(store.keys_of("get", keys.ACCEPTED_PREFIX)) == sorted(b.key for b in batches[2:])
    assert set(await catalog_rows(memory_store)) == {b.key for b in batches}
    assert result.rows_attested == 2 and result.records_read == 2
    assert await keys_under(memory_store, keys.INDEX_CATALOG_PREFIX)
