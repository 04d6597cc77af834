"""Issue 31 item 6 (PROTOCOL §3.5 rule 2, §3.7): every ``catalog-created`` entry holds its
file's hour and writer (`records.CatalogCreated`); re-marking after a stopped audit
(`reconciler.audit.remark`) creates markers only for that audit's files (and for entries
that name no writer, as before), never for the steady pass's or compaction's, whose
markers a rollup run may have consumed; and the lease holder trims the entries no rule
reads any more in its housekeeping, GC or not, keeping those a running audit needs.

Without the writer check in `remark_since`, the first test fails (the steady pass's and
the merged file's consumed markers come back); without the daemon's trim, the last one
does (with the GC disabled no entry ever goes).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from index import catalog
from protocol import keys
from protocol.clock import ManualClock
from protocol.records import CatalogCreated
from reconciler.audit.records import latest_audit
from reconciler.audit.run import run_full_audit
from reconciler.compaction import CatalogCompactor
from reconciler.context import ReconcilerContext
from reconciler.daemon import Reconciler
from reconciler.steady import OrphanSuspects, SteadyScanner
from store.base import ObjectStore
from store.errors import Unavailable
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    T0_NS,
    context,
    keys_under,
    log_rows,
    make_settings,
    write_batches,
)

S = keys.NS_PER_S


class MarkersFail(MemoryStore):
    """Rollup work marker PUTs under ``failing`` fail (a process killed right after its
    catalog file was written); ``None``: none fail."""

    failing: str | None = keys.ROLLUP_WORK_PREFIX

    async def put(self, key: str, body: bytes, **conditions: Any) -> str:
        if self.failing is not None and key.startswith(self.failing):
            raise Unavailable("put", key, "killed before the marker")
        return await super().put(key, body, **conditions)


async def catalog_files(store: ObjectStore) -> set[str]:
    return {info.key async for info in catalog.list_all_files(store)}


def markers_of(files: set[str]) -> set[str]:
    return {keys.rollup_work_marker_key(name) for name in files}


async def consume_markers(store: ObjectStore) -> None:
    """What a rollup run does once its committed ledger holds the files' rows."""
    for key in await keys_under(store, keys.ROLLUP_WORK_PREFIX):
        await store.delete(key)


async def steady_pass_and_merge(ctx: ReconcilerContext, clock: ManualClock) -> set[str]:
    """New batches cataloged by the steady pass, then the hour merged by compaction (each
    file with its marker); returns the catalog files they wrote."""
    before = await catalog_files(ctx.store)
    later = await write_batches(
        ctx.store, agents=1, per_agent=2, start_ns=T0_NS + 30 * S, first_agent=7
    )
    await log_rows(ctx.store, clock, later)
    assert (await SteadyScanner(ctx, OrphanSuspects()).run_pass()).complete
    compactor = CatalogCompactor()
    for name in await catalog_files(ctx.store):
        compactor.touched(keys.parse_index_catalog_key(name)[0], name)
    assert (await compactor.merge(ctx, force=True)).hours_compacted == 1
    written = await catalog_files(ctx.store) - before
    assert len(written) == 2  # the steady pass's file and the merged one
    return written


async def killed_audit(store: MarkersFail, clock: ManualClock) -> tuple[str, set[str]]:
    """An audit run killed between its catalog file and the file's marker: left
    ``running``. Returns its id and its catalog files."""
    await write_batches(store, agents=2, per_agent=3)  # no log rows: the audit catalogs them
    killed = await context(store, clock)
    first = await run_full_audit(killed)
    assert first.status == "running"
    files = await catalog_files(store)
    assert files and await keys_under(store, keys.ROLLUP_WORK_PREFIX) == set()
    store.failing = None
    await killed.fence.release()
    return first.audit_id, files


@pytest.mark.parametrize("pin_lapsed", [False, True], ids=["resumed", "restarted"])
async def test_re_marking_after_a_stopped_audit_leaves_other_writers_files_alone(
    clock: ManualClock, pin_lapsed: bool
) -> None:
    store = MarkersFail(clock=clock)
    stopped, audit_files = await killed_audit(store, clock)
    clock.advance(make_settings().reconciler.audit_pin_s + 1 if pin_lapsed else 1)
    ctx = await context(store, clock, owner="reconciler-b")
    # Meanwhile the steady pass and compaction wrote files with their markers, and a rollup
    # run consumed those: making them again would only make it redo the work.
    others = await steady_pass_and_merge(ctx, clock)
    await consume_markers(store)

    after = await run_full_audit(ctx)

    assert after.status == "completed"
    assert (after.audit_id != stopped) == pin_lapsed  # resumed, or a new one after it
    markers = await keys_under(store, keys.ROLLUP_WORK_PREFIX)
    assert markers == markers_of(audit_files), (
        f"re-marked files the audit did not write: {sorted(markers - markers_of(audit_files))}"
    )
    assert not markers & markers_of(others)


async def test_entries_without_a_writer_are_re_marked_as_before(clock: ManualClock) -> None:
    store = MarkersFail(clock=clock)
    _stopped, audit_files = await killed_audit(store, clock)
    clock.advance(1)
    ctx = await context(store, clock, owner="reconciler-b")
    others = await steady_pass_and_merge(ctx, clock)
    await consume_markers(store)
    # Every entry as the version before wrote it: no hour, no writer. Any of them may be
    # the stopped audit's file, so each is marked, as before.
    for entry in await keys_under(store, keys.INDEX_CATALOG_CREATED_PREFIX):
        doc = json.loads((await store.get(entry))[0])
        old = {name: doc[name] for name in ("schema", "catalog_key", "rows")}
        await store.put(entry, json.dumps(old).encode())

    assert (await run_full_audit(ctx)).status == "completed"

    markers = await keys_under(store, keys.ROLLUP_WORK_PREFIX)
    assert markers == markers_of(audit_files | others)


