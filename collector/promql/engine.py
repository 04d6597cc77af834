"""The PromQL engine's life (PROTOCOL §5): a Prometheus the collector supervises
(``query.promql.prometheus``), or one the operator runs beside it (``query.promql.url``).

Either way the collector writes the internal principal's read token (made at each of its
starts, `collector.auth.EngineReadToken`) into the engine's ``credentials_file`` and
forwards PromQL requests only to an engine whose ``buildinfo`` it checked
(`current()` is None until then, and while it is down: the forward answers 503).

**Supervised** (`SupervisedEngine`): each start gets a fresh loopback port, a fresh
basic-auth password and a fresh, disposable TSDB directory; the engine is ready when
``/-/ready`` answers with our basic auth. When it exits it is started again after a
jittered backoff from 1 s doubling to 60 s (reset once a start has stayed up for
`HEALTHY_S`). Repeating is safe: the engine holds no data, so a new start loses nothing,
and a new port and directory mean a start never meets what the last one left behind.

The child is ended with the collector: ``PR_SET_PDEATHSIG`` (SIGKILL) is set in the child
between fork and exec (``preexec_fn``), and the child checks that its parent is still the
collector afterwards (the collector may have died before the ``prctl``). The signal fires
when the *thread* that forked dies; the fork runs on the event loop's thread, which lives
as long as the collector. A clean shutdown (`stop`) sends SIGTERM by PID, then SIGKILL past
the grace. Linux only, as the collector's deployment is.

An engine whose version is not Prometheus 2.x >= 2.42 is refused (logged, not restarted):
starting the same binary again would not change its version.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import aiohttp
import structlog

from config.query_settings import PromqlSettings

from ..auth import EngineReadToken
from .engine_check import (
    EngineCheckFailed,
    EngineEndpoint,
    EngineRefused,
    basic_authorization,
    fetch_buildinfo,
    is_ready,
)
from .engine_config import (
    ENGINE_USER,
    EngineFiles,
    engine_flags,
    private_directory,
    write_engine_config,
    write_private_file,
)

log = structlog.get_logger("collector.promql.engine")

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
HEALTHY_S = 60.0
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0
PR_SET_PDEATHSIG = 1


def backoff_delay(failures: int, rng: random.Random) -> float:
    """1 s, 2 s, 4 s ... 60 s, each stretched by up to a quarter at random and capped at
    60 s, so that collectors restarted together do not restart their engines in step."""
    base = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** min(failures, 16))
    return min(BACKOFF_MAX_S, base * rng.uniform(1.0, 1.25))


class Engine(Protocol):
    """What the forward (`collector.promql.forward`) needs of an engine."""

    def current(self) -> EngineEndpoint | None:
        """The ready engine, or None (down, starting, refused)."""
        ...

    @property
    def down_reason(self) -> str: ...

    async def start(self, read_url: str) -> None: ...

    async def stop(self) -> None: ...


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the collector died before the prctl
            os._exit(1)

    return preexec


def _free_loopback_port() -> int:
    # Another process may take the port before the engine binds it: the engine then
    # exits and the next start picks another port.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _wait_exit(process: subprocess.Popen[bytes]) -> int:
    """Wait for the child without a thread: its pidfd becomes readable when it exits."""
    loop = asyncio.get_running_loop()
    fd = os.pidfd_open(process.pid)
    exited: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(fd, on_exit)
    try:
        if process.poll() is None:
            await exited
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return process.wait()


class SupervisedEngine:
    """``query.promql.prometheus``: the collector runs the engine as its child."""

    def __init__(
        self,
        *,
        binary: Path,
        settings: PromqlSettings,
        max_concurrency: int,
        read_token: EngineReadToken,
        rng: random.Random | None = None,
        memory_limit_bytes: int | None = None,
    ) -> None:
        self.binary = binary
        self.memory_limit_bytes = memory_limit_bytes  # GOMEMLIMIT (None: Go's default)
        self.settings = settings
        self.max_concurrency = max_concurrency
        self._read_token = read_token
        self._rng = rng or random.Random()
        self._endpoint: EngineEndpoint | None = None
        self._down_reason = "the PromQL engine is starting"
        self._process: subprocess.Popen[bytes] | None = None
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Task[bool] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._own_dir = settings.credentials_dir is None
        self._dir: Path | None = None
        self.starts = 0

    def current(self) -> EngineEndpoint | None:
        return self._endpoint

    @property
    def down_reason(self) -> str:
        return self._down_reason

    @property
    def directory(self) -> Path | None:
        """Where this engine's configuration, credentials and TSDB directories are."""
        return self._dir

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    async def start(self, read_url: str) -> None:
        """Begin supervising; the engine reads from ``read_url`` (this collector's
        ``/api/v1/read``). Returns at once; `current()` says when the engine is ready."""
        base = self.settings.credentials_dir
        self._dir = private_directory(
            base if base is not None else Path(tempfile.mkdtemp(prefix="lm-promql-"))
        )
        write_private_file(EngineFiles(self._dir).read_token_file, self._read_token.token + "\n")
        self._session = aiohttp.ClientSession()
        self._task = asyncio.create_task(self._supervise(read_url), name="promql-engine")

    async def wait_ready(self, timeout_s: float) -> EngineEndpoint:
        """The ready engine, waiting up to ``timeout_s`` (tests, start-up logs)."""
        deadline = time.monotonic() + timeout_s
        while (endpoint := self._endpoint) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the PromQL engine is not ready: {self._down_reason}")
            await asyncio.sleep(0.02)  # polling a flag, bounded by the deadline
        return endpoint

    async def _supervise(self, read_url: str) -> None:
        failures = 0
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                await self._run_once(read_url)
            except EngineRefused as exc:
                self._down_reason = str(exc)
                log.error("promql_engine_refused", reason=str(exc))
                return  # the same binary would have the same version
            except EngineCheckFailed as exc:
                self._down_reason = str(exc)
            except OSError as exc:  # the binary could not be started
                self._down_reason = f"the PromQL engine could not start: {exc}"
            if self._stopping.is_set():
                return
            if time.monotonic() - started >= HEALTHY_S:
                failures = 0
            delay = backoff_delay(failures, self._rng)
            failures += 1
            log.warning("promql_engine_restarting", reason=self._down_reason, delay_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def _run_once(self, read_url: str) -> None:
        assert self._dir is not None and self._session is not None
        self.starts += 1
        port = _free_loopback_port()
        tsdb = self._dir / f"tsdb-{os.getpid()}-{self.starts}"
        shutil.rmtree(tsdb, ignore_errors=True)
        files, password = write_engine_config(self._dir, read_url=read_url, settings=self.settings)
        flags = engine_flags(
            files,
            self.settings,
            max_concurrency=self.max_concurrency,
            listen=f"127.0.0.1:{port}",
            tsdb_path=tsdb,
        )
        # Forked here, on the event loop's thread, so PR_SET_PDEATHSIG lasts as long as the
        # collector (a fork is a few ms, once per engine start).
        self._process = process = subprocess.Popen(  # noqa: ASYNC220
            [str(self.binary), *flags],
            stdin=subprocess.DEVNULL,
            env=self._environment(),
            preexec_fn=_die_with_parent(os.getpid()),
            close_fds=True,
        )
        base_url = f"http://127.0.0.1:{port}"
        authorization = basic_authorization(ENGINE_USER, password)
        exit_task = asyncio.create_task(_wait_exit(process))
        try:
            await self._until_ready(base_url, authorization, exit_task)
            buildinfo = await fetch_buildinfo(self._session, base_url, authorization)
            self._endpoint = EngineEndpoint(base_url, authorization, buildinfo)
            log.info(
                "promql_engine_ready", url=base_url, pid=process.pid, version=self._endpoint.version
            )
            await asyncio.wait({exit_task, self._stop_wait()}, return_when=asyncio.FIRST_COMPLETED)
            if exit_task.done():
                code = exit_task.result()
                self._down_reason = f"the PromQL engine exited with {code}"
                log.warning("promql_engine_exited", pid=process.pid, returncode=code)
        finally:
            self._endpoint = None
            if process.poll() is None:
                await self._end(process, exit_task)
            shutil.rmtree(tsdb, ignore_errors=True)

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("GOMEMLIMIT", None)  # the setting decides, not the collector's environment
        if self.memory_limit_bytes:
            env["GOMEMLIMIT"] = str(self.memory_limit_bytes)  # bytes
        return env

    def _stop_wait(self) -> asyncio.Task[bool]:
        if self._stop_task is None:
            self._stop_task = asyncio.create_task(self._stopping.wait())
        return self._stop_task

    async def _until_ready(
        self, base_url: str, authorization: str, exit_task: asyncio.Task[int]
    ) -> None:
        assert self._session is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        pause = 0.02
        while not await is_ready(self._session, base_url, authorization):
            if self._stopping.is_set():
                raise EngineCheckFailed("the PromQL engine is stopping")
            if exit_task.done():
                raise EngineCheckFailed(
                    f"the PromQL engine exited with {exit_task.result()} before it was ready"
                )
            if time.monotonic() > deadline:
                raise EngineCheckFailed(f"the PromQL engine was not ready in {READY_TIMEOUT_S} s")
            # Bounded by the deadline; the pause grows so a slow start costs few probes.
            await asyncio.wait(
                {exit_task, self._stop_wait()}, timeout=pause * self._rng.uniform(1.0, 1.5)
            )
            pause = min(0.5, pause * 2)

    async def _end(self, process: subprocess.Popen[bytes], exit_task: asyncio.Task[int]) -> None:
        """SIGTERM by PID, SIGKILL past `STOP_GRACE_S`."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        done, _ = await asyncio.wait({exit_task}, timeout=STOP_GRACE_S)
        if not done:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
        await exit_task

    async def stop(self) -> None:
        """End the engine (by PID) and the supervision; remove what this start wrote."""
        self._stopping.set()
        if self._task is not None:
            await self._task  # _run_once's finally ends the child
        if self._session is not None:
            await self._session.close()
        if self._dir is not None:
            if self._own_dir:
                shutil.rmtree(self._dir, ignore_errors=True)
            else:
                EngineFiles(self._dir).read_token_file.unlink(missing_ok=True)
        self._down_reason = "the PromQL engine is stopped"
