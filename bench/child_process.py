"""A benchmark phase in a child process of its own, so its peak RSS is its own.

`run_child` starts ``python -m <module> --child ARGS`` and parses the JSON the child prints
last; a failing child ends the benchmark with its error. In the child, `status_bytes`
reads ``/proc/self/status`` (``VmRSS`` after the imports, ``VmHWM`` at the end).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench._common import REPO_ROOT


def status_bytes(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field_name)


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