async def test_every_entry_names_its_files_hour_and_writer(clock: ManualClock) -> None:
    store = MarkersFail(clock=clock)
    stopped, audit_files = await killed_audit(store, clock)
    ctx = await context(store, clock, owner="reconciler-b")
    others = await steady_pass_and_merge(ctx, clock)

    named: dict[str, tuple[str | None, str | None]] = {}
    for entry in await keys_under(store, keys.INDEX_CATALOG_CREATED_PREFIX):
        created = CatalogCreated.from_json((await store.get(entry))[0])
        named[created.catalog_key] = (created.hour, created.writer)

    assert set(named) == audit_files | others
    for name, (hour, _writer) in named.items():
        assert hour == keys.parse_index_catalog_key(name)[0].iso
    writers = {name: writer for name, (_hour, writer) in named.items()}
    unnamed = CatalogCreated.from_json(
        json.dumps({"schema": "lightmetrics.catalog_created.v1", "catalog_key": "k", "rows": 1})
    )
    assert (unnamed.hour, unnamed.writer) == (None, None)  # an entry of the version before
    assert {writers[name] for name in audit_files} == {f"audit-{stopped}"}
    assert sorted(str(writers[name]) for name in others) == ["compaction", "steady"]


async def test_a_write_must_name_a_known_writer_before_anything_is_written(
    clock: ManualClock,
) -> None:
    store = MemoryStore(clock=clock)
    writer = catalog.CatalogWriter(store=store, clock=clock, rng=random.Random(1), epoch=1)
    hour = keys.UtcHour.from_unix_ns(T0_NS)
    with pytest.raises(ValueError, match="writer"):
        await writer.write(hour, [], writer="audit-not-an-id")
    assert await keys_under(store) == set()


@pytest.mark.parametrize(
    "completed_before", [False, True], ids=["first-audit", "after-a-completed-audit"]
)
async def test_with_the_gc_disabled_the_lease_holder_trims_entries_no_rule_needs(
    clock: ManualClock, completed_before: bool
) -> None:
    settings = make_settings()
    assert not settings.gc.enabled
    store = MarkersFail(clock=clock)
    store.failing = None
    clock.advance(3600)  # the steady pass's batches in the hour after the audit's
    ctx = await context(store, clock, settings=settings)
    scanner = SteadyScanner(ctx, OrphanSuspects())
    first_hour = await write_batches(store, agents=1, per_agent=2, start_ns=T0_NS + 3600 * S)
    await log_rows(store, clock, first_hour)
    assert (await scanner.run_pass()).complete  # entry e0
    position = None
    if completed_before:
        completed = await run_full_audit(ctx)
        assert completed.status == "completed"
        position = completed.catalog_created_from
    more = await write_batches(
        store, agents=1, per_agent=2, start_ns=T0_NS + 3610 * S, first_agent=1
    )
    await log_rows(store, clock, more, seed=4)
    assert (await scanner.run_pass()).complete  # entry e1
    e0, e1 = sorted(await keys_under(store, keys.INDEX_CATALOG_CREATED_PREFIX))
    if position is not None:
        assert e0 < keys.INDEX_CATALOG_CREATED_PREFIX + position <= e1  # GC rule 2 reads e1
    await ctx.fence.release()
    # Batches no log row names, of the hour before: the next audit catalogs them, and is
    # killed before its file's marker (left running: its re-marking needs its entries).
    await write_batches(store, agents=2, per_agent=2, first_agent=5)
    store.failing = f"{keys.ROLLUP_WORK_PREFIX}{keys.UtcHour.from_unix_ns(T0_NS).partition}/"
    if completed_before:
        clock.advance(settings.reconciler.max_audit_interval_s + 1)  # the next one is due
    daemon = Reconciler(
        store=store, settings=settings, clock=clock, rng=random.Random(2), owner="reconciler-b"
    )

    await daemon.run_once()

    running = await latest_audit(store, catalog_only=True)
    assert running is not None and running.status == "running"
    assert running.catalog_created_from is not None
    entries = await keys_under(store, keys.INDEX_CATALOG_CREATED_PREFIX)
    start = keys.INDEX_CATALOG_CREATED_PREFIX + running.catalog_created_from
    audit_entries = {entry for entry in entries if entry >= start}
    assert audit_entries  # the running audit's: kept
    # e0 is older than every position a rule needs; e1 is needed by GC rule 2 while the
    # completed audit is the latest completed one.
    assert entries - audit_entries == ({e1} if completed_before else set())
    assert await keys_under(store, keys.RECONCILER_GC_RUNS_PREFIX) == set()  # no GC ran

    # The stopped audit's re-marking still finds its file.
    audit_files = await catalog_files(store)
    store.failing = None
    await daemon.run_once()
    finished = await latest_audit(store, catalog_only=True)
    assert finished is not None and finished.audit_id == running.audit_id
    assert finished.status == "completed"
    hour_before = keys.UtcHour.from_unix_ns(T0_NS)
    audit_file = {f for f in audit_files if keys.parse_index_catalog_key(f)[0] == hour_before}
    assert audit_file and markers_of(audit_file) <= await keys_under(store, keys.ROLLUP_WORK_PREFIX)
