"""A benchmark phase in a child process of its own, so its peak RSS is its own.

`run_child` starts ``python -m <module> --child ARGS`` and parses the JSON the child prints
last; a failing child ends the benchmark with its error. In the child, `measure` runs the
phase and adds what it cost (`status_bytes` reads ``/proc/self/status``: ``VmRSS`` after
the imports, ``VmHWM`` at the end); `above_imports` is that peak less the imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench._common import REPO_ROOT


def status_bytes(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field_name)


def reset_peak() -> None:
    """Start ``VmHWM`` afresh from the current RSS (Linux ``clear_refs``), so that what a
    phase's setup allocated and freed is not its peak."""
    Path("/proc/self/clear_refs").write_text("5")


def measure(phase: Callable[[], dict[str, object]]) -> dict[str, object]:
    """``phase()``'s result with ``seconds``, ``peak_rss`` (VmHWM after it) and
    ``base_rss`` (VmRSS before it: the interpreter and its imports)."""
    base_rss = status_bytes("VmRSS")
    started = time.perf_counter()
    result = phase()
    seconds = time.perf_counter() - started
    return {**result, "seconds": seconds, "peak_rss": status_bytes("VmHWM"), "base_rss": base_rss}


def above_imports(result: dict[str, object]) -> float:
    """A child's peak RSS less its RSS after the imports: what its phase needed."""
    return float(str(result["peak_rss"])) - float(str(result["base_rss"]))


def run_child(module: str, *args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", module, "--child", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    if out.returncode != 0:
        raise SystemExit(f"child {args[0]} failed ({out.returncode}):\n{out.stderr[-4000:]}")
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
