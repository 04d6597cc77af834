"""Reader leases and vacuum: a pinned snapshot keeps its files until the lease expires;
a reader whose file vanished retries once against the new pointer, never returning
fewer rows; renewal keeps a lease alive and stops where it is bounded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from protocol import keys
from protocol.clock import ManualClock, SystemClock
from protocol.records import RollupReaderLease
from rollup.lifecycle.vacuum import vacuum
from rollup.read.read_guard import ReadGuard, SnapshotFilesGone
from rollup.read.reader import scan, scan_snapshot
from rollup.read.reader_lease import ReaderLease, ReaderLeaseLost, wait_out_running_vacuum
from rollup.table.commit import LoadedSnapshot, load_latest, load_version
from rollup.table.owner import VACUUM_OWNER_PREFIX, OwnerLease
from store.base import ObjectStore
from store.counting import CountingStore
from store.fs import FileSystemStore
from store.s3 import S3Store
from tests.rollup.dataset_builder import commit_rows, hour_at, make_batch, points
from tests.rollup.test_reader import CountingHandler
from tests.rollup.test_vacuum import build_history
from tests.s3_servers import RunningServer, fresh_bucket

NEVER = ReadGuard(mode="never")


async def pin(store: ObjectStore, loaded: LoadedSnapshot, clock: Any, ttl_s: float) -> ReaderLease:
    return await ReaderLease.take(store, loaded, purpose="test read", ttl_s=ttl_s, clock=clock)


async def read_points(store: FileSystemStore, loaded: LoadedSnapshot) -> pa.Table:
    return await scan_snapshot(
        loaded, "points", filesystem=pafs.LocalFileSystem(), root=str(store.root)
    )


async def test_vacuum_keeps_a_pinned_snapshot_until_its_lease_expires(tmp_path: Path) -> None:
    clock = ManualClock(hour_at(1).start_ns)
    store = FileSystemStore(tmp_path, clock=clock)
    paths = await build_history(store, clock)  # versions 1..3, each replacing one file
    v1 = await load_version(store, 1)
    lease = await pin(store, v1, clock, ttl_s=600)
    stored = RollupReaderLease.from_json((await store.get(lease.key))[0])
    assert (stored.version, stored.manifest_key, stored.purpose) == (
        1,
        v1.manifest_key,
        "test read",
    )
    assert stored.expires_at_unix_ns == clock.now_ns() + 600 * 10**9

    report = await vacuum(store, clock=clock, retain_versions=1, min_age_s=0)

    # Version 1's data file and manifest stay for the reader (its ledger file, version 3
    # still lists); version 2's file, which nobody pins, goes.
    assert paths[1] in report.deleted and paths[0] not in report.deleted
    assert [(p.lease.reader, p.files_kept) for p in report.pinned] == [(stored.reader, 2)]
    assert report.expired_leases == []
    assert (await read_points(store, v1)).num_rows == 2  # the pinned read still works

    clock.advance(400)
    await lease.renew()  # expires 600 s from now, not from when it was taken
    clock.advance(400)
    again = await vacuum(store, clock=clock, retain_versions=1, min_age_s=0)
    assert again.deleted == [] and again.pinned[0].files_kept == 2

    clock.advance(601)  # the reader died: no more renewals
    expired = await vacuum(store, clock=clock, retain_versions=1, min_age_s=0)
    assert [r.reader for r in expired.expired_leases] == [stored.reader] and not expired.pinned
    assert paths[0] in expired.deleted and v1.manifest_key in expired.deleted
    listed = {info.key async for info in store.list("rollup/v1/")}
    assert lease.key not in listed and paths[0] not in listed and paths[2] in listed
    with pytest.raises(ReaderLeaseLost):
        await lease.renew()  # vacuum deleted it: the If-Match finds nothing


async def test_vacuum_dry_run_reports_leases_and_deletes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollup.cli.read import describe_leases

    clock = ManualClock(hour_at(1).start_ns)
    store = FileSystemStore(tmp_path, clock=clock)
    await build_history(store, clock)
    live = await pin(store, await load_version(store, 2), clock, ttl_s=900)
    dead = await pin(store, await load_version(store, 1), clock, ttl_s=60)
    await store.put(keys.rollup_reader_key("garbage"), b"{not json")
    clock.advance(120)

    report = await vacuum(store, clock=clock, retain_versions=1, min_age_s=0, dry_run=True)

    lines = describe_leases(report)
    assert any(f"reader lease {live.record.reader} (test read" in line for line in lines)
    assert any("kept 2 file(s) of version 2" in line for line in lines)
    assert f"would delete expired reader lease {dead.record.reader} (version 1" in "\n".join(lines)
    assert report.unreadable_leases == [keys.rollup_reader_key("garbage")]
    assert (await store.get(dead.key))[0]  # a dry run deletes no lease either


async def test_reader_lease_is_released_and_renewed_in_the_background(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path)
    clock = SystemClock()
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    loaded = await commit_rows(
        store, owner, clock, data=[("points", hour_at(0), points(hour_at(0), 3))]
    )
    lease = await pin(store, loaded, clock, ttl_s=1.0)
    first = lease.record.expires_at_unix_ns
    renewing = asyncio.create_task(lease.keep_renewed(max_hold_s=60))
    deadline = time.monotonic() + 10
    while lease.record.expires_at_unix_ns == first:
        assert time.monotonic() < deadline, "never renewed"
        await asyncio.sleep(0.02)
    renewed = lease.record.expires_at_unix_ns
    stored = RollupReaderLease.from_json((await store.get(lease.key))[0])
    assert stored.expires_at_unix_ns >= renewed > first and not renewing.done()
    assert (stored.reader, stored.version) == (lease.record.reader, loaded.snapshot.version)
    renewing.cancel()
    await lease.release()
    assert [i.key async for i in store.list(keys.ROLLUP_READERS_PREFIX)] == []


async def test_renewals_stop_after_the_longest_hold(tmp_path: Path) -> None:
    clock = ManualClock(hour_at(1).start_ns)
    store = FileSystemStore(tmp_path, clock=clock)
    await build_history(store, clock)
    lease = await pin(store, await load_version(store, 3), clock, ttl_s=30)
    # ManualClock.sleep advances time: renewals at 10 s, 20 s, ..., none at or past 45 s.
    await asyncio.wait_for(lease.keep_renewed(max_hold_s=45), timeout=10)
    stored = RollupReaderLease.from_json((await store.get(lease.key))[0])
    assert stored.expires_at_unix_ns == hour_at(1).start_ns + (3 * 3600 + 40 + 30) * 10**9


async def test_a_lease_too_close_to_its_expiry_lapses_instead_of_renewing(
    tmp_path: Path,
) -> None:
    clock = ManualClock(hour_at(1).start_ns)
    store = FileSystemStore(tmp_path, clock=clock)
    await build_history(store, clock)
    lease = await pin(store, await load_version(store, 3), clock, ttl_s=30)
    taken = lease.record.expires_at_unix_ns
    clock.advance(16)  # a stalled reader: the first renewal (10 s later) would leave 4 s
    await asyncio.wait_for(lease.keep_renewed(max_hold_s=3600), timeout=10)
    assert RollupReaderLease.from_json((await store.get(lease.key))[0]).expires_at_unix_ns == taken
    assert lease.is_valid() and not lease.is_valid(margin_s=5)  # 4 s left, not renewed


async def test_a_new_reader_lease_waits_out_a_vacuum_already_running(tmp_path: Path) -> None:
    # That vacuum read the leases before ours existed: its deletions are not ours to
    # trust until it is done (or its owner lease ran out).
    clock = ManualClock(hour_at(1).start_ns)
    store = FileSystemStore(tmp_path, clock=clock)
    running = await OwnerLease.acquire(store, f"{VACUUM_OWNER_PREFIX}test", 60, clock)
    waited = await wait_out_running_vacuum(store, clock, max_wait_s=3600)
    assert 60 <= waited <= 62  # until its expiry, in jittered polls of at most 2 s

    await running.release()
    clock.advance(1)
    vacuuming = await OwnerLease.acquire(store, f"{VACUUM_OWNER_PREFIX}next", 600, clock)
    assert 10 <= await wait_out_running_vacuum(store, clock, max_wait_s=10) <= 12  # bounded
    await vacuuming.release()
    assert await wait_out_running_vacuum(store, clock, max_wait_s=3600) == 0  # released

    # A reader of the current snapshot never waits: that vacuum keeps it.
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    current = await commit_rows(
        store, owner, clock, data=[("points", hour_at(0), points(hour_at(0), 1))]
    )
    await owner.release()
    vacuuming = await OwnerLease.acquire(store, f"{VACUUM_OWNER_PREFIX}third", 600, clock)
    assert (
        await wait_out_running_vacuum(
            store, clock, max_wait_s=3600, pinned_manifest_key=current.manifest_key
        )
        == 0
    )
    assert 5 <= await wait_out_running_vacuum(
        store, clock, max_wait_s=5, pinned_manifest_key="rollup/v1/manifests/old.json"
    )
    await vacuuming.release()

    job = await OwnerLease.acquire(store, "rollup-job", 600, clock)
    assert await wait_out_running_vacuum(store, clock, max_wait_s=3600) == 0  # not a vacuum
    await job.release()


class VacuumOnOpen(CountingHandler):
    """A local filesystem that, the first time a file in ``trigger`` is opened, runs
    ``action`` on the event loop first (a commit and a vacuum racing the read)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, action: Callable[[str], Any]) -> None:
        super().__init__()
        self.loop = loop
        self.action = action
        self.fired: set[str] = set()

    def open_input_file(self, path: str) -> Any:
        if path not in self.fired:
            self.fired.add(path)
            asyncio.run_coroutine_threadsafe(self.action(path), self.loop).result(timeout=30)
        return super().open_input_file(path)


