"""What a benchmark reads about processes and the machine from ``/proc``: CPU seconds and
resident memory of a process, the machine's busy CPU (what other sessions take), listen
queue overflows, and waiting for a quiet machine before measuring."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (its own threads, not its children), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # Field 2 (comm) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of stat


def _status_kib(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise KeyError(f"{field_name} not in /proc/{pid}/status")


def peak_rss_bytes(pid: int) -> int:
    """VmHWM: the highest resident set size ``pid`` has had since it started."""
    return _status_kib(pid, "VmHWM") * 1024


def rss_bytes(pid: int) -> int:
    """VmRSS: the resident set size of ``pid`` now."""
    return _status_kib(pid, "VmRSS") * 1024


def rss_split_bytes(pid: int) -> tuple[int, int]:
    """(RssAnon, RssFile + RssShmem) of ``pid`` now: private heap vs. mapped files
    (shared libraries such as libarrow, whose pages other workers share)."""
    anon = _status_kib(pid, "RssAnon")
    shared = _status_kib(pid, "RssFile") + _status_kib(pid, "RssShmem")
    return anon * 1024, shared * 1024


def machine_cpu_seconds() -> tuple[float, float]:
    """(process time, interrupt time) all CPUs spent since boot, from /proc/stat: user +
    nice + system, which processes are charged with, and irq + softirq, which no process
    is (loopback network traffic, including our own, lands partly there)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = values[:7]
    return (user + nice + system) / CLOCK_TICKS, (irq + softirq) / CLOCK_TICKS


def busy_cpu_seconds() -> float:
    return sum(machine_cpu_seconds())


class CpuMeter:
    """CPU seconds each named process used between `start` and `stop`, plus ``others``:
    what the rest of the machine used meanwhile (other people's tests disturb a
    2-core benchmark; this says how much)."""

    def __init__(self, pids: Mapping[str, Sequence[int]]) -> None:
        self._pids = {role: list(ids) for role, ids in pids.items()}
        self._before: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        sample = {role: sum(cpu_seconds(pid) for pid in ids) for role, ids in self._pids.items()}
        sample["_processes"], sample["irq"] = machine_cpu_seconds()
        return sample

    def start(self) -> None:
        self._before = self._read()

    def stop(self) -> dict[str, float]:
        after = self._read()
        used = {role: after[role] - self._before[role] for role in after}
        processes = used.pop("_processes")
        ours = sum(v for role, v in used.items() if role != "irq")
        used["others"] = max(0.0, processes - ours)
        self.used = used
        return used


def listen_overflows() -> int:
    """Machine-wide count of connections dropped because a listening socket's accept
    queue was full (TcpExt ListenOverflows)."""
    header, values = (
        line.split() for line in Path("/proc/net/netstat").read_text().splitlines()[:2]
    )
    return int(dict(zip(header, values, strict=True))["ListenOverflows"])


def wait_for_quiet(*, max_wait_s: float, busy_cores: float = 0.25) -> float:
    """Wait (at most ``max_wait_s``) until the machine's busy CPU over one second is below
    ``busy_cores``; returns the last second's busy cores (what the phase starts with)."""
    deadline = time.monotonic() + max_wait_s
    while True:
        before = busy_cpu_seconds()
        time.sleep(1.0)  # one sampling interval of the load measurement
        busy = busy_cpu_seconds() - before
        if busy < busy_cores or time.monotonic() >= deadline:
            return busy
