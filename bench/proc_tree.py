"""A process and its descendants (Spark's JVM, its Python workers) measured from ``/proc``:
their PIDs, resident memory and CPU seconds, and a sampler of the tree's peak RSS."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

from bench.proc_stats import CLOCK_TICKS, busy_cpu_seconds, rss_bytes


def tree_pids(pid: int) -> list[int]:
    found = [pid]
    for member in found:
        # A child is listed under the thread that forked it (the JVM forks from many).
        for task in Path(f"/proc/{member}/task").glob("*"):
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return found


def tree_rss(pid: int) -> int:
    try:
        return rss_bytes(pid)
    except (OSError, KeyError):  # gone, or a zombie
        return 0


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid``'s process tree, including children they reaped."""
    total = 0.0
    for member in tree_pids(pid):
        try:
            stat = Path(f"/proc/{member}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += sum(int(v) for v in fields[11:15]) / CLOCK_TICKS  # utime stime cutime cstime
    return total


class TreeMeter:
    """Wall seconds, the tree's CPU (less the sampler's: it measures, it is not the job),
    the cores the rest of the machine used, and the tree's new processes (Python workers
    forked afresh), from creation to `stop`."""

    def __init__(self, pid: int, sampler: PeakSampler) -> None:
        self._pid, self._sampler = pid, sampler
        self._members = set(tree_pids(pid))
        self._wall, self._busy = time.monotonic(), busy_cpu_seconds()
        self._ours, self._sampler_cpu = tree_cpu(pid), sampler.cpu_s

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self._wall
        ours = tree_cpu(self._pid) - self._ours
        others = max(0.0, busy_cpu_seconds() - self._busy - ours)
        sampler = self._sampler.cpu_s - self._sampler_cpu
        return {
            "wall": wall,
            "cpu_s": ours - sampler,
            "sampler_cpu_s": sampler,
            "others_cores": others / wall,
            "new_processes": len(set(tree_pids(self._pid)) - self._members),
        }


class PeakSampler:
    """Samples the summed RSS of a process tree (minus excluded children) every 100 ms;
    the tree (walking every JVM thread's children) is listed again once a second."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._excluded: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.peak = 0
        self.cpu_s = 0.0  # this thread's own CPU

    def exclude(self, pid: int) -> None:
        self._excluded.add(pid)

    def _run(self) -> None:
        started = time.thread_time()
        members: list[int] = []
        for tick in itertools.count():
            if self._stop.is_set():
                break
            if tick % 10 == 0:
                members = tree_pids(self._pid)
            self.peak = max(self.peak, sum(tree_rss(p) for p in members if p not in self._excluded))
            self.cpu_s = time.thread_time() - started
            time.sleep(0.1)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- report ---------------------------------------------------------------------------------