async def supersede_and_vacuum(store: FileSystemStore, clock: ManualClock, n: int) -> None:
    """Commit a version replacing every points file, then vacuum everything unpinned."""
    owner = await OwnerLease.acquire(store, f"job-{n}", 600, clock)
    latest = await load_latest(store)
    assert latest is not None
    await commit_rows(
        store,
        owner,
        clock,
        data=[("points", hour_at(0), points(hour_at(0), 4 + n, seq_start=100 * n))],
        ledger=[make_batch(hour_at(0), 10 + n).row],
        remove=[f.path for f in latest.snapshot.data_files("points")],
    )
    await owner.release()
    clock.advance(1)
    await vacuum(store, clock=clock, retain_versions=1, min_age_s=0, hold_lease=False)


def once(store: FileSystemStore, clock: ManualClock, runs: list[int]) -> Callable[[str], Any]:
    """An action for `VacuumOnOpen`: supersede-and-vacuum for each of ``runs``, then
    nothing."""
    pending = list(runs)

    async def action(path: str) -> None:
        if pending:
            await supersede_and_vacuum(store, clock, pending.pop(0))

    return action


async def racing_store(tmp_path: Path) -> tuple[FileSystemStore, ManualClock]:
    clock = ManualClock(hour_at(1).start_ns)
    store = FileSystemStore(tmp_path, clock=clock)
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    await commit_rows(store, owner, clock, data=[("points", hour_at(0), points(hour_at(0), 3))])
    await owner.release()
    return store, clock


