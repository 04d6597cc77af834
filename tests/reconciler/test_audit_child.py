"""The daemon's full audit in a child process (`reconciler.audit.child`,
`reconciler.audit.worker`; PROTOCOL §3.9: the audit never blocks the steady pass): real
processes on the filesystem store. A test holds the worker before its first catalog
write through a FIFO (``LM_AUDIT_WORKER_HOLD``), so nothing here waits for a duration to
pass: each wait is for a condition, with a deadline."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from config import Settings
from protocol import keys
from protocol.clock import ManualClock, SystemClock
from reconciler.audit.records import latest_audit, latest_completed_audit
from reconciler.audit.worker import HOLD_ENV, NICENESS, BorrowedFence
from reconciler.context import Fence
from reconciler.daemon import Reconciler
from store.fs import FileSystemStore
from store.lease import LeaseLost
from store.memory import MemoryStore
from store.time import store_clock
from tests.reconciler.conftest import (
    Batch,
    catalog_keys,
    cli_env,
    log_rows,
    make_batch,
    make_settings,
    write_batch_files,
)

DEADLINE_S = 60.0


def fs_settings(store_dir: Path) -> Settings:
    settings = make_settings(loop_interval_s=0.2, lease_ttl_s=30.0)
    doc = settings.model_dump(mode="json")
    doc["store"]["url"] = f"file://{store_dir}"
    return Settings.model_validate(doc)


def batches_now(root: Path, agents: int, first_agent: int = 0) -> list[Batch]:
    start = time.time_ns() - 10 * keys.NS_PER_S
    made = []
    for agent in range(first_agent, first_agent + agents):
        batch = make_batch(agent, 0, start + agent)
        write_batch_files(root, batch)
        made.append(batch)
    return made


async def until(
    check: Callable[[], Awaitable[bool]], what: str, deadline_s: float = DEADLINE_S
) -> None:
    """Wait for ``check`` (a condition, never a duration), failing after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {deadline_s} s: {what}")
        await asyncio.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def niceness(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def release(fifo: Path) -> None:
    """Let a held worker go on (opening for writing completes its open; closing, its read)."""
    fd = os.open(fifo, os.O_WRONLY)
    os.close(fd)


@pytest.fixture
def hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    monkeypatch.setenv(HOLD_ENV, str(fifo))
    return fifo


async def test_the_steady_pass_catalogs_while_the_audit_runs_in_a_child_process(
    tmp_path: Path, hold: Path
) -> None:
    store_dir = tmp_path / "store"
    unlogged = batches_now(store_dir, agents=3)  # only an audit catalogs these
    store = FileSystemStore(store_dir)
    reconciler = Reconciler(
        store=store,
        settings=fs_settings(store_dir),
        clock=SystemClock(),
        rng=random.Random(1),
        audit_in_child=True,
    )
    task = asyncio.create_task(reconciler.run())
    try:

        async def audit_held() -> bool:
            latest = await latest_audit(store, catalog_only=True)
            return reconciler.audits.child_pid is not None and latest is not None

        await until(audit_held, "the audit's child started its audit")
        pid = reconciler.audits.child_pid
        assert pid is not None and pid != os.getpid() and alive(pid)
        assert niceness(pid) == min(19, os.nice(0) + NICENESS)  # the steady pass goes first
        # A collector logs new batches while the child's audit is held mid-way.
        logged = batches_now(store_dir, agents=4, first_agent=10)
        await log_rows(store, SystemClock(), logged)

        async def logged_cataloged() -> bool:
            return {b.key for b in logged} <= await catalog_keys(store)

        await until(logged_cataloged, "the steady pass cataloged the logged batches")
        running = await latest_audit(store, catalog_only=True)
        assert running is not None and running.status == "running"
        assert reconciler.audits.running and reconciler.audits.child_pid == pid
        assert reconciler.metrics.audit_running._value.get() == 1
        assert not {b.key for b in unlogged} & await catalog_keys(store)

        release(hold)

        async def audit_completed() -> bool:
            return await latest_completed_audit(store) is not None and not reconciler.audits.running

        await until(audit_completed, "the child's audit completed")
        assert {b.key for b in unlogged} <= await catalog_keys(store)
        completed = await latest_completed_audit(store)
        assert completed is not None and completed.audit_id == running.audit_id
        assert completed.owner_epoch == reconciler.metrics.lease_epoch._value.get()
        # The child's catalog files were made by the daemon's one writer: each has its
        # catalog-created entry, and the audit's position lies at or before all of them.
        entries = [info.key async for info in store.list(keys.INDEX_CATALOG_CREATED_PREFIX)]
        assert completed.catalog_created_from is not None
        assert entries and all(
            key >= keys.INDEX_CATALOG_CREATED_PREFIX + completed.catalog_created_from
            for key in entries
        )
        # The daemon counted the child's work as its own.
        assert reconciler.metrics.audits.labels("completed")._value.get() == 1
        assert reconciler.metrics.audit_manifests._value.get() >= len(unlogged)
        assert reconciler.metrics.audit_running._value.get() == 0
        assert not alive(pid)
    finally:
        await reconciler.stop(grace_s=10.0)
        await task
        await store.close()


async def test_stop_kills_a_held_child_and_the_next_term_resumes_its_audit(
    tmp_path: Path, hold: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_dir = tmp_path / "store"
    unlogged = batches_now(store_dir, agents=3)
    store = FileSystemStore(store_dir)

    def daemon() -> Reconciler:
        return Reconciler(
            store=store,
            settings=fs_settings(store_dir),
            clock=SystemClock(),
            rng=random.Random(1),
            audit_in_child=True,
        )

    first = daemon()
    task = asyncio.create_task(first.run())

    async def child_auditing() -> bool:
        latest = await latest_audit(store, catalog_only=True)
        return first.audits.child_pid is not None and latest is not None

    await until(child_auditing, "the audit's child started its audit")
    pid = first.audits.child_pid
    started = await latest_audit(store, catalog_only=True)
    assert pid is not None and started is not None
    # Held in its FIFO's open, the child cannot save and exit on SIGTERM: after the
    # grace, SIGKILL. stop() returns with it gone, its audit left running (resumable).
    await first.stop(grace_s=20.0)
    await task
    assert not alive(pid)
    assert first.audits.child_pid is None and not first.audits.running
    left = await latest_audit(store, catalog_only=True)
    assert left is not None and left.status == "running"

    monkeypatch.delenv(HOLD_ENV)
    second = daemon()
    task = asyncio.create_task(second.run())
    try:

        async def completed() -> bool:
            return await latest_completed_audit(store) is not None

        await until(completed, "the next term's child resumed and completed the audit")
        done = await latest_completed_audit(store)
        assert done is not None and done.audit_id == started.audit_id  # resumed, not new
        assert done.started_at_unix_ns == started.started_at_unix_ns
        assert {b.key for b in unlogged} <= await catalog_keys(store)
    finally:
        await second.stop(grace_s=10.0)
        await task
        await store.close()


@pytest.mark.slow  # a Spark JVM in the child: ~20-40 s
async def test_with_the_spark_engine_the_daemons_child_audits_on_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing configures the child's session: the audit sizes its shuffle itself.
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    store_dir = tmp_path / "store"
    unlogged = batches_now(store_dir, agents=3)  # only an audit catalogs these
    store = FileSystemStore(store_dir)
    settings = fs_settings(store_dir)
    settings = settings.model_copy(
        update={"reconciler": settings.reconciler.model_copy(update={"audit_engine": "spark"})}
    )
    reconciler = Reconciler(
        store=store,
        settings=settings,
        clock=SystemClock(),
        rng=random.Random(1),
        audit_in_child=True,
    )
    task = asyncio.create_task(reconciler.run())
    try:

        async def completed() -> bool:
            done = await latest_completed_audit(store) is not None
            return done and not reconciler.audits.running

        await until(completed, "the child's Spark audit completed", deadline_s=240.0)
        done = await latest_completed_audit(store)
        assert done is not None and done.engine == "spark"
        assert done.owner_epoch == reconciler.metrics.lease_epoch._value.get()  # its lease
        assert {b.key for b in unlogged} <= await catalog_keys(store)
        assert reconciler.metrics.audits.labels("completed")._value.get() == 1
    finally:
        await reconciler.stop(grace_s=10.0)
        await task
        await store.close()


def test_the_child_exits_when_the_daemon_dies(tmp_path: Path, hold: Path) -> None:
    store_dir = tmp_path / "store"
    batches_now(store_dir, agents=2)
    env = cli_env(store_dir, LM_RECONCILER__LOOP_INTERVAL_S="0.2", LM_LOGGING__LEVEL="info")
    env[HOLD_ENV] = str(hold)
    log_path = tmp_path / "daemon.log"
    with log_path.open("wb") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "reconciler", "run"], env=env, stdout=log, stderr=log
        )
    try:
        pid = None
        deadline = time.monotonic() + DEADLINE_S
        while pid is None:
            assert daemon.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            for line in log_path.read_text().splitlines():
                if '"audit_worker_started"' in line:
                    pid = int(json.loads(line)["pid"])
            time.sleep(0.05)
        assert alive(pid)
        daemon.send_signal(signal.SIGKILL)  # by its PID: no stop, no cleanup
        daemon.wait(timeout=DEADLINE_S)
        deadline = time.monotonic() + DEADLINE_S
        while alive(pid):  # its standard input closed: it exits by itself
            assert time.monotonic() < deadline, "the orphaned audit worker lives on"
            time.sleep(0.05)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


