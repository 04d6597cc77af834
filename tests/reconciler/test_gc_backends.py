"""GC through the real reconciler context, the real steady pass and the real full audit, on
the fs store and MiniStack. The GC's proof is the latest completed catalog audit's orphan
file (`reconciler.gc`); on MiniStack every age is judged in MiniStack's time (store time,
PROTOCOL §3.8)."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from config import GcSettings, ReconcilerSettings, Settings
from protocol import keys, records
from protocol.clock import ManualClock
from reconciler.audit.run import run_full_audit
from reconciler.context import ReconcilerContext, open_context
from reconciler.gc.run import run_gc
from reconciler.metrics import ReconcilerMetrics
from reconciler.steady import SteadyScanner
from store.base import ObjectStore
from store.errors import NotFound
from store.fs import FileSystemStore
from store.s3 import S3Store
from tests.reconciler.conftest import catalog_keys, log_rows, make_batch, write_batch
from tests.s3_servers import RunningServer, fresh_bucket

HORIZON_S, GRACE_S = 2 * 3600.0, 600.0


@pytest.fixture
def clock() -> ManualClock:
    # S3 servers stamp LastModified with the real time, so the manual clock starts there.
    return ManualClock(time.time_ns())


@pytest.fixture(params=[pytest.param("fs"), pytest.param("ministack", marks=pytest.mark.s3)])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[ObjectStore]:
    opened: ObjectStore
    if request.param == "fs":
        opened = FileSystemStore(tmp_path / "store", clock=clock)
    else:
        server: RunningServer = request.getfixturevalue("ministack_server")
        opened = S3Store(bucket=fresh_bucket(server), prefix="gc", endpoint_url=server.endpoint_url)
    try:
        yield opened
    finally:
        await opened.close()


def settings() -> Settings:
    return Settings(
        reconciler=ReconcilerSettings(lease_ttl_s=30.0, concurrency=4, verify_rate_per_s=1000.0),
        gc=GcSettings(
            enabled=True, retry_horizon_s=HORIZON_S, mark_grace_s=GRACE_S, max_delete_fraction=0.5
        ),
    )


async def exists(store: ObjectStore, key: str) -> bool:
    try:
        await store.head(key)
    except NotFound:
        return False
    return True


async def test_only_the_orphan_is_deleted_after_the_whole_proof(
    store: ObjectStore, clock: ManualClock
) -> None:
    now = clock.now_ns()
    kept = make_batch(agent=1, seq=1, accepted_at_ns=now)
    lost_log = make_batch(agent=1, seq=2, accepted_at_ns=now)
    orphan = make_batch(agent=2, seq=1, accepted_at_ns=now)
    for batch in (kept, lost_log):
        await write_batch(store, batch)
    await log_rows(store, clock, [kept])  # lost_log's collector died before its flush
    await store.put(keys.raw_blob_key(orphan.sha), orphan.frame)  # blob written, manifest never
    ctx = await open_context(
        store,
        settings=settings(),
        clock=clock,
        rng=random.Random(1),
        metrics=ReconcilerMetrics(clock=clock),
    )
    await SteadyScanner(ctx).run_pass()
    assert await catalog_keys(store) == {kept.key}

    clock.advance(HORIZON_S + 3600)
    audit = await completed_audit(ctx)
    assert audit.orphans == 1  # the audit cataloged lost_log: only the orphan is unreferenced
    assert await catalog_keys(store) == {kept.key, lost_log.key}
    first = await run_gc(ctx, dry_run=False)
    assert first.deleted == [] and first.record.marked == 1
    [mark] = [info.key async for info in store.list(keys.GC_MARKS_PREFIX)]
    assert orphan.sha in mark

    clock.advance(GRACE_S + 1)
    audits = [info.key async for info in store.list(keys.RECONCILER_AUDITS_PREFIX)]
    second = await run_gc(ctx, dry_run=False)  # the audit before the mark: rule 1's HEAD
    assert second.deleted == [orphan.sha]
    assert [info.key async for info in store.list(keys.RECONCILER_AUDITS_PREFIX)] == audits
    assert not await exists(store, keys.raw_blob_key(orphan.sha))
    for batch in (kept, lost_log):
        assert (await store.get(keys.raw_blob_key(batch.sha)))[0] == batch.frame
    assert [info.key async for info in store.list(keys.GC_MARKS_PREFIX)] == []
    assert len([info.key async for info in store.list(keys.GC_LOG_PREFIX)]) == 1  # one per run


async def completed_audit(ctx: ReconcilerContext) -> records.AuditRecord:
    record = await run_full_audit(ctx)
    assert record.status == "completed"
    return record


@pytest.mark.s3
async def test_a_host_whose_clock_runs_ahead_does_not_mark_a_young_orphan(
    ministack_server: RunningServer,
) -> None:
    # The retry horizon is judged in MiniStack's time (PROTOCOL §3.8): a blob written a
    # moment ago is not past a one-hour horizon on a host whose clock runs two hours ahead.
    ahead = ManualClock(time.time_ns() + 2 * 3600 * 10**9)
    async with S3Store(
        bucket=fresh_bucket(ministack_server),
        prefix="gc",
        endpoint_url=ministack_server.endpoint_url,
        clock=ahead,
    ) as store:
        orphan = make_batch(agent=2, seq=1, accepted_at_ns=ahead.now_ns())
        await store.put(keys.raw_blob_key(orphan.sha), orphan.frame)  # manifest never came
        short = Settings(
            reconciler=ReconcilerSettings(lease_ttl_s=30.0),
            gc=GcSettings(enabled=True, retry_horizon_s=3600.0, mark_grace_s=GRACE_S),
        )
        ctx = await open_context(store, settings=short, clock=ahead, rng=random.Random(1))
        audit = await completed_audit(ctx)  # the GC's candidates: this audit's orphan file
        assert (audit.blobs_listed, audit.orphans) == (1, 0)

        outcome = await run_gc(ctx, dry_run=False)

        assert (outcome.record.candidates, outcome.record.marked) == (0, 0)
        assert [info.key async for info in store.list(keys.GC_MARKS_PREFIX)] == []


async def test_raw_retention_deletes_rolled_up_blobs_and_the_audit_finds_nothing_missing(
    store: ObjectStore, clock: ManualClock
) -> None:
    from config import RetentionSettings
    from reconciler.gc.raw_retention import read_state
    from rollup.table.ledger import LedgerRow
    from rollup.table.owner import OwnerLease
    from tests.reconciler.conftest import write_conflict
    from tests.rollup.dataset_builder import commit_rows

    # Batches accepted four hours ago (their hour ended more than raw_days = 2.4 h ago),
    # whose blobs are written now: no clock has to jump hours (MiniStack's cannot).
    now = clock.now_ns()
    accepted_at = keys.UtcHour.from_unix_ns(now).shifted(-4).start_ns + 10 * 10**9
    rolled = [make_batch(agent=1, seq=seq, accepted_at_ns=accepted_at) for seq in (1, 2, 3)]
    for batch in rolled:
        await write_batch(store, batch)
    conflict = await write_conflict(store, rolled[2], now)  # keeps rolled[2]'s blob
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    await commit_rows(
        store, owner, clock, ledger=[LedgerRow.of_manifest(b.manifest) for b in rolled]
    )
    await owner.release()
    retention = settings().model_copy(
        update={
            "retention": RetentionSettings(raw_days=0.1),
            "gc": settings().gc.model_copy(update={"retry_horizon_s": 1.0}),
        }
    )
    clock.advance(5)  # the blobs are past the 1 s retry horizon
    ctx = await open_context(
        store,
        settings=retention,
        clock=clock,
        rng=random.Random(1),
        metrics=ReconcilerMetrics(clock=clock),
    )
    young = make_batch(agent=2, seq=1, accepted_at_ns=clock.now_ns())  # not rolled up, young
    await write_batch(store, young)
    await completed_audit(ctx)  # seals the first hour
    await run_gc(ctx, dry_run=False)  # retires it
    state, _etag = await read_state(store)
    assert state is not None and state.retired_batches == 3
    clock.advance(1)
    audit = await completed_audit(ctx)
    assert audit.orphans == 2  # rolled[0] and rolled[1]: flagged raw_retention
    assert (await run_gc(ctx, dry_run=False)).record.marked == 2
    clock.advance(GRACE_S + 1)
    await completed_audit(ctx)  # started after the marks plus the grace
    deleting = await run_gc(ctx, dry_run=False)  # 2 of 5 blobs: past max_delete_fraction
    assert sorted(deleting.deleted) == sorted(b.sha for b in rolled[:2])
    assert deleting.record.deleted_raw_retention == 2
    for batch in rolled[:2]:
        assert not await exists(store, keys.raw_blob_key(batch.sha))
    for key in [*(b.key for b in rolled), young.key, conflict.submitted_raw_blob_key]:
        assert await exists(store, key)
    for batch in (rolled[2], young):
        assert await exists(store, keys.raw_blob_key(batch.sha))
    clock.advance(1)
    await completed_audit(ctx)
    problems = [info.key async for info in store.list(keys.RECONCILER_PROBLEMS_PREFIX)]
    assert problems == []
    from reconciler.status import gather_status

    shown = (await gather_status(store, clock, lookback_s=60.0)).render()
    assert "2 deleted (2 by raw retention)" in shown
    assert (
        f"raw retention   accepted hours before {state.retired_before} retired (3 batches" in shown
    )
