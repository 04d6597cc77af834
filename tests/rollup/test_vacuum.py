"""`vacuum` (and `history`, which it truncates): retention, orphans, and never deleting
anything the current snapshot reaches."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from pathlib import Path

import pytest

from protocol import keys
from protocol.clock import ManualClock
from rollup.lifecycle.vacuum import retained, same_state, vacuum
from rollup.read.history import history
from rollup.table.commit import (
    CommitConflict,
    VersionNotFound,
    commit,
    load_latest,
    load_version,
    walk_snapshots,
)
from rollup.table.manifest import Changes, Snapshot, format_created_at
from rollup.table.owner import OwnerLease
from rollup.table.transition import apply
from store.base import ObjectStore
from store.fs import FileSystemStore
from store.lease import LeaseHeld
from store.memory import MemoryStore
from store.s3 import S3Store
from store.time import store_clock
from tests.rollup.dataset_builder import (
    commit_rows,
    hour_at,
    make_batch,
    parquet_bytes,
    points,
    put_data_file,
)
from tests.rollup.test_verify import run_cli
from tests.s3_servers import RunningServer, fresh_bucket

HOUR_NS = 3600 * 10**9


def chain(created_s: list[int]) -> list[Snapshot]:
    """Snapshots created at the given seconds, returned newest first."""
    snapshots: list[Snapshot] = []
    base = None
    for i, at in enumerate(created_s, start=1):
        base = apply(
            base,
            Changes(retention={"points": f"2026-11-21T{i:02d}"}),  # each version changes
            version=i,
            commit_id=f"c{i}",
            owner_epoch=1,
            created_at=format_created_at(at * 10**9),
            manifest_key_of_base=base.manifest_key if base else None,
        )
        snapshots.append(base)
    return snapshots[::-1]


def test_retention_semantics() -> None:
    snaps = chain([100, 200, 300, 400, 500])  # versions 1..5, newest first
    versions = lambda kept: [s.version for s in kept]  # noqa: E731
    assert versions(retained(snaps, now_ns=10**12, retain_versions=None, retain_s=None)) == [5]
    assert versions(retained(snaps, now_ns=10**12, retain_versions=2, retain_s=None)) == [5, 4]
    # At now=550 with 200s: cutoff 350 — versions 4 and 5 were created after it, and
    # version 3 was current at it.
    assert versions(retained(snaps, now_ns=550 * 10**9, retain_versions=None, retain_s=200)) == [
        5,
        4,
        3,
    ]
    assert versions(retained(snaps, now_ns=550 * 10**9, retain_versions=4, retain_s=200)) == [
        5,
        4,
        3,
        2,
    ]
    assert versions(retained(snaps, now_ns=10**15, retain_versions=None, retain_s=1)) == [5]
    assert versions(retained(snaps, now_ns=10**12, retain_versions=99, retain_s=None)) == [
        5,
        4,
        3,
        2,
        1,
    ]
    assert retained([], now_ns=0, retain_versions=1, retain_s=None) == []
    with pytest.raises(ValueError, match="retain_versions"):
        retained(snaps, now_ns=0, retain_versions=0, retain_s=None)


async def build_history(store: ObjectStore, clock: ManualClock) -> list[str]:
    """Three versions, each replacing hour 0's file; returns the data paths in order."""
    owner = await OwnerLease.acquire(store, "job", 10**6, clock)
    paths: list[str] = []
    for n in range(3):
        latest = await load_latest(store)
        remove = [f.path for f in latest.snapshot.data_files("points")] if latest else []
        loaded = await commit_rows(
            store,
            owner,
            clock,
            data=[("points", hour_at(0), points(hour_at(0), 2, seq_start=n))],
            ledger=[make_batch(hour_at(0), n).row],
            remove=remove,
        )
        paths.append(loaded.snapshot.data_files("points")[0].path)
        clock.advance(3600)
    await owner.release()
    return paths


