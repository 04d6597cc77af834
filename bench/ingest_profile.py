"""bench.ingest: one collector phase under a profiler (``--profile cprofile|py-spy``).

py-spy samples the worker from outside (``py-spy record --format raw``: collapsed stacks,
native frames off, idle samples dropped), so it costs the collector nearly nothing and
sees C extensions' Python callers; cProfile instruments every call and slows the worker
2-3x. Both print the top functions by own time and by inclusive time.
"""

from __future__ import annotations

import collections
import contextlib
import pstats
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bench.ingest_collector import collector_phase
from bench.ingest_phases import Bench


async def profile_collector(
    bench: Bench,
    store: str,
    latency_ms: float,
    concurrency: int,
    profiler: str,
    *,
    bundles: bool = False,
) -> str:
    """One collector phase under ``profiler`` (1 worker); returns the top functions.
    ``bundles``: the store's feature record says ``bundles: true``."""
    if profiler == "py-spy":
        out = bench.work_dir / "collector.pyspy.txt"
        phase = await collector_phase(
            bench,
            store,
            latency_ms,
            concurrency,
            around_window=lambda pids: _py_spy(pids, out),
            bundles=bundles,
        )
    else:
        out = bench.work_dir / "collector.prof"
        prefix = (sys.executable, "-m", "cProfile", "-o", str(out))
        phase = await collector_phase(
            bench, store, latency_ms, concurrency, command_prefix=prefix, bundles=bundles
        )
    head = (
        f"{profiler} of one collector worker{' (bundles on)' if bundles else ''}, "
        f"{store}/{latency_ms:g}ms/c{concurrency}: "
        f"{phase.batches} batches at {phase.batches_per_s:.0f}/s under the profiler, "
        f"{phase.cpu_per_1k('collector') or 0:.2f} collector CPU s per 1000 batches "
        f"(profile file: {out})"
    )
    if profiler == "py-spy":
        return head + "\n" + summarize_collapsed(out.read_text())
    stats = pstats.Stats(str(out))
    lines = [head]
    for sort in ("tottime", "cumulative"):
        stream = _StringStream()
        stats.stream = stream  # type: ignore[attr-defined]
        stats.sort_stats(sort).print_stats(25)
        lines.append(stream.text())
    return "\n".join(lines)


@contextlib.contextmanager
def _py_spy(pids: list[int], out: Path) -> Iterator[None]:
    """``py-spy record --pid`` on the first worker while the block runs; SIGINT makes it
    write its file (it is stopped by its PID, bounded waits)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    command = [spy, "record", "--pid", str(pids[0]), "--rate", "100", "--format", "raw"]
    process = subprocess.Popen(
        [*command, "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    time.sleep(0.5)  # py-spy attaches before the window opens (a fixed, small delay)
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def summarize_collapsed(text: str, top: int = 40) -> str:
    """Own and inclusive sample shares per function from py-spy's collapsed stacks
    (``frame;frame;... count`` per line; a frame is ``function (file:line)``)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_function(frame) for frame in stack.split(";")]
        own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    if not total:
        return "no samples"
    lines = [f"{total} samples; own time:"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in own.most_common(top)]
    lines.append("inclusive time:")
    lines += [f"  {n / total:6.1%}  {name}" for name, n in inclusive.most_common(top)]
    return "\n".join(lines)


def _function(frame: str) -> str:
    """``name (path/to/file.py:123)`` -> ``name (file.py)`` (lines merged)."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rpartition(":")[0]
    parts = Path(path).parts
    return f"{name} ({'/'.join(parts[-2:])})"


class _StringStream:
    def __init__(self) -> None:
        self._parts: list[str] = []

    def write(self, text: str) -> int:
        self._parts.append(text)
        return len(text)

    def text(self) -> str:
        return "".join(self._parts)