async def test_the_workers_fence_holds_only_while_the_daemon_reports_its_lease(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    """The worker takes no lease: its fence is the daemon's lease as last reported, so a
    daemon that stops reporting (hung, partitioned, gone) stops its audit within the
    lease's TTL, before a successor could take the lease over."""
    ttl_s = 30.0
    fence = await Fence.acquire(
        memory_store, owner="daemon", ttl_s=ttl_s, clock=clock, rng=random.Random(1)
    )
    borrowed = BorrowedFence(
        store=memory_store, clock=store_clock(memory_store, clock), lease=fence.lease, ttl_s=ttl_s
    )
    await borrowed.check()
    clock.advance(ttl_s - borrowed.margin_s - 1)
    await borrowed.check()  # still ahead of the margin
    borrowed.extend(clock.now_ns() + int(ttl_s * 1e9))  # the daemon renewed and said so
    clock.advance(ttl_s - borrowed.margin_s - 1)
    await borrowed.check()
    clock.advance(2)  # no report since: within the margin of the last expiry heard of
    with pytest.raises(LeaseLost):
        await borrowed.check()
    borrowed.extend(clock.now_ns() + int(ttl_s * 1e9))  # lost stays lost
    with pytest.raises(LeaseLost):
        await borrowed.check()
    assert borrowed.epoch == fence.epoch
    assert (await memory_store.get(keys.RECONCILER_LEASE_KEY))[1] == fence.lease.etag