async def test_a_reader_whose_file_vanished_retries_once_against_the_new_pointer(
    tmp_path: Path,
) -> None:
    store, clock = await racing_store(tmp_path)
    handler = VacuumOnOpen(asyncio.get_running_loop(), once(store, clock, [1]))
    messages: list[str] = []
    guard = ReadGuard(mode="never", notify=messages.append)

    table = await scan(
        store,
        "points",
        filesystem=pafs.PyFileSystem(handler),
        root=str(store.root),
        guard=guard,
    )

    # Version 1's file was vacuumed under the read: every row comes from version 2's
    # file, read through version 3 (vacuum's own pointer move: the same state).
    assert sorted(table.column("seq").to_pylist()) == list(range(100, 105))
    assert len(messages) == 1
    assert "1 data file(s) of version 1 are gone" in messages[0]
    assert "retrying once against version 3" in messages[0]


async def test_a_reader_fails_clearly_when_the_retry_also_loses_its_file(
    tmp_path: Path,
) -> None:
    store, clock = await racing_store(tmp_path)
    handler = VacuumOnOpen(asyncio.get_running_loop(), once(store, clock, [1, 2]))
    with pytest.raises(SnapshotFilesGone, match=r"version 3 are gone .* again after a retry"):
        await scan(
            store,
            "points",
            filesystem=pafs.PyFileSystem(handler),
            root=str(store.root),
            guard=NEVER,
        )


