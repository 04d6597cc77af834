"""CPU seconds of a process tree by what each process is (a Spark executor JVM, a Python
worker, the driver, ...), for telling where a Spark run's CPU went.

`CpuByRole` samples every ``interval_s``: it walks the descendants of a root PID and
keeps, per PID, the last utime+stime and role it read. At `stop` the per-PID values are
summed by role (from the command line, `role_of`; read at every sample, since a process
may exec into another). A process's CPU after its last sample is missed
(at most ``interval_s`` of it), as is a process that lived less than one interval.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

from bench._common import cpu_seconds

_ROLES = (
    ("CoarseGrainedExecutorBackend", "executor JVMs"),
    ("org.apache.spark.deploy.SparkSubmit", "driver JVM"),
    ("pyspark.daemon", "Python workers"),
    ("pyspark.worker", "Python workers"),
    ("spark_entry.py", "Python driver"),
    ("ministack", "MiniStack"),
    ("deploy.master.Master", "master + workers"),
    ("deploy.worker.Worker", "master + workers"),
)


def role_of(pid: int) -> str:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "gone"
    if not command.strip():  # a zombie has no command line left
        return "gone"
    return next((role for needle, role in _ROLES if needle in command), "other")


def descendants(pid: int) -> list[int]:
    found = [pid]
    for member in found:
        for task in Path(f"/proc/{member}/task").glob("*"):  # a JVM forks from many threads
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return found[1:]


class CpuByRole:
    """Start with `start`, read with `stop` (CPU seconds per role since `start`)."""

    def __init__(self, root: int, *, interval_s: float = 0.25) -> None:
        self._root, self._interval = root, interval_s
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._roles: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> CpuByRole:
        for pid in descendants(self._root):  # what already ran before `start` is not ours
            self._sample(pid, first=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        totals: dict[str, float] = defaultdict(float)
        for pid, last in self._last.items():
            totals[self._roles.get(pid, "gone")] += last - self._first.get(pid, 0.0)
        return {role: round(seconds, 1) for role, seconds in sorted(totals.items())}

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in descendants(self._root):
                self._sample(pid, first=False)
            time.sleep(self._interval)  # sampling period, bounded by `stop`

    def _sample(self, pid: int, *, first: bool) -> None:
        try:
            seconds = cpu_seconds(pid)
        except (OSError, ValueError, IndexError):
            return
        role = role_of(pid)  # every time: spark-submit is a shell script until it execs Java
        if role != "gone":
            self._roles[pid] = role
        if first:
            self._first[pid] = seconds
        self._last[pid] = seconds
