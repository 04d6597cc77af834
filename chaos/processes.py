"""The chaos cluster's child processes: each in its own process group (Spark's JVM goes
with the rollup), stopped by PID or group — SIGTERM with a bounded grace, then SIGKILL —
and collectors launched directly or, with a clock skew, through `chaos.skewed_collector`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from collector.launch import CollectorProcess, LaunchError, start_collector


@dataclass
class ProcessInfo:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def spawn_python(
    logs: Path, name: str, args: list[str], env: dict[str, str], *, cwd: Path | None = None
) -> ProcessInfo:
    """``python args`` in its own process group (a Spark JVM it starts goes with it), its
    output appended to ``logs/<name>.log``."""
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    with log_path.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, *args],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ProcessInfo(name, process, log_path)


def terminate(info: ProcessInfo, timeout_s: float) -> int:
    process = info.process
    if process.poll() is None:
        signal_group(process, signal.SIGTERM)
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(process)
    return process.wait()


def launch_collector(logs: Path, name: str, env: dict[str, str], skew_s: float) -> CollectorProcess:
    if not skew_s:
        return start_collector(work_dir=logs, name=name, env=env)
    # The same launch as `collector.launch.start_collector`, through the skewing wrapper.
    logs.mkdir(parents=True, exist_ok=True)
    ready_file = logs / f"{name}.ready.json"
    ready_file.unlink(missing_ok=True)
    log_path = logs / f"{name}.log"
    child = {"LM_HTTP__PORT": "0", **env}
    command = [
        sys.executable,
        "-m",
        "chaos.skewed_collector",
        "serve",
        "--ready-file",
        str(ready_file),
    ]
    with log_path.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=child)
    deadline = time.monotonic() + 30.0
    while not ready_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            kill(process)
            tail = log_path.read_text(errors="replace")[-2000:]
            raise LaunchError(f"skewed collector {name} did not start:\n{tail}")
        time.sleep(0.05)  # polling for readiness, bounded by the deadline
    info = json.loads(ready_file.read_text())
    return CollectorProcess(
        process, f"http://{info['host']}:{info['port']}", log_path, ready_file, env
    )


def kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()


def signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(process.pid, signum)  # our child leads its own group (start_new_session)
    except ProcessLookupError:
        pass


def kill_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        signal_group(process, signal.SIGKILL)
    process.wait()
