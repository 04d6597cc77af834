"""Local S3 servers (MiniStack, moto) for chaos runs, tests and benchmarks.

They live here, in an installed package, because the ``lm-chaos`` console script needs
them and cannot import ``tests``; tests and benchmarks import them from here (through
``tests/s3_servers.py``). Settings follow DESIGN.md's field notes.

Each server is a child process listening on 127.0.0.1 on a free port, with its output
captured to a log file whose tail is quoted when it fails to start. `RunningServer.stop`
sends SIGTERM to that one PID, waits, and falls back to SIGKILL; `start` brings it back
on the same port (and, for MiniStack, the same data directory, objects kept). On Linux a
server started from the main thread also gets SIGTERM when its parent dies, so a crashed
run leaves none behind. MiniStack forgets a bucket that holds no object when it
restarts: `start` re-creates every bucket made through `RunningServer.create_bucket`
(a bucket made with the module's `create_bucket` is the caller's to re-create).

Nothing here reads real AWS credentials: buckets are created with the dummy
`CREDENTIALS`, and `dummy_aws_env()` is what a process of a run (or a test) should put in
its environment.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import botocore.config
import botocore.exceptions
import botocore.session

CREDENTIALS = ("lightmetrics-dummy", "lightmetrics-dummy-secret")
REGION = "us-east-1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0

# Variables that would make a process pick up something other than the dummy credentials.
AWS_ENV_TO_REMOVE = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN")

_PR_SET_PDEATHSIG = 1


def dummy_aws_env() -> dict[str, str]:
    """Dummy credentials, no profile, no metadata service: never a real account.

    Points the shared config/credentials files at nothing so a developer's real
    ``~/.aws`` is never read, and keeps loopback traffic away from any HTTP proxy.
    """
    return {
        "AWS_ACCESS_KEY_ID": CREDENTIALS[0],
        "AWS_SECRET_ACCESS_KEY": CREDENTIALS[1],
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def use_dummy_aws_credentials() -> None:
    """Make this process, and every child it starts after, use the dummy credentials
    only: the variables that would pick up anything else (`AWS_ENV_TO_REMOVE`) are
    removed and `dummy_aws_env` is set."""
    for name in AWS_ENV_TO_REMOVE:
        os.environ.pop(name, None)
    os.environ.update(dummy_aws_env())


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child: no AWS profile or session, no ``LM_*``
    settings of ours, the dummy credentials, then ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in AWS_ENV_TO_REMOVE and not k.startswith("LM_")
    }
    env.update(dummy_aws_env())
    env.update(extra or {})
    return env


class ServerStartError(RuntimeError):
    """A server exited or never became ready; the message quotes its log's tail."""

    def __init__(self, message: str, *, port_in_use: bool = False) -> None:
        super().__init__(message)
        self.port_in_use = port_in_use


