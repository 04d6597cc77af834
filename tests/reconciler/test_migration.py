"""Migrating a version-1 store (PROTOCOL §3, §3.7): a store written by the code before the
index (tests/fixtures/v1-store.tar.gz: per-object derived entries, a v1 reconciler's
audits, a committed rollup snapshot) is cataloged by today's reconciler's first pass,
without writing a derived entry; the rollup then verifies against the catalog and the
manifests and finds nothing new to include; ``drop-v1-index`` deletes the old index only
after that audit, and nothing else."""

from __future__ import annotations

import json
import random
import tarfile
from pathlib import Path

import pytest

from protocol import keys
from protocol.clock import ManualClock
from protocol.records import AuditRecord
from reconciler.context import ReconcilerContext
from reconciler.daemon import Reconciler
from reconciler.v1_index import V1DropRefused, drop_v1_index
from rollup.job.plan import make_plan
from rollup.read.verify import verify
from rollup.table.commit import load_latest
from store.base import ObjectStore
from store.fs import FileSystemStore
from tests.reconciler.conftest import (
    catalog_keys,
    cli_env,
    context,
    keys_under,
    make_settings,
    run_cli,
)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "v1-store.tar.gz"
V1_STATE = {keys.RECONCILER_V1_CHECKPOINT_KEY}


def unpack(tmp_path: Path) -> Path:
    with tarfile.open(FIXTURE) as archive:
        archive.extractall(tmp_path, filter="data")
    return tmp_path / "store"


async def snapshot(store: ObjectStore, prefixes: tuple[str, ...]) -> dict[str, str]:
    """Key -> ETag of everything under ``prefixes``."""
    found: dict[str, str] = {}
    for prefix in prefixes:
        found.update({info.key: info.etag async for info in store.list(prefix)})
    return found


async def newest_v1_audit(store: ObjectStore) -> AuditRecord:
    newest = sorted(await keys_under(store, keys.RECONCILER_AUDITS_PREFIX))[-1]
    return AuditRecord.from_json((await store.get(newest))[0])


async def test_the_first_pass_catalogs_a_v1_store_and_the_rollup_finds_it_complete(
    tmp_path: Path,
) -> None:
    root = unpack(tmp_path)
    probe = FileSystemStore(root)
    v1_audit = await newest_v1_audit(probe)
    assert v1_audit.status == "completed" and not v1_audit.catalog
    # A minute after the v1 reconciler's last audit: well within max_audit_interval_s, so
    # only an audit of the index counts as "recent" (the migration is due at once).
    assert v1_audit.completed_at_unix_ns is not None
    clock = ManualClock(v1_audit.completed_at_unix_ns + 60 * keys.NS_PER_S)
    store = FileSystemStore(root, clock=clock)
    records = await keys_under(store, keys.ACCEPTED_PREFIX) | await keys_under(
        store, keys.QUARANTINE_PREFIX
    )
    old_index = await snapshot(store, keys.V1_INDEX_PREFIXES)
    assert len(records) == 13 and len(old_index) == 38
    reconciler = Reconciler(
        store=store, settings=make_settings(), clock=clock, rng=random.Random(5), owner="new"
    )

    report = await reconciler.run_once()

    assert report.complete and report.audit is not None
    audit = report.audit
    assert audit.status == "completed" and audit.catalog
    assert (audit.manifests_seen, audit.quarantines_seen, audit.cataloged) == (12, 1, 13)
    assert await catalog_keys(store) == records
    assert await snapshot(store, keys.V1_INDEX_PREFIXES) == old_index  # none written
    markers = await keys_under(store, keys.ROLLUP_WORK_PREFIX)
    assert {keys.parse_rollup_work_marker_key(m) for m in markers} == await keys_under(
        store, keys.INDEX_CATALOG_PREFIX
    )

    by_catalog = await verify(store)
    by_manifests = await verify(store, from_manifests=True)
    for verdict in (by_catalog, by_manifests):
        assert verdict.ok and verdict.version == 1 and verdict.hours
        assert sum(hour.accepted.batches for hour in verdict.hours) == 12
    plan = await make_plan(store, await load_latest(store))
    assert plan.batches == 0 and plan.hours_checked  # the old ledger covers every batch


