"""The issue's repair cases on the real stores: the filesystem store and MiniStack S3."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit import run_full_audit
from reconciler.problems import count_problems
from reconciler.steady import SteadyScanner
from store.base import ObjectStore
from store.fs import FileSystemStore
from store.lease import LeaseHeld, LeaseLost
from store.s3 import S3Store
from tests.reconciler.conftest import (
    audits_until_a_verification_round_ends,
    context,
    derived_keys_in,
    make_batch,
    make_settings,
    write_batch,
    write_batches,
    write_conflict,
)
from tests.s3_servers import RunningServer, fresh_bucket


@pytest.fixture(
    params=[pytest.param("fs"), pytest.param("ministack", marks=pytest.mark.s3)],
)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[ObjectStore]:
    opened: ObjectStore
    if request.param == "fs":
        opened = FileSystemStore(tmp_path / "store", clock=clock)
    else:
        server: RunningServer = request.getfixturevalue("ministack_server")
        opened = S3Store(bucket=fresh_bucket(server), prefix="lm", endpoint_url=server.endpoint_url)
    try:
        yield opened
    finally:
        await opened.close()


async def test_deleted_entries_are_restored_by_steady_pass_and_audit(
    store: ObjectStore, clock: ManualClock
) -> None:
    batches = await write_batches(store, agents=3, per_agent=4)
    await write_conflict(store, batches[2], clock.now_ns())
    expected = await derived_keys_in(store)
    # Steady state can restore what hangs off a listed accepted-by-time entry...
    await store.delete(batches[0].entry_key("accepted-by-blob"))
    await store.delete(batches[1].entry_key("raw-blobs-by-time"))
    # ...and only the audit what nothing indexes any more.
    for key in batches[5].derived_keys:
        await store.delete(key)
    for key in await derived_keys_in(store):
        if key.startswith(keys.QUARANTINE_BY_BLOB_PREFIX):
            await store.delete(key)
    ctx = await context(store, clock, settings=make_settings(concurrency=8))

    steady = await SteadyScanner(ctx).run_pass()
    assert dict(steady.outcome.created) == {"accepted-by-blob": 1, "raw-blobs-by-time": 1}
    audit = await run_full_audit(ctx)

    assert audit.status == "completed" and audit.problems == 0
    assert audit.repaired == {
        "accepted-by-time": 1,
        "accepted-by-blob": 1,
        "raw-blobs-by-time": 1,
        "quarantine-by-blob": 1,
        "rollup-dirty": 1,
    }
    assert await derived_keys_in(store) == expected
    assert await count_problems(store) == {}


async def test_manifest_without_derived_entries_and_bad_blobs_are_found(
    store: ObjectStore, clock: ManualClock
) -> None:
    batches = await write_batches(store, agents=2, per_agent=3)
    orphan = make_batch(9, 0, clock.now_ns())  # the collector died right after the create
    await write_batch(store, orphan, derived_entries=False)
    await store.delete(batches[1].manifest.raw_blob_key)
    await store.put(batches[4].manifest.raw_blob_key, bytes(reversed(batches[4].frame)))
    ctx = await context(store, clock)

    audit = await run_full_audit(ctx)

    assert audit.status == "completed" and audit.manifests_seen == 7
    assert orphan.derived_keys <= await derived_keys_in(store)
    assert (await count_problems(store))["missing-blob"] == 1
    # SHA-256 verification runs alongside audits; a round may take more than one.
    await audits_until_a_verification_round_ends(ctx, clock)
    assert await count_problems(store) == {"missing-blob": 1, "corrupt-blob": 1}


async def test_one_active_reconciler_and_takeover_after_expiry(
    store: ObjectStore, clock: ManualClock
) -> None:
    leader = await context(store, clock, owner="reconciler-a")
    with pytest.raises(LeaseHeld):
        await context(store, clock, owner="reconciler-b")
    clock.advance(31)
    successor = await context(store, clock, owner="reconciler-b")
    assert successor.epoch == leader.epoch + 1
    with pytest.raises(LeaseLost):
        await leader.check_fence()
