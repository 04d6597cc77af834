"""The index pipeline on every store: memory, the filesystem store and MiniStack S3 — a
steady pass over the log, an audit that catalogs what the log lost, lists the orphan and
finds the missing and the corrupt blob, compaction, status; and the lease."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.orphans import decode_orphans
from reconciler.audit.run import run_full_audit
from reconciler.compaction import CatalogCompactor
from reconciler.problems import count_problems
from reconciler.status import gather_status
from reconciler.steady import SteadyScanner
from store.base import ObjectStore
from store.fs import FileSystemStore
from store.lease import LeaseHeld, LeaseLost
from store.memory import MemoryStore
from store.s3 import S3Store
from tests.reconciler.conftest import (
    audits_until_a_verification_round_ends,
    catalog_keys,
    context,
    log_rows,
    make_settings,
    with_retry_horizon,
    write_batches,
    write_conflict,
)
from tests.s3_servers import RunningServer, fresh_bucket

HORIZON_S = 3600.0


@pytest.fixture(
    params=["memory", "fs", pytest.param("ministack", marks=pytest.mark.s3)],
)
async def store_and_clock(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[ObjectStore, ManualClock]]:
    """The store, and a manual clock in its time: the memory and fs stores stamp objects
    from that clock; an S3 server stamps them itself, so the clock starts at the time it
    stamped a probe object (store time, PROTOCOL §3.8: no local clock involved)."""
    clock = ManualClock()
    opened: ObjectStore
    if request.param == "memory":
        opened = MemoryStore(clock=clock)
    elif request.param == "fs":
        opened = FileSystemStore(tmp_path / "store", clock=clock)
    else:
        server: RunningServer = request.getfixturevalue("ministack_server")
        opened = S3Store(bucket=fresh_bucket(server), prefix="lm", endpoint_url=server.endpoint_url)
        await opened.put("probe/v1/store-time.json", b"{}")
        clock = ManualClock((await opened.head("probe/v1/store-time.json")).last_modified_ns)
    try:
        yield opened, clock
    finally:
        await opened.close()


async def test_steady_pass_audit_compaction_and_status(
    store_and_clock: tuple[ObjectStore, ManualClock],
) -> None:
    store, clock = store_and_clock
    now = clock.now_ns()
    batches = await write_batches(store, agents=3, per_agent=4, start_ns=now - 600 * keys.NS_PER_S)
    conflict = await write_conflict(store, batches[2], now - 300 * keys.NS_PER_S)
    await log_rows(store, clock, batches[:8], [conflict])  # the last four rows were lost
    orphan = b"a collector died after writing this"
    orphan_sha = hashlib.sha256(orphan).hexdigest()
    await store.put(keys.raw_blob_key(orphan_sha), orphan)
    missing, corrupt = batches[1], batches[4]
    await store.delete(missing.manifest.raw_blob_key)
    await store.put(corrupt.manifest.raw_blob_key, bytes(reversed(corrupt.frame)))
    settings = with_retry_horizon(make_settings(concurrency=8), HORIZON_S)
    compactor = CatalogCompactor()
    ctx = await context(store, clock, settings=settings)
    ctx = dataclasses.replace(ctx, on_catalog_written=compactor.touched)

    steady = await SteadyScanner(ctx).run_pass()
    assert steady.complete and steady.rows_cataloged == 9
    clock.advance(2 * HORIZON_S)
    audit = await run_full_audit(ctx)

    assert audit.status == "completed" and audit.cataloged == 4
    assert (audit.manifests_seen, audit.quarantines_seen) == (12, 1)
    assert await catalog_keys(store) == {b.key for b in batches} | {conflict.quarantine_key}
    body, _ = await store.get(keys.audit_orphans_key(audit.started_at_unix_ns, audit.audit_id))
    assert set(decode_orphans(body)) == {orphan_sha}
    assert (await count_problems(store))["missing-blob"] == 1
    await audits_until_a_verification_round_ends(ctx, clock)  # hashes checked within a round
    assert await count_problems(store) == {"missing-blob": 1, "corrupt-blob": 1}

    merged = await compactor.run(ctx, force=True)
    assert merged.hours_compacted >= 1 and merged.failed == 0
    assert (await compactor.run(ctx, force=True)).inputs_deleted == merged.files_merged

    status = await gather_status(store, clock, lookback_s=settings.reconciler.lookback_s)
    assert status.catalog_files == status.catalog_hours >= 1
    assert status.segments_behind == 0 and status.work_markers >= status.catalog_files
    assert status.last_completed_audit is not None and status.last_completed_audit.catalog
    assert dict(status.problems) == {"missing-blob": 1, "corrupt-blob": 1}
    assert not status.healthy
    assert await catalog_keys(store) == {b.key for b in batches} | {conflict.quarantine_key}


async def test_one_active_reconciler_and_takeover_after_expiry(
    store_and_clock: tuple[ObjectStore, ManualClock],
) -> None:
    store, clock = store_and_clock
    leader = await context(store, clock, owner="reconciler-a")
    with pytest.raises(LeaseHeld):
        await context(store, clock, owner="reconciler-b")
    clock.advance(31)
    successor = await context(store, clock, owner="reconciler-b")
    assert successor.epoch == leader.epoch + 1
    with pytest.raises(LeaseLost):
        await leader.check_fence()