async def test_drop_v1_index_waits_for_the_migration_then_deletes_only_the_old_index(
    tmp_path: Path,
) -> None:
    root = unpack(tmp_path)
    v1_audit = await newest_v1_audit(FileSystemStore(root))
    assert v1_audit.completed_at_unix_ns is not None
    clock = ManualClock(v1_audit.completed_at_unix_ns + 60 * keys.NS_PER_S)
    store = FileSystemStore(root, clock=clock)
    everything = await snapshot(store, ("",))
    ctx: ReconcilerContext = await context(store, clock, owner="new", settings=make_settings())

    with pytest.raises(V1DropRefused):  # the v1 audits do not count
        await drop_v1_index(ctx, dry_run=False)
    assert (await snapshot(store, keys.V1_INDEX_PREFIXES)).keys() == {
        k for k in everything if k.startswith(keys.V1_INDEX_PREFIXES)
    }

    await ctx.fence.release()
    assert (
        await Reconciler(
            store=store, settings=make_settings(), clock=clock, rng=random.Random(5), owner="new"
        ).run_once()
    ).complete
    kept_prefixes = (keys.ACCEPTED_PREFIX, keys.QUARANTINE_PREFIX, keys.RAW_BLOBS_PREFIX)
    kept = await snapshot(store, (*kept_prefixes, "index/", "work/", keys.ROLLUP_PREFIX))
    ctx = await context(store, clock, owner="new", settings=make_settings())

    dry = await drop_v1_index(ctx, dry_run=True)
    assert dry.dry_run and dry.total == 38 + 1  # the entries and the old checkpoint
    assert await keys_under(store, keys.RECONCILER_V1_CHECKPOINT_KEY) == V1_STATE
    dropped = await drop_v1_index(ctx, dry_run=False)

    assert dropped.deleted == dry.deleted and dropped.deleted == {
        "accepted-by-time/v1/": 12,
        "accepted-by-blob/v1/": 12,
        "raw-blobs-by-time/v1/": 13,
        "quarantine-by-blob/v1/": 1,
        keys.RECONCILER_V1_CHECKPOINT_KEY: 1,
    }
    assert await snapshot(store, keys.V1_INDEX_PREFIXES) == {}
    assert not await keys_under(store, keys.RECONCILER_V1_CHECKPOINT_KEY)
    kept_prefixes_after = (*kept_prefixes, "index/", "work/", keys.ROLLUP_PREFIX)
    assert await snapshot(store, kept_prefixes_after) == kept
    assert (await verify(store)).ok and (await verify(store, from_manifests=True)).ok


def test_the_commands_migrate_and_drop_as_processes(tmp_path: Path) -> None:
    root = unpack(tmp_path)
    env = cli_env(root)

    refused = run_cli("drop-v1-index", env=env)
    assert refused.returncode == 1 and "no completed audit of the index" in refused.stderr

    once = run_cli("run", "--once", env=env)
    assert once.returncode == 0, once.stderr
    assert json.loads(once.stdout)["audit"]["cataloged"] == 13

    dry = run_cli("drop-v1-index", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["total"] == 39
    assert (root / "accepted-by-time" / "v1").is_dir()
    dropped = run_cli("drop-v1-index", env=env)
    assert dropped.returncode == 0, dropped.stderr
    doc = json.loads(dropped.stdout)
    assert doc["total"] == 39 and doc["dry_run"] is False
    assert not list((root / "accepted-by-time").rglob("*.json"))
    assert len(list((root / "accepted").rglob("*.json"))) == 12