class RunningServer:
    """One local S3 server process; `endpoint_url` is where clients connect."""

    def __init__(
        self,
        *,
        name: str,
        argv: Callable[[int], list[str]],
        env: Callable[[int], dict[str, str]],
        health_path: str,
        work_dir: Path,
        owns_work_dir: bool,
        data_dir: Path | None,
    ) -> None:
        self.name = name
        self.work_dir = work_dir
        self.data_dir = data_dir
        self.log_path = work_dir / f"{name}.log"
        self.port = 0
        self.buckets: set[str] = set()
        self._argv = argv
        self._env = env
        self._health_path = health_path
        self._owns_work_dir = owns_work_dir
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, *, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the server, wait until it answers its health check, and re-create the
        buckets made through `create_bucket`.

        The first start picks a free port (retrying with another one if the port was
        taken in the meantime); later starts reuse the same port and data directory.
        """
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.port:
            self._spawn_and_wait(timeout_s)
        else:
            self._start_on_a_free_port(timeout_s)
        for bucket in sorted(self.buckets):
            create_bucket(self.endpoint_url, bucket, exist_ok=True)

    def stop(self, *, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the server's PID, wait up to ``timeout_s``, then SIGKILL. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        if self._owns_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def restart(self, *, timeout_s: float = START_TIMEOUT_S) -> None:
        """Stop, then start again on the same port and data directory."""
        self.stop()
        self.start(timeout_s=timeout_s)

    def create_bucket(self, name: str) -> None:
        """Create ``name`` (creating one we own again is fine); `start` re-creates it."""
        create_bucket(self.endpoint_url, name, exist_ok=True)
        self.buckets.add(name)

    def log_tail(self, max_chars: int = 4000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return text[-max_chars:]

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<RunningServer {self.name} {self.endpoint_url} pid={self.pid}>"

    def _start_on_a_free_port(self, timeout_s: float) -> None:
        for attempt in range(3):
            self.port = _free_port()
            try:
                self._spawn_and_wait(timeout_s)
                return
            except ServerStartError as exc:
                # Another process may have bound the port between our probe and the
                # server's bind; only then is a different port worth a try.
                if attempt == 2 or not exc.port_in_use:
                    raise

    def _spawn_and_wait(self, timeout_s: float) -> None:
        # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so only a server
        # started from the main thread is tied to its parent's life (a restart from
        # `asyncio.to_thread` is not).
        tie_to_parent = threading.current_thread() is threading.main_thread()
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self._argv(self.port),
                env=self._env(self.port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
                preexec_fn=die_with_parent_hook() if tie_to_parent else None,
            )
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        assert self._proc is not None
        url = self.endpoint_url + self._health_path
        # Loopback only: never route the health probe through a configured proxy.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + timeout_s
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = self.log_tail()
                raise ServerStartError(
                    f"{self.name} exited with status {self._proc.returncode} before it was "
                    f"ready on {self.endpoint_url}; log tail:\n{tail}",
                    port_in_use="in use" in tail,
                )
            try:
                with opener.open(url, timeout=1.0) as answer:
                    if answer.status == 200:
                        return
                    last_error = f"HTTP {answer.status}"
            except (urllib.error.URLError, OSError) as exc:
                last_error = str(exc)
            # Polling for readiness, not sleeping to pass: bounded by the deadline.
            time.sleep(0.05)
        raise ServerStartError(
            f"{self.name} not ready on {url} after {timeout_s:.0f}s ({last_error}); "
            f"log tail:\n{self.log_tail()}"
        )


def start_ministack(data_dir: Path, *, timeout_s: float = START_TIMEOUT_S) -> RunningServer:
    """Start MiniStack (S3 only) with its state, temp files and log under ``data_dir``.

    Objects persist under ``data_dir / "s3"`` (S3_PERSIST=1), so `RunningServer.restart`
    brings back a server that still holds them.
    """
    data_dir = Path(data_dir)
    executable = Path(sys.executable).parent / "ministack"
    s3_dir = data_dir / "s3"
    tmp_dir = data_dir / "tmp"

    def env(port: int) -> dict[str, str]:
        s3_dir.mkdir(parents=True, exist_ok=True)
        tmp_dir.mkdir(parents=True, exist_ok=True)
        return child_env(
            {
                "BIND_HOST": "127.0.0.1",
                "GATEWAY_PORT": str(port),
                "SERVICES": "s3",
                "LOG_LEVEL": "WARNING",
                "TMPDIR": str(tmp_dir),
                "S3_PERSIST": "1",
                "S3_DATA_DIR": str(s3_dir),
            }
        )

    server = RunningServer(
        name="ministack",
        argv=lambda port: [str(executable)],
        env=env,
        health_path="/_ministack/health",
        work_dir=data_dir,
        owns_work_dir=False,
        data_dir=s3_dir,
    )
    server.start(timeout_s=timeout_s)
    return server


def start_moto(
    work_dir: Path | None = None, *, timeout_s: float = START_TIMEOUT_S
) -> RunningServer:
    """Start a moto server (in memory: a restart loses every object).

    Its log goes to ``work_dir``; without one, to a temporary directory removed on stop.
    """
    owns = work_dir is None
    if work_dir is None:
        work_dir = Path(tempfile.mkdtemp(prefix="lm-moto-"))
    server = RunningServer(
        name="moto",
        argv=lambda port: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=lambda port: child_env(),
        health_path="/moto-api/",
        work_dir=Path(work_dir),
        owns_work_dir=owns,
        data_dir=None,
    )
    server.start(timeout_s=timeout_s)
    return server


def unique_bucket_name(prefix: str = "lm-test") -> str:
    """A bucket name valid everywhere (3-63 chars, lowercase) and unique per call."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def create_bucket(endpoint_url: str, name: str, *, exist_ok: bool = False) -> None:
    """Create bucket ``name`` (us-east-1) on a local server, with the dummy credentials.

    MiniStack forgets a bucket that holds no object when it restarts (objects persist):
    call this again after a restart. In us-east-1 both MiniStack and moto (like AWS)
    answer 200 to re-creating a bucket you own; ``exist_ok=True`` also tolerates servers
    that answer BucketAlreadyOwnedByYou.
    """
    # botocore's stubs type every client as BaseClient, without the S3 operations.
    client: Any = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id=CREDENTIALS[0],
        aws_secret_access_key=CREDENTIALS[1],
        config=botocore.config.Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": 1},
            connect_timeout=5,
            read_timeout=30,
        ),
    )
    try:
        client.create_bucket(Bucket=name)
    except botocore.exceptions.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if not (exist_ok and code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists")):
            raise
    finally:
        client.close()


def fresh_bucket(server: RunningServer, prefix: str = "lm-test") -> str:
    """Create a new, uniquely named bucket on ``server`` and return its name (not
    re-created by a restart: tests that restart a server keep objects in it)."""
    name = unique_bucket_name(prefix)
    create_bucket(server.endpoint_url, name)
    return name


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def die_with_parent_hook() -> Callable[[], None] | None:
    """A pre-exec hook asking Linux to SIGTERM the child when its parent dies, so a
    crashed run leaves no server, collector or benchmark child behind. Linux ties it to
    the parent *thread*: call it from the thread that outlives the child (the main one).

    The function is looked up here, in the parent, so the forked child only calls it.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return hook