async def test_a_pinned_read_keeps_its_files_through_a_racing_vacuum(tmp_path: Path) -> None:
    store, clock = await racing_store(tmp_path)
    handler = VacuumOnOpen(asyncio.get_running_loop(), once(store, clock, [1]))
    messages: list[str] = []
    table = await scan(
        store,
        "points",
        filesystem=pafs.PyFileSystem(handler),
        root=str(store.root),
        # The real clock: renewals wait for real time (a ManualClock's sleep would spin
        # them), and its "now" is days past the store's manual one, so the lease is live.
        guard=ReadGuard(mode="always", clock=SystemClock(), notify=messages.append),
    )
    assert sorted(table.column("seq").to_pylist()) == [0, 1, 2] and messages == []
    # The read is over: its lease is gone, and the next vacuum removes version 1's file.
    assert [i.key async for i in store.list(keys.ROLLUP_READERS_PREFIX)] == []
    report = await vacuum(store, clock=clock, retain_versions=1, min_age_s=0)
    assert any(key.startswith("rollup/v1/tables/points/") for key in report.deleted)


async def test_reads_of_a_vacuumed_version_or_a_damaged_current_snapshot_fail_clearly(
    tmp_path: Path,
) -> None:
    store, clock = await racing_store(tmp_path)
    handler = VacuumOnOpen(asyncio.get_running_loop(), once(store, clock, [1]))
    with pytest.raises(SnapshotFilesGone, match=r"version 1 are gone .* read a newer version"):
        await scan(
            store,
            "points",
            filesystem=pafs.PyFileSystem(handler),
            root=str(store.root),
            version=1,
            guard=NEVER,
        )
    latest = await load_latest(store)
    assert latest is not None
    await store.delete(latest.snapshot.data_files("points")[0].path)
    with pytest.raises(
        SnapshotFilesGone, match="it is the current snapshot: the dataset is damaged"
    ):
        await scan(
            store, "points", filesystem=pafs.LocalFileSystem(), root=str(store.root), guard=NEVER
        )


def test_auto_leases_only_long_reads() -> None:
    guard = ReadGuard(min_files=2)
    assert [guard.wants_lease(n) for n in (0, 2, 3)] == [False, False, True]
    assert ReadGuard(mode="always").wants_lease(0) and not NEVER.wants_lease(10**6)


