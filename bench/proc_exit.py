"""CPU seconds of a child process over its whole life, read from /proc before it is reaped.

`bench._common.cpu_seconds` reads ``/proc/<pid>/stat`` (utime + stime of every thread of
the process): once the process has been reaped that file is gone. Between its exit and
the parent's ``wait`` the process is a zombie whose ``stat`` still holds the final totals
(threads that ended earlier included), so a benchmark waits for the exit with
``waitid(WNOWAIT)`` (which leaves the zombie in place), reads ``stat``, then reaps it.
Nothing is lost after the last sample, unlike polling a running process.

Also `uptime`: the load average line every result records (the machine is shared).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass

from bench._common import cpu_seconds

STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ExitedProcess:
    code: int
    cpu_s: float
    """utime + stime over the process's whole life (all its threads)."""
    seconds: float
    """Wall time from the call that waited (or stopped) it to its exit."""


def wait_exit_cpu(
    process: subprocess.Popen[bytes], timeout_s: float | None = None
) -> ExitedProcess:
    """Wait for ``process`` to exit (SIGKILL past ``timeout_s``), read its CPU from the
    zombie's ``/proc/<pid>/stat``, then reap it."""
    started = time.monotonic()
    deadline = None if timeout_s is None else started + timeout_s
    while True:
        # WNOHANG polling (bounded by the deadline): waitid without it cannot time out.
        found = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        if found is not None:
            break
        if deadline is not None and time.monotonic() > deadline:
            os.kill(process.pid, signal.SIGKILL)
            deadline = None
        time.sleep(0.01)
    seconds = time.monotonic() - started
    cpu = cpu_seconds(process.pid)
    code = process.wait()
    return ExitedProcess(code, cpu, seconds)


def stop_exit_cpu(
    process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S
) -> ExitedProcess:
    """SIGTERM ``process`` by its PID, then `wait_exit_cpu` (SIGKILL past ``timeout_s``)."""
    if process.returncode is not None:
        raise RuntimeError(f"process {process.pid} was reaped already: its CPU is gone")
    os.kill(process.pid, signal.SIGTERM)  # a zombie (exited, not reaped) ignores it
    return wait_exit_cpu(process, timeout_s)


def uptime() -> str:
    """The ``uptime`` line (load averages over 1, 5 and 15 minutes)."""
    try:
        return subprocess.run(
            ["uptime"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        one, five, fifteen = os.getloadavg()
        return f"load average: {one:.2f}, {five:.2f}, {fifteen:.2f}"
