"""The README's first command, end to end: lm-demo in a fresh directory passes its own checks."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from agent.truth import Totals
from demo import rollup_step
from tests.prometheus_binary import require_prometheus


def test_demo_runs_clean_in_a_fresh_directory(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "demo",
            "--dir",
            str(work),
            "--agents",
            "3",
            "--batches",
            "10",
            "--points-per-batch",
            "50",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "All checks passed" in done.stdout
    assert "answer: 409 identity_conflict" in done.stdout
    assert "1 deleted" in done.stdout  # the orphan was collected
    assert "records the log had lost" in done.stdout  # the audit mended the lost segment
    assert "lm-reconciler status: 0 log segments waiting" in done.stdout
    assert "; 0 problems" in done.stdout
    assert "catalog files (written by the reconciler)" in done.stdout
    # The rollup step: committed, totals checked against the acknowledged points, verified.
    assert "committed version 1: 30 batches, 1500 points" in done.stdout
    assert "rollup_1m totals equal what the agents sent" in done.stdout
    assert "complete (30 batches, 1500 records)" in done.stdout
    # Reading with SQL, then deleting one series: gone from the query, verify still passes.
    assert "lm-rollup sql" in done.stdout and "GROUP BY metric" in done.stdout
    assert "rows would be masked" in done.stdout
    assert "0 rows: the series is gone" in done.stdout
    assert "deleted" in done.stdout and "committed as version 2" in done.stdout
    assert "version 2:" in done.stdout and "complete" in done.stdout
    # The live query step: one /v1/query answer, the latest snapshot (2, after the delete) plus the new batch, with its flag.
    assert "GET /v1/query?metric=memory_used_bytes" in done.stdout
    assert "complete: false  snapshot_version: 2" in done.stdout
    assert "live points from 1 batch(es) not yet in it" in done.stdout
    # PromQL through the collector's engine counts what was acknowledged (PROTOCOL §5).
    require_prometheus()
    assert "GET /api/v1/query?query=sum(count_over_time(" in done.stdout
    assert "plus the live batch:" in done.stdout
    assert (work / "store" / "accepted" / "v1").is_dir()
    # The totals check is real: one point fewer acknowledged would be reported.
    problems = asyncio.run(
        rollup_step._check_totals(work / "store", Totals(30, 1499, 0.0), lambda _: None)
    )
    assert len(problems) == 2 and "1499" in problems[0]


def test_demo_refuses_a_directory_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    done = subprocess.run(
        [sys.executable, "-m", "demo", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "not empty" in done.stderr
