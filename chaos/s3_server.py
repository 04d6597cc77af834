"""The S3 server of a chaos run: MiniStack as a child process on 127.0.0.1.

A slimmer sibling of ``tests/s3_servers.py`` (which the ``lm-chaos`` console script
cannot import: ``tests`` is not an installed package). Settings follow DESIGN.md's field
notes: bind 127.0.0.1, S3 only, state and temp files under the run's directory,
persistence on, so a restart (the outage scenario) keeps every object. MiniStack forgets
a bucket that holds no object on restart: `MiniStack.restart` re-creates it.

Stopped by its PID: SIGTERM, then SIGKILL past a deadline. On Linux the server also gets
SIGTERM when the thread that started it dies, so a crashed run leaves none behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import botocore.config
import botocore.exceptions
import botocore.session

CREDENTIALS = ("lightmetrics-chaos", "lightmetrics-chaos-secret")
REGION = "us-east-1"
_AWS_ENV_REMOVED = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN")


class ServerError(RuntimeError):
    """MiniStack did not start (the message quotes its log's tail)."""


def aws_env() -> dict[str, str]:
    """Dummy credentials for every process of a run; never a real profile or metadata."""
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


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _AWS_ENV_REMOVED}
    env = {k: v for k, v in env.items() if not k.startswith("LM_")}
    env.update(aws_env())
    env.update(extra or {})
    return env


class MiniStack:
    """One MiniStack process; `endpoint_url` is where clients (or the proxy) connect."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.log_path = self.data_dir / "ministack.log"
        self.port = 0
        self.buckets: set[str] = set()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout_s: float = 60.0) -> None:
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError(f"MiniStack already running (pid {self.pid})")
        if not self.port:
            self.port = _free_port()
        (self.data_dir / "s3").mkdir(parents=True, exist_ok=True)
        (self.data_dir / "tmp").mkdir(parents=True, exist_ok=True)
        env = child_env(
            {
                "BIND_HOST": "127.0.0.1",
                "GATEWAY_PORT": str(self.port),
                "SERVICES": "s3",
                "LOG_LEVEL": "WARNING",
                "TMPDIR": str(self.data_dir / "tmp"),
                "S3_PERSIST": "1",
                "S3_DATA_DIR": str(self.data_dir / "s3"),
            }
        )
        tie = (
            _die_with_parent_hook()
            if threading.current_thread() is threading.main_thread()
            else None
        )
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "ministack")],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                preexec_fn=tie,
            )
        self._wait_ready(timeout_s)
        for bucket in sorted(self.buckets):
            self.create_bucket(bucket)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM this PID, wait, then SIGKILL. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)

    def restart(self) -> None:
        """Stop and start on the same port and data; buckets are re-created."""
        self.stop()
        self.start()

    def create_bucket(self, name: str) -> None:
        """Create ``name`` (us-east-1; creating a bucket we own again is fine)."""
        client: Any = botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint_url,
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
            if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise
        finally:
            client.close()
        self.buckets.add(name)

    def _wait_ready(self, timeout_s: float) -> None:
        assert self._proc is not None
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServerError(f"MiniStack exited ({self._proc.returncode}):\n{self._tail()}")
            try:
                with opener.open(self.endpoint_url + "/_ministack/health", timeout=1.0) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)  # polling for readiness, bounded by the deadline
        self.stop()
        raise ServerError(f"MiniStack not ready after {timeout_s:.0f}s:\n{self._tail()}")

    def _tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent_hook() -> Any:
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return hook
