"""Collector test fixtures: real ``lm-collector serve`` processes, tokens, frames, answers.

`CollectorProcess` is one ``lm-collector serve`` child: started with a fresh ready file,
waited for with a bounded deadline (polling the ready file, never a fixed sleep), and
stopped by its PID (SIGTERM, then SIGKILL after a timeout). The ``collectors`` fixture
hands out a `CollectorLauncher` whose processes are all stopped when the test ends, pass
or fail. Every child runs with ``LM_LOGGING__FORMAT=json``, so `CollectorProcess.events`
reads its log back as structured events.

Helpers shared by the test modules (frames, HTTP answers, store listings) live here too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from chaos.s3_server import die_with_parent_hook
from chaos.skewed_collector import SKEW_ENV
from config import hash_token
from index.log_reader import read_segment
from protocol import keys
from protocol.frame_encode import encode_frame, points_table
from store.base import ObjectStore
from store.errors import NotFound

# A hang detector, not a performance bound: the wait ends as soon as every ready file
# exists, and a child that exits is reported at once. `--workers 2` starts three
# interpreters that each import aiohttp, pyarrow and botocore (~1.5 s of CPU each); on a
# 2-core machine shared with other jobs one such import was measured at 19 s of wall
# time, and a 30 s deadline failed test_request_logs_of_workers_name_the_worker.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
FRAME_TYPE = "application/x-lmbatch"
BOOT = uuid.UUID("5f0c7a3e-1d2b-4c3a-9e8f-0123456789ab")
T0_NS = 1_760_000_000_000_000_000

# --- tokens ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tokens:
    """A tokens file and the plaintext bearer tokens it admits."""

    path: Path
    writer: str = "lm-test-writer-token"  # principal "writer": agents agent-*, not admin
    other: str = "lm-test-other-token"  # principal "other": agents other-*, not admin
    admin: str = "lm-test-admin-token"  # principal "ops": admin, writes nothing


def write_tokens_file(path: Path) -> Tokens:
    tokens = Tokens(path=path)
    principals = [
        ("writer", tokens.writer, ["agent-*"], False),
        ("other", tokens.other, ["other-*"], False),
        ("ops", tokens.admin, [], True),
    ]
    text = "".join(
        "[[principal]]\n"
        f'name = "{name}"\n'
        f'token_sha256 = "{hash_token(token)}"\n'
        f"agents = {json.dumps(agents)}\n"
        f"admin = {'true' if admin else 'false'}\n\n"
        for name, token, agents, admin in principals
    )
    path.write_text(text)
    return tokens


@pytest.fixture
def tokens_file(tmp_path: Path) -> Tokens:
    return write_tokens_file(tmp_path / "tokens.toml")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# --- frames ------------------------------------------------------------------------------


def make_frame(
    agent_id: str = "agent-1",
    *,
    boot_id: uuid.UUID = BOOT,
    seq_start: int = 0,
    rows: int = 3,
    value: float = 1.0,
) -> bytes:
    """A valid frame of ``rows`` points; a different ``value`` gives other bytes for the
    same identity (an identity conflict)."""
    table = points_table(
        [T0_NS + i for i in range(rows)],
        ["cpu.load"] * rows,
        [value + i for i in range(rows)],
        [{"host": agent_id}] * rows,
    )
    return encode_frame(agent_id=agent_id, boot_id=boot_id, seq_start=seq_start, points=table)


def manifest_key_of(agent_id: str, seq_start: int, rows: int = 3, boot_id: uuid.UUID = BOOT) -> str:
    identity = keys.BatchIdentity(agent_id, boot_id, seq_start, seq_start + rows - 1)
    return keys.accepted_manifest_key(identity)


# --- HTTP answers ------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    text: str

    @property
    def json(self) -> Any:
        return json.loads(self.text)

    @property
    def request_id(self) -> str | None:
        return self.headers.get("X-Request-Id")


async def answer_of(response: aiohttp.ClientResponse) -> Answer:
    text = await response.text()
    return Answer(response.status, CIMultiDict(response.headers), text)


async def post_frame(
    session: aiohttp.ClientSession,
    base_url: str,
    body: Any,
    *,
    token: str | None = None,
    headers: Mapping[str, str] | None = None,
    content_type: str | None = FRAME_TYPE,
) -> Answer:
    """POST ``body`` (bytes, or an async iterator for a chunked upload) to /v1/batches."""
    sent: dict[str, str] = {}
    if content_type is not None:
        sent["Content-Type"] = content_type
    if token is not None:
        sent.update(bearer(token))
    sent.update(headers or {})
    async with session.post(f"{base_url}/v1/batches", data=body, headers=sent) as response:
        return await answer_of(response)


async def get(
    session: aiohttp.ClientSession,
    url: str,
    *,
    token: str | None = None,
    params: Mapping[str, str] | None = None,
) -> Answer:
    headers = bearer(token) if token is not None else {}
    async with session.get(url, headers=headers, params=params) as response:
        return await answer_of(response)


def metric_value(metrics_text: str, name: str, labels: str = "") -> float | None:
    """The value of sample ``name{labels}`` in a Prometheus text exposition, or None."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in metrics_text.splitlines():
        if line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        if sample == wanted:
            return float(value)
    return None


