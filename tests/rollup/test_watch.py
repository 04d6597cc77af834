"""``lm-rollup watch``: every committed version printed once, in order; a poll that finds
nothing new is one conditional GET answered 304; Ctrl-C ends it with exit code 0."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from protocol.clock import ManualClock, SystemClock
from protocol.keys import ROLLUP_POINTER_KEY
from rollup.cli.watch import WatchStats, version_line, watch
from rollup.lifecycle.vacuum import vacuum
from rollup.read.history import VersionInfo
from rollup.table.owner import OwnerLease
from store.counting import CountingStore
from store.fs import FileSystemStore
from store.s3 import S3Store
from tests.rollup.dataset_builder import commit_rows, hour_at, make_batch, points
from tests.s3_servers import RunningServer, dummy_aws_env, fresh_bucket

EXIT_DEADLINE_S = 60.0


class StepClock(ManualClock):
    """A manual clock whose ``sleep`` waits for the test to allow one more poll."""

    def __init__(self) -> None:
        super().__init__(hour_at(1).start_ns)
        self.ticks: asyncio.Queue[None] = asyncio.Queue()
        self.asleep = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.asleep.set()
        await self.ticks.get()
        self.asleep.clear()
        self.advance(seconds)


async def commit_version(store: CountingStore, clock: ManualClock, n: int) -> None:
    owner = await OwnerLease.acquire(store, f"job-{n}", 600, clock)
    await commit_rows(
        store,
        owner,
        clock,
        data=[("points", hour_at(0), points(hour_at(0), n, seq_start=10 * n))],
        ledger=[make_batch(hour_at(0), n).row],
    )
    await owner.release()


async def test_watch_prints_each_version_once_and_a_304_costs_one_get(tmp_path: Path) -> None:
    clock = StepClock()
    store = CountingStore(FileSystemStore(tmp_path, clock=clock))
    await commit_version(store, clock, 1)
    printed: list[VersionInfo] = []
    stats = WatchStats()
    watching = asyncio.create_task(
        watch(
            store,
            interval_s=5,
            count=3,
            clock=clock,
            emit=printed.append,
            note=lambda message: None,
            stats=stats,
        )
    )

    async def settled() -> None:
        """Wait (bounded) until the watch sleeps again, or has finished."""
        deadline = time.monotonic() + 10
        while not (clock.asleep.is_set() and clock.ticks.empty()) and not watching.done():
            assert time.monotonic() < deadline, "the watch neither polled nor finished"
            await asyncio.sleep(0.001)

    async def poll() -> list[tuple[str, str]]:
        """Let one poll run; the requests it made."""
        store.clear()
        clock.ticks.put_nowait(None)
        await settled()
        return list(store.requests)

    await settled()
    assert stats.start_version == 1
    for _ in range(3):  # nothing new: each poll is one GET of the pointer, answered 304
        assert await poll() == [("get", ROLLUP_POINTER_KEY)]
    await commit_version(store, clock, 2)
    changed = await poll()
    # The pointer, version 2's manifest, and version 1's (what did version 2 add?).
    assert [op for op, _ in changed] == ["get"] * 3 and changed[0][1] == ROLLUP_POINTER_KEY
    assert [v.version for v in printed] == [2]
    assert await poll() == [("get", ROLLUP_POINTER_KEY)]
    # Two commits between polls: both printed, oldest first; then --count 3 is met.
    await commit_version(store, clock, 3)
    await commit_version(store, clock, 4)
    # The pointer and the two new manifests: version 2 is still known from before.
    assert len(await poll()) == 3
    await asyncio.wait_for(watching, 10)
    assert [v.version for v in printed] == [2, 3, 4]
    assert [(v.files_added, v.batches_added) for v in printed] == [(1, 1)] * 3
    assert (stats.polls, stats.not_modified, stats.changed, stats.printed) == (6, 4, 2, 3)
    line = version_line(printed[0], as_json=False)
    assert line.startswith("version 2 created_at ") and "files +1 -0 batches +1 rows +2" in line
    assert json.loads(version_line(printed[0], as_json=True))["version"] == 2
    deleting = dataclasses.replace(printed[0], deletes=("cpu by ops: leaked label",))
    assert version_line(deleting, as_json=False).endswith(" deletes: cpu by ops: leaked label")


async def test_watch_reports_versions_vacuumed_before_it_read_them(tmp_path: Path) -> None:
    clock = StepClock()
    store = CountingStore(FileSystemStore(tmp_path, clock=clock))
    await commit_version(store, clock, 1)
    printed: list[VersionInfo] = []
    notes: list[str] = []
    watching = asyncio.create_task(
        watch(
            store,
            interval_s=5,
            count=1,
            clock=clock,
            emit=printed.append,
            note=notes.append,
            stats=WatchStats(),
        )
    )
    deadline = time.monotonic() + 10
    while not clock.asleep.is_set():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)
    for n in (2, 3, 4):
        await commit_version(store, clock, n)
    clock.advance(10)
    await vacuum(store, clock=clock, retain_versions=1, min_age_s=0)
    clock.ticks.put_nowait(None)
    await asyncio.wait_for(watching, 10)
    assert [v.version for v in printed] == [4]
    assert "versions 2..3 were vacuumed or skipped before they were read" in notes


def read_lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


class WatchProcess:
    """``python -m rollup watch`` against a config, its output read line by line."""

    def __init__(self, config: Path, *args: str) -> None:
        env = {**dummy_aws_env(), **_inherited_env()}
        # The child must start with SIGINT at its default, as from a terminal, for Ctrl-C
        # to reach it: a test run started in the background without job control (CI's
        # ``nohup ... &``) ignores SIGINT, and an ignored signal stays ignored across exec
        # (the child's asyncio then installs no handler); a caught one is reset.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rollup", "--config", str(config), "watch", *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        finally:
            signal.signal(signal.SIGINT, previous)
        self.out: queue.Queue[str] = queue.Queue()
        self.err: queue.Queue[str] = queue.Queue()
        self.err_lines: list[str] = []
        self.readers: list[threading.Thread] = []
        for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            assert stream is not None
            reader = threading.Thread(target=read_lines, args=(stream, into), daemon=True)
            reader.start()
            self.readers.append(reader)

    def wait_for_err(self, text: str, timeout_s: float = EXIT_DEADLINE_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.err_lines):
            remaining = deadline - time.monotonic()
            assert remaining > 0 and self.proc.poll() is None, (text, self.err_lines)
            try:
                self.err_lines.append(self.err.get(timeout=min(remaining, 1.0)))
            except queue.Empty:
                continue

    def finish(self) -> tuple[int, list[str], str]:
        """Wait (bounded) for the exit; the exit code, stdout lines, and all of stderr."""
        try:
            code = self.proc.wait(timeout=EXIT_DEADLINE_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()  # this test's own child, by its PID
                self.proc.wait()
            for reader in self.readers:
                reader.join(timeout=10)  # they end at the pipes' EOF
            for stream in (self.proc.stdout, self.proc.stderr):
                assert stream is not None
                stream.close()  # also when the wait failed: no pipe left to a later test
        lines = []
        while not self.out.empty():
            lines.append(self.out.get())
        while not self.err.empty():
            self.err_lines.append(self.err.get())
        return code, lines, "".join(self.err_lines)


def _inherited_env() -> dict[str, str]:
    from chaos.s3_server import child_env

    return child_env()


@pytest.mark.s3
def test_watch_process_prints_exactly_the_versions_committed_on_s3(
    ministack_server: RunningServer, tmp_path: Path
) -> None:
    bucket = fresh_bucket(ministack_server)
    config = tmp_path / "lm.toml"
    config.write_text(
        f'[store]\nurl = "s3://{bucket}/lm"\nendpoint_url = "{ministack_server.endpoint_url}"\n'
    )

    async def commit(n: int) -> None:
        async with S3Store(
            bucket=bucket, prefix="lm", endpoint_url=ministack_server.endpoint_url
        ) as store:
            clock = SystemClock()
            owner = await OwnerLease.acquire(store, "job", 60, clock)
            await commit_rows(
                store,
                owner,
                clock,
                data=[("points", hour_at(0), points(hour_at(0), n, seq_start=10 * n))],
                ledger=[make_batch(hour_at(0), n).row],
            )
            await owner.release()

    asyncio.run(commit(1))
    watcher = WatchProcess(config, "--interval", "0.2", "--count", "2", "--json")
    watcher.wait_for_err("from version 1")
    asyncio.run(commit(2))
    asyncio.run(commit(3))
    code, lines, err = watcher.finish()
    assert code == 0, err
    assert [json.loads(line)["version"] for line in lines] == [2, 3]
    assert all(json.loads(line)["batches_added"] == 1 for line in lines)
    summary = re.search(
        r"watch: (\d+) polls, (\d+) not modified \(304\), (\d+) changed, 0 failed; "
        r"2 versions printed since version 1",
        err,
    )
    assert summary is not None, err
    polls, not_modified, changed = (int(g) for g in summary.groups())
    # Each poll was one conditional GET: answered 304, or with a new pointer.
    assert 1 <= changed <= 2 and polls == not_modified + changed


def test_ctrl_c_ends_a_watch_with_exit_code_0(tmp_path: Path) -> None:
    config = tmp_path / "lm.toml"
    config.write_text(f'[store]\nurl = "file://{tmp_path / "store"}"\n')
    watcher = WatchProcess(config, "--interval", "0.1")
    watcher.wait_for_err("from version 0")
    watcher.proc.send_signal(signal.SIGINT)
    code, lines, err = watcher.finish()
    assert code == 0 and lines == [], err
    assert "Traceback" not in err and "watch: " in err
