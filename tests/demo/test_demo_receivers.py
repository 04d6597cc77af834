"""``lm-demo --receivers``: the demo also ingests Prometheus remote_write requests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_ingests_remote_write_once_and_answers_resends_as_duplicates(
    tmp_path: Path,
) -> None:
    work = tmp_path / "demo"
    argv = ["--dir", str(work), "--agents", "2", "--batches", "5", "--points-per-batch", "20"]
    done = subprocess.run(
        [sys.executable, "-m", "demo", *argv, "--receivers", "--no-rollup"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "remote_write answers: {'duplicate:duplicate': 8, 'original:accepted': 8}" in done.stdout
    # 10 agent batches + 8 remote_write batches, each with one manifest and its blob.
    assert "acknowledged: 18 batches" in done.stdout
    assert "All checks passed" in done.stdout