# --- store listings ----------------------------------------------------------------------


async def store_keys(store: ObjectStore, prefix: str = "") -> list[str]:
    """Every key in the store under ``prefix`` (the whole store by default)."""
    return [info.key async for info in store.list(prefix)]


async def wait_for_keys(
    store: ObjectStore, expected: Callable[[list[str]], bool], *, timeout_s: float = 15.0
) -> list[str]:
    """Poll the whole store until ``expected(keys)`` holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await store_keys(store)
        if expected(found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"store never reached the expected state; it holds {found}")
        await asyncio.sleep(0.05)  # polling with a deadline, not a sleep to pass


async def logged_keys(store: ObjectStore) -> set[str]:
    """The keys the index log's rows name so far (PROTOCOL §3.7)."""
    found: set[str] = set()
    async for info in store.list(keys.INDEX_LOG_PREFIX):
        try:
            rows = await read_segment(store, info.key)
        except NotFound:
            continue
        found.update(row.key for row in rows)
    return found


async def wait_for_log_rows(
    store: ObjectStore, *accepted: Mapping[str, Any], timeout_s: float = 15.0
) -> set[str]:
    """Poll until the index log holds an ``accepted`` row for each accepted 200 body (the
    collectors flush their buffers about once a second); fail after ``timeout_s``."""
    return await wait_for_log_rows_named(
        store, *(body["manifest_key"] for body in accepted), timeout_s=timeout_s
    )


async def wait_for_log_rows_named(
    store: ObjectStore, *row_keys: str, timeout_s: float = 15.0
) -> set[str]:
    """Poll until the index log has rows naming each of ``row_keys``."""
    wanted = set(row_keys)
    deadline = time.monotonic() + timeout_s
    while True:
        found = await logged_keys(store)
        if wanted <= found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"the index log never named {sorted(wanted - found)}")
        await asyncio.sleep(0.05)  # polling with a deadline, not a sleep to pass


# --- collector processes -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def collector_command() -> list[str]:
    script = Path(sys.executable).parent / "lm-collector"
    return [str(script)] if script.exists() else [sys.executable, "-m", "collector"]


def collector_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The test process's environment without any ``LM_*`` variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LM_")}
    env.update(extra)
    return env


