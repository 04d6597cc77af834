"""The full audit runs its joins out of core (issue 23 item 2, PROTOCOL §3.9): over the
ranged listing's Parquet parts and copies of the pinned catalog files, in a spill
directory removed afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import ReconcilerSettings
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.run import run_full_audit
from store.counting import CountingStore
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    catalog_keys,
    context,
    finished_listing_ranges,
    keys_under,
    make_settings,
    write_batches,
)


async def test_the_audit_joins_its_listing_parts_in_a_spill_dir_it_removes(
    memory_store: MemoryStore, clock: ManualClock, tmp_path: Path
) -> None:
    batches = await write_batches(memory_store, agents=3, per_agent=4)
    spill = tmp_path / "spill"
    ctx = await context(memory_store, clock, settings=make_settings(audit_spill_dir=str(spill)))

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.manifests_seen == 12
    assert await catalog_keys(memory_store) == {b.key for b in batches}
    listing = keys.audit_listing_prefix(record.started_at_unix_ns, record.audit_id)
    parts = {k for k in await keys_under(memory_store, listing) if k.endswith(".parquet")}
    assert any(k.startswith(listing + "accepted/") for k in parts)  # the joins' input
    assert any(k.startswith(listing + "raw-blobs/") for k in parts)
    assert spill.is_dir() and list(spill.iterdir()) == []  # its working files are gone


async def test_a_resumed_audit_lists_no_finished_range_and_rereads_nothing_cataloged(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    """Stopped while it catalogs what the joins found, it resumes: the listing is done
    (every range final), the joins run again over the parts and the catalog as it is
    now, and only the records not cataloged yet are read."""
    batches = await write_batches(memory_store, agents=4, per_agent=20)
    first = await context(memory_store, clock, settings=make_settings(concurrency=1))

    def stop_soon(progress: object) -> None:
        if getattr(progress, "repaired", 0) >= 32:
            first.stopping.set()

    interrupted = await run_full_audit(first, progress=stop_soon, progress_interval_s=0)
    assert interrupted.status == "running"
    cataloged_before = await catalog_keys(memory_store)
    assert 32 <= len(cataloged_before) < 80
    finished = await finished_listing_ranges(memory_store, interrupted)
    assert finished

    await first.fence.release()
    clock.advance(5)
    store = CountingStore(memory_store)
    second = await context(store, clock, owner="reconciler-b", settings=make_settings())
    resumed = await run_full_audit(second)

    assert resumed.status == "completed" and resumed.audit_id == interrupted.audit_id
    assert resumed.manifests_seen == 80
    assert not set(store.lists) & finished
    assert not set(store.keys_of("get", keys.ACCEPTED_PREFIX)) & cataloged_before
    assert await catalog_keys(memory_store) == {b.key for b in batches}


def test_audit_engine_is_local_or_spark() -> None:
    assert ReconcilerSettings().audit_engine == "local"
    assert ReconcilerSettings(audit_engine="spark").audit_engine == "spark"
    with pytest.raises(ValueError, match="audit_engine"):
        ReconcilerSettings(audit_engine="presto")  # type: ignore[arg-type]