async def test_vacuum_deletes_superseded_files_orphans_and_old_manifests(tmp_path: Path) -> None:
    clock = ManualClock(hour_at(1).start_ns)
    store = FileSystemStore(tmp_path, clock=clock)
    paths = await build_history(store, clock)
    orphan = keys.rollup_data_key("points", hour_at(0), str(uuid.uuid4()))
    await store.put(orphan, parquet_bytes(points(hour_at(0), 1)))  # a crashed run's file
    clock.advance(600)
    young = keys.rollup_data_key("points", hour_at(0), str(uuid.uuid4()))
    await store.put(young, b"in flight")  # a running commit's file

    dry = await vacuum(store, clock=clock, retain_versions=2, min_age_s=300, dry_run=True)
    assert dry.retained_versions == [3, 2] and dry.too_young == 1
    assert set(dry.deleted) >= {paths[0], orphan} and young not in dry.deleted
    assert (await store.get(orphan))[0]  # dry run deleted nothing

    report = await vacuum(store, clock=clock, retain_versions=2, min_age_s=300)
    assert report.deleted == dry.deleted
    listed = {info.key async for info in store.list("rollup/v1/")}
    assert paths[0] not in listed and orphan not in listed and young in listed
    assert {paths[1], paths[2]} <= listed  # version 2 still reads its file
    # Vacuum moved the pointer first (version 4: version 3's content, nothing changed).
    # Version 1's manifest is gone: history and version travel end at version 2.
    assert report.committed_version == 4
    assert [v.version for v in await history(store)] == [4, 3, 2]
    assert (await history(store))[0].files_added == 0
    assert (await load_version(store, 2)).snapshot.version == 2
    with pytest.raises(VersionNotFound, match="vacuumed"):
        await load_version(store, 1)
    # Version 4 repeats version 3's state, so it does not push version 2 out.
    again = await vacuum(store, clock=clock, retain_versions=2, min_age_s=300)
    assert again.deleted == [] and again.committed_version is None
    assert again.retained_versions == [4, 3, 2]


async def test_a_commit_planned_before_vacuum_fails_its_cas_after_it(tmp_path: Path) -> None:
    """Issue 24 item 6 (PROTOCOL §4.1): vacuum commits a snapshot of its own (pointer
    CAS) before deleting anything, so a writer that planned on the older pointer, wrote
    its file and stalled past vacuum's minimum age (after its last lease check) loses
    its CAS instead of swapping the pointer to a file vacuum deleted."""
    clock = ManualClock(hour_at(1).start_ns)
    store = FileSystemStore(tmp_path, clock=clock)
    await build_history(store, clock)
    base = await load_latest(store)
    assert base is not None and base.snapshot.version == 3
    stalled = await put_data_file(store, "points", hour_at(0), points(hour_at(0), 1), 4)
    clock.advance(3600)

    report = await vacuum(store, clock=clock, retain_versions=1, min_age_s=300)

    assert stalled.path in report.deleted
    with pytest.raises(CommitConflict):
        await commit(
            store, base=base, changes=Changes(added_files=(stalled,)), owner=None, clock=clock
        )
    latest = await load_latest(store)
    assert latest is not None and latest.snapshot.version == 4  # vacuum's own snapshot
    assert latest.snapshot.tables == base.snapshot.tables  # which changes no data
    assert latest.snapshot.ledger_hours == base.snapshot.ledger_hours
    listed = {info.key async for info in store.list("rollup/v1/")}
    assert latest.snapshot.reachable_keys() <= listed


@pytest.mark.s3
async def test_a_host_whose_clock_runs_ahead_keeps_a_young_orphan(
    ministack_server: RunningServer,
) -> None:
    # LastModified is MiniStack's clock; vacuum judges ages in it (PROTOCOL §3.8), so a
    # host two hours ahead must not take a running commit's fresh file for an old orphan.
    ahead = ManualClock(time.time_ns() + 2 * HOUR_NS)
    async with S3Store(
        bucket=fresh_bucket(ministack_server),
        prefix="vacuum",
        endpoint_url=ministack_server.endpoint_url,
        clock=ahead,
    ) as store:
        young = keys.rollup_data_key("points", hour_at(0), str(uuid.uuid4()))
        await store.put(young, b"in flight")  # a running commit's file, just written

        report = await vacuum(store, clock=ahead, retain_versions=1, min_age_s=3600)

        assert report.too_young == 1 and report.deleted == []
        assert (await store.get(young))[0] == b"in flight"
        assert store_clock(store, ahead).skew_s == pytest.approx(7200, abs=5)
        # Ages are right, not merely small: with no minimum age it is an orphan to delete.
        again = await vacuum(store, clock=ahead, retain_versions=1, min_age_s=0)
        assert again.deleted == [young]


async def test_vacuum_waits_for_a_running_job() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    await OwnerLease.acquire(store, "job", 600, clock)
    with pytest.raises(LeaseHeld):
        await vacuum(store, clock=clock, retain_versions=1)