def _die_with_parent() -> Callable[[], None] | None:
    """`die_with_parent_hook`, only from the main thread (Linux ties it to the thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return die_with_parent_hook()


@dataclass
class CollectorProcess:
    """One ``lm-collector serve`` child process."""

    name: str
    env: dict[str, str]
    work_dir: Path
    workers: int = 1
    command: list[str] = field(default_factory=lambda: collector_command())
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    worker_pids: list[int] = field(default_factory=list)
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.work_dir / f"{self.name}.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, *, timeout_s: float = START_TIMEOUT_S) -> CollectorProcess:
        """Start and wait until every worker has written its ready file."""
        assert not self.running, f"{self.name} is already running"
        self.starts += 1
        ready = self.work_dir / f"{self.name}.ready.{self.starts}"
        argv = [*self.command, "serve", "--ready-file", str(ready)]
        if self.workers > 1:
            argv += ["--workers", str(self.workers)]
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv,
                env=self.env,
                cwd=self.work_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent(),
            )
        try:
            infos = self._wait_ready(ready, timeout_s)
        except BaseException:
            self.stop()
            raise
        self.port = int(infos[0]["port"])
        self.worker_pids = [int(info["pid"]) for info in infos]
        assert all(int(info["port"]) == self.port for info in infos)
        return self

    def _wait_ready(self, ready: Path, timeout_s: float) -> list[dict[str, Any]]:
        assert self.proc is not None
        paths = (
            [ready] if self.workers == 1 else [Path(f"{ready}.{i}") for i in range(self.workers)]
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before it was ready; "
                    f"log tail:\n{self.log_tail()}"
                )
            if all(path.exists() for path in paths):
                return [json.loads(path.read_text()) for path in paths]
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name} not ready after {timeout_s}s; log tail:\n{self.log_tail()}"
                )
            time.sleep(0.02)  # polling for the ready file, bounded by the deadline

    def terminate(self) -> None:
        """Send SIGTERM (graceful stop) without waiting."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def stop(self, *, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM this PID, wait up to ``timeout_s``, then SIGKILL. Returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        self._kill_orphan_workers()
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL the process (a crash) and reap it."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._kill_orphan_workers()

    def _kill_orphan_workers(self) -> None:
        # With --workers N the worker PIDs are the supervisor's children; if it died
        # without reaping them, end them here, by PID.
        for pid in self.worker_pids:
            if self.proc is not None and pid == self.proc.pid:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def events(self) -> list[dict[str, Any]]:
        """The JSON log events written so far (non-JSON lines skipped)."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                found.append(event)
        return found


class CollectorLauncher:
    """Starts collectors under one directory and stops all of them in `stop_all`."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.started: list[CollectorProcess] = []

    def start(
        self,
        *,
        store_url: str,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        tokens: Tokens | None = None,
        workers: int = 1,
        port: int = 0,
        clock_skew_s: float = 0.0,
    ) -> CollectorProcess:
        """Start a collector over ``store_url`` on 127.0.0.1; ``env`` adds ``LM_*`` settings.
        With ``clock_skew_s`` its wall clock is that far off (`chaos.skewed_collector`)."""
        name = name or f"collector-{len(self.started) + 1}"
        settings = {
            "LM_STORE__URL": store_url,
            "LM_HTTP__HOST": "127.0.0.1",
            "LM_HTTP__PORT": str(port),
            "LM_INGEST__COLLECTOR_ID": name,
            "LM_LOGGING__FORMAT": "json",
            "LM_HTTP__SHUTDOWN_GRACE_S": "10",
            # --workers N would open metrics ports 9108+i; nothing here scrapes them.
            "LM_METRICS__ENABLED": "false",
        }
        if tokens is not None:
            settings["LM_AUTH__TOKENS_FILE"] = str(tokens.path)
        settings.update(env or {})
        command = collector_command()
        if clock_skew_s:
            command = [sys.executable, "-m", "chaos.skewed_collector"]
            settings[SKEW_ENV] = str(clock_skew_s)
        process = CollectorProcess(
            name=name,
            env=collector_env(settings),
            work_dir=self.work_dir,
            workers=workers,
            command=command,
        )
        self.started.append(process)
        return process.start()

    def stop_all(self) -> None:
        for process in self.started:
            process.stop()


@pytest.fixture
def collectors(tmp_path: Path) -> Iterator[CollectorLauncher]:
    launcher = CollectorLauncher(tmp_path / "collectors")
    try:
        yield launcher
    finally:
        launcher.stop_all()


def run_cli(
    args: list[str], env: Mapping[str, str], cwd: Path, *, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run ``lm-collector ARGS`` to completion (killed by PID after ``timeout_s``)."""
    return subprocess.run(
        [*collector_command(), *args],
        env=collector_env(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
