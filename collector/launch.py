"""Start `lm-collector serve` as a child process and wait until it listens.

Used by the demo, benchmarks and chaos runs (and tests), which need real collector
processes. The child is stopped by its PID: SIGTERM, then SIGKILL past a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


class LaunchError(RuntimeError):
    """The collector exited or did not listen in time; the message has its log's tail."""


@dataclass
class CollectorProcess:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    ready_file: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL. Returns the exit code."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                return self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
        return self.process.wait()

    def kill(self) -> None:
        """SIGKILL now (a crash, for tests and chaos)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()


def start_collector(
    *,
    work_dir: Path,
    name: str,
    env: dict[str, str],
    args: tuple[str, ...] = (),
    config: Path | None = None,
    timeout_s: float = 30.0,
) -> CollectorProcess:
    """Start a collector with ``env`` (``LM_*`` settings) on top of this process's env.

    ``LM_HTTP__PORT`` defaults to 0 (an ephemeral port, read back from the ready file).
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    ready_file = work_dir / f"{name}.ready.json"
    ready_file.unlink(missing_ok=True)
    log_path = work_dir / f"{name}.log"
    child_env = {**os.environ, "LM_HTTP__PORT": "0", "LM_LOGGING__FORMAT": "json", **env}
    command = [sys.executable, "-m", "collector"]
    if config is not None:
        command += ["--config", str(config)]
    command += ["serve", "--ready-file", str(ready_file), *args]
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=child_env)
    # With --workers N each worker writes "<ready file>.<index>"; the first one tells the port.
    watched = ready_file.with_name(f"{ready_file.name}.0") if _workers(args) > 1 else ready_file
    deadline = time.monotonic() + timeout_s
    while not watched.exists():
        if process.poll() is not None:
            raise LaunchError(
                f"collector {name} exited with {process.returncode}:\n{_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            raise LaunchError(
                f"collector {name} did not listen within {timeout_s}s:\n{_tail(log_path)}"
            )
        time.sleep(0.05)  # polling for readiness, bounded by the deadline above
    info = json.loads(watched.read_text())
    return CollectorProcess(
        process, f"http://{info['host']}:{info['port']}", log_path, ready_file, env
    )


def _workers(args: tuple[str, ...]) -> int:
    for index, arg in enumerate(args):
        if arg == "--workers" and index + 1 < len(args):
            return int(args[index + 1])
        if arg.startswith("--workers="):
            return int(arg.split("=", 1)[1])
    return 1


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