@pytest.mark.s3
async def test_vacuum_honours_a_reader_lease_in_s3_store_time(
    ministack_server: RunningServer,
) -> None:
    # Expiry is the server's clock (PROTOCOL §3.8): on a host two hours ahead, a lease
    # written with its local clock would look expired at once to vacuum judging by that
    # clock, and would outlive this test if written with it; in store time it is live,
    # then expires three seconds later.
    ahead = ManualClock(time.time_ns() + 2 * 3600 * 10**9)
    async with S3Store(
        bucket=fresh_bucket(ministack_server),
        prefix="readers",
        endpoint_url=ministack_server.endpoint_url,
        clock=ahead,
    ) as store:
        owner = await OwnerLease.acquire(store, "job", 600, ahead)
        first = await commit_rows(
            store, owner, ahead, data=[("points", hour_at(0), points(hour_at(0), 2))]
        )
        old_file = first.snapshot.data_files("points")[0].path
        await commit_rows(
            store,
            owner,
            ahead,
            data=[("points", hour_at(0), points(hour_at(0), 3))],
            remove=[old_file],
        )
        await owner.release()
        lease = await pin(store, first, ahead, ttl_s=3)
        assert lease.is_valid()  # judged in store time, not by the host's clock

        kept = await vacuum(store, clock=ahead, retain_versions=1, min_age_s=0)
        assert old_file not in kept.deleted and kept.pinned[0].files_kept == 2
        assert (await store.head(old_file)).size > 0

        # Short lease, real server time: poll (bounded) until vacuum sees it expired.
        deadline = time.monotonic() + 30
        while True:
            report = await vacuum(store, clock=ahead, retain_versions=1, min_age_s=0)
            if report.expired_leases:
                break
            assert time.monotonic() < deadline, "the lease never expired in store time"
            await asyncio.sleep(0.5)
        assert old_file in report.deleted and first.manifest_key in report.deleted
        assert [i.key async for i in store.list(keys.ROLLUP_READERS_PREFIX)] == []


async def s3_supersede_and_vacuum(store: S3Store, n: int) -> None:
    clock = SystemClock()
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    latest = await load_latest(store)
    assert latest is not None
    await commit_rows(
        store,
        owner,
        clock,
        data=[("points", hour_at(0), points(hour_at(0), 4 + n, seq_start=100 * n))],
        remove=[f.path for f in latest.snapshot.data_files("points")],
    )
    await owner.release()
    await vacuum(store, clock=clock, retain_versions=1, min_age_s=0, hold_lease=False)


@pytest.mark.s3
async def test_a_reader_retries_after_vacuum_removed_its_file_on_s3(
    ministack_server: RunningServer,
) -> None:
    from rollup.table.storage import arrow_filesystem

    bucket = fresh_bucket(ministack_server)
    async with S3Store(
        bucket=bucket, prefix="retry", endpoint_url=ministack_server.endpoint_url
    ) as store:
        owner = await OwnerLease.acquire(store, "job", 600, SystemClock())
        await commit_rows(
            store, owner, SystemClock(), data=[("points", hour_at(0), points(hour_at(0), 3))]
        )
        await owner.release()
        s3, root = arrow_filesystem(store.url, endpoint_url=ministack_server.endpoint_url)
        pending = [1]

        async def action(path: str) -> None:
            if pending:
                await s3_supersede_and_vacuum(store, pending.pop())

        handler = VacuumOnOpen(asyncio.get_running_loop(), action)
        handler.fs = s3  # the real S3 filesystem behind the hook
        messages: list[str] = []
        table = await scan(
            store,
            "points",
            filesystem=pafs.PyFileSystem(handler),
            root=root,
            guard=ReadGuard(mode="never", notify=messages.append),
        )
        # pyarrow's S3 error for the vacuumed file led to a HEAD (404) and one retry.
        assert sorted(table.column("seq").to_pylist()) == list(range(100, 105))
        assert len(messages) == 1 and "retrying once against version 3" in messages[0]