async def random_history(rng: random.Random, store: ObjectStore, clock: ManualClock) -> None:
    """Commits that add and supersede files over a few hours, with orphans between them."""
    owner = await OwnerLease.acquire(store, "job", 10**6, clock)
    for step in range(rng.randint(1, 8)):
        clock.advance(rng.choice([1, 60, 3600, 7200]))
        latest = await load_latest(store)
        live = [f.path for f in latest.snapshot.data_files("points")] if latest else []
        remove = rng.sample(live, rng.randint(0, len(live)))
        data = [
            ("points", hour_at(h), points(hour_at(h), 1, seq_start=step))
            for h in rng.sample(range(4), rng.randint(0, 3))
        ]
        if rng.random() < 0.3:  # a run that crashed after writing its files
            await store.put(keys.rollup_data_key("points", hour_at(0), str(uuid.uuid4())), b"x")
            await store.put(keys.rollup_manifest_key(step + 50, str(uuid.uuid4())), b"{}")
        ledger = [make_batch(hour_at(0), step).row] if rng.random() < 0.5 else []
        await commit_rows(store, owner, clock, data=data, ledger=ledger, remove=remove)
    await owner.release()


@pytest.mark.parametrize("seed", range(30))
async def test_vacuum_never_deletes_what_a_retained_snapshot_reaches(seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock(hour_at(5).start_ns)
    store = MemoryStore(clock=clock)
    await random_history(rng, store, clock)
    clock.advance(rng.choice([0, 30, 5000]))
    chain_before = [s async for s in walk_snapshots(store)]
    retain_versions = rng.choice([None, 1, 2, 5])
    retain_s = rng.choice([None, 0.0, 100.0, 5000.0, 10**6])
    min_age_s = rng.choice([0.0, 60.0, 4000.0])
    report = await vacuum(
        store, clock=clock, retain_versions=retain_versions, retain_s=retain_s, min_age_s=min_age_s
    )
    listed = {info.key async for info in store.list("rollup/v1/")}
    kept = [s for s in chain_before if s.version in report.retained_versions]
    assert kept[0] == chain_before[0]  # the current snapshot is always retained
    for snapshot in kept:
        assert snapshot.reachable_keys() <= listed
    assert set(report.deleted).isdisjoint(chain_before[0].reachable_keys())
    latest = await load_latest(store)
    assert latest is not None
    if report.deleted:  # vacuum committed first: the same state as a new version
        assert latest.snapshot.version == chain_before[0].version + 1
        assert same_state(chain_before[0], latest.snapshot)
        assert latest.snapshot.reachable_keys() <= listed
    else:
        assert latest.snapshot == chain_before[0]
    assert not set(report.deleted) & listed
    # And it did its job: whatever is left is needed, or too young to judge.
    keep = set().union(*(s.reachable_keys() for s in [*kept, latest.snapshot]))
    async for info in store.list("rollup/v1/"):
        if info.key.startswith(("rollup/v1/tables/", "rollup/v1/ledger/", "rollup/v1/manifests/")):
            young = clock.now_ns() - info.last_modified_ns < min_age_s * 1e9
            assert info.key in keep or young, info.key


def test_history_and_vacuum_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def build() -> None:
        # In the past of the real clock the CLI uses, so the released lease has expired.
        clock = ManualClock(time.time_ns() - 7 * 24 * 3600 * 10**9)
        store = FileSystemStore(tmp_path, clock=clock)
        await build_history(store, clock)
        await store.close()

    asyncio.run(build())
    capsys.readouterr()
    assert run_cli(tmp_path, "history", "--format", "json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["version"] for r in rows] == [3, 2, 1]
    assert rows[0]["owner_epoch"] == 1 and rows[0]["rows_added"] == 2
    assert rows[0]["files_removed"] == 1 and rows[2]["batches_added"] == 1
    assert run_cli(tmp_path, "history", "--limit", "1", "--format", "csv") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("version,created_at,owner_epoch,rows_added") and len(lines) == 2
    assert run_cli(tmp_path, "history") == 0
    assert capsys.readouterr().out.splitlines()[0].split()[:3] == [
        "version",
        "created_at",
        "owner_epoch",
    ]
    assert run_cli(tmp_path, "vacuum", "--retain-versions", "1", "--dry-run") == 0
    captured = capsys.readouterr()
    assert captured.out.count("would delete") == 4  # two manifests, two superseded files
    assert "retained versions [3]" in captured.err
    assert run_cli(tmp_path, "vacuum", "--retain-versions", "1", "--min-age-seconds", "0") == 0
    capsys.readouterr()  # (structlog prints to stdout until the entry point configures it)
    assert run_cli(tmp_path, "history", "--format", "json") == 0
    assert [r["version"] for r in json.loads(capsys.readouterr().out)] == [4, 3]