def test_vacuum_and_query_clis_with_reader_leases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.rollup.test_verify import run_cli

    async def build() -> str:
        # History in the past of the real clock the CLI uses; the lease in its present.
        clock = ManualClock(time.time_ns() - 7 * 24 * 3600 * 10**9)
        store = FileSystemStore(tmp_path, clock=clock)
        await build_history(store, clock)
        lease = await pin(store, await load_version(store, 1), SystemClock(), ttl_s=600)
        await store.close()
        return lease.record.reader

    reader = asyncio.run(build())
    capsys.readouterr()
    assert run_cli(tmp_path, "vacuum", "--retain-versions", "1", "--min-age-seconds", "0") == 0
    out = capsys.readouterr().out
    assert f"reader lease {reader} (test read, expires " in out
    assert "): kept 2 file(s) of version 1" in out
    assert run_cli(tmp_path, "query", "points", "--lease", "--format", "json") == 0
    captured = capsys.readouterr()
    assert '"seq": 2' in captured.out and "warning" not in captured.err
    assert run_cli(tmp_path, "query", "points", "--version", "1", "--no-lease") == 2
    assert "version 1 was vacuumed" in capsys.readouterr().err  # its manifest is pinned, not
    # its chain: version travel ends where vacuum cut the chain

    async def leases_left() -> list[str]:
        store = FileSystemStore(tmp_path)
        return [i.key async for i in store.list(keys.ROLLUP_READERS_PREFIX)]

    assert asyncio.run(leases_left()) == [keys.rollup_reader_key(reader)]  # the CLI's is gone


class DeleteGate(CountingStore):
    """Holds every delete until ``gate`` opens; ``reached`` is set at the first one."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.gate = asyncio.Event()
        self.reached = asyncio.Event()

    async def delete(self, key: str) -> None:
        self.reached.set()
        await self.gate.wait()
        await super().delete(key)


@pytest.mark.s3
async def test_a_pinned_read_waits_out_a_vacuum_that_missed_its_lease(
    ministack_server: RunningServer,
) -> None:
    from rollup.table.storage import arrow_filesystem

    async with S3Store(
        bucket=fresh_bucket(ministack_server),
        prefix="wait",
        endpoint_url=ministack_server.endpoint_url,
    ) as store:
        clock = SystemClock()
        owner = await OwnerLease.acquire(store, "job", 600, clock)
        first = await commit_rows(
            store, owner, clock, data=[("points", hour_at(0), points(hour_at(0), 2))]
        )
        old_file = first.snapshot.data_files("points")[0].path
        await commit_rows(
            store,
            owner,
            clock,
            data=[("points", hour_at(0), points(hour_at(0), 3))],
            remove=[old_file],
        )
        await owner.release()
        gated = DeleteGate(store)
        vacuuming = asyncio.create_task(vacuum(gated, clock=clock, retain_versions=1, min_age_s=0))
        await asyncio.wait_for(gated.reached.wait(), 30)  # leases read; deletes about to go

        reader_store = CountingStore(store)
        s3, root = arrow_filesystem(store.url, endpoint_url=ministack_server.endpoint_url)
        reading = asyncio.create_task(
            scan(
                reader_store,
                "points",
                filesystem=s3,
                root=root,
                version=1,
                guard=ReadGuard(mode="always"),
            )
        )
        # The reader polls the owner lease while that vacuum holds it (no sleeps here:
        # its second look at owner.json proves it waited instead of reading).
        deadline = time.monotonic() + 30
        while reader_store.count("get", keys.ROLLUP_OWNER_KEY) < 2:
            assert time.monotonic() < deadline and not reading.done(), reading
            await asyncio.sleep(0.01)
        assert not reading.done()
        gated.gate.set()
        report = await asyncio.wait_for(vacuuming, 30)
        assert old_file in report.deleted and report.pinned == []  # it never saw the lease
        # The read starts once that vacuum is done: the file it removed is reported, not
        # skipped, and no row of a half-read snapshot is returned.
        with pytest.raises(SnapshotFilesGone, match="version 1 are gone"):
            await asyncio.wait_for(reading, 30)
        assert [i.key async for i in store.list(keys.ROLLUP_READERS_PREFIX)] == []
