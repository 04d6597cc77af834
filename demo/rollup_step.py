"""The demo's rollup step: roll the accepted batches up, check the totals, verify, query.

1. ``lm-rollup run`` (a local Spark session) turns every accepted batch into the
   ``points`` and ``rollup_1m`` tables and commits them under the rollup pointer.
2. The ``rollup_1m`` totals (read back with `rollup.read.reader`, no Spark) must equal what
   the agents were acknowledged for: the number of points and the sum of their finite
   values. The deliberate conflict was quarantined, so it counts nowhere.
3. ``lm-rollup verify`` recomputes every hour's setsum from the reconciler's catalog
   (``index/v1/catalog/``) and must find every hour complete.
4. ``lm-rollup query rollup_1m`` prints a few rows: what a user of the data sees.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from agent.truth import Totals
from rollup.job.availability import INSTALL_HINT, why_job_unavailable
from rollup.read.reader import rollup_1m_totals
from rollup.table.storage import arrow_filesystem
from store.fs import FileSystemStore

RUN_TIMEOUT_S = 600.0  # a cold JVM on a busy 2-core machine takes tens of seconds
QUERY_ROWS = 8


def run(
    store_dir: Path, logs_dir: Path, acknowledged: Totals, step: Callable[[str], None]
) -> list[str]:
    """Run the step; return the problems found (empty when every check holds)."""
    reason = why_job_unavailable()
    if reason is not None:
        return [f"the rollup cannot run here: {reason}; {INSTALL_HINT}, or pass --no-rollup"]
    env = {**os.environ, "LM_STORE__URL": f"file://{store_dir}"}
    step("running the rollup (lm-rollup run: a local Spark session)")
    log_path = logs_dir / "rollup.log"
    with log_path.open("w") as log:
        done = subprocess.run(
            [sys.executable, "-m", "rollup", "run", "--no-progress"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        return [f"lm-rollup run exited with {done.returncode}; see {log_path}"]
    print(f"    {_describe_run(done.stdout)}")

    problems = asyncio.run(_check_totals(store_dir, acknowledged, step))
    step("lm-rollup verify (every hour's ledger setsum against the catalog)")
    verified = rollup_cli(env, "verify")
    print("\n".join(f"    {line}" for line in verified.stdout.strip().splitlines()[-6:]))
    if verified.returncode != 0:
        problems.append(
            f"lm-rollup verify exited with {verified.returncode}: {verified.stderr.strip()}"
        )
    step(f"lm-rollup query rollup_1m --limit {QUERY_ROWS}")
    query = rollup_cli(
        env,
        "query",
        "rollup_1m",
        "--columns",
        "window_start,metric,series,count,sum,min,max",
        "--limit",
        str(QUERY_ROWS),
    )
    print("\n".join(f"    {line}" for line in query.stdout.rstrip().splitlines()))
    if query.returncode != 0:
        problems.append(f"lm-rollup query exited with {query.returncode}: {query.stderr.strip()}")
    return problems


def _describe_run(stdout: str) -> str:
    """One line from ``lm-rollup run``'s JSON result."""
    try:
        result = json.loads(stdout)
        return (
            f"{result['outcome']} version {result['version']}: {result['batches']} batches, "
            f"{result['points']} points, {result['rollup_rows']} rollup_1m rows, "
            f"{result['files_added']} files, {sum(result['seconds'].values()):.1f} s"
        )
    except (ValueError, KeyError, TypeError):
        return stdout.strip()


def rollup_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollup", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


async def _check_totals(
    store_dir: Path, acknowledged: Totals, step: Callable[[str], None]
) -> list[str]:
    store = FileSystemStore(store_dir)
    try:
        filesystem, root = arrow_filesystem(f"file://{store_dir}")
        rolled_points, rolled_sum = await rollup_1m_totals(store, filesystem=filesystem, root=root)
    finally:
        await store.close()
    step(
        f"rollup_1m: {rolled_points} points, value sum {rolled_sum:.3f} "
        f"(acknowledged: {acknowledged.points} points, value sum {acknowledged.value_sum:.3f})"
    )
    problems = []
    if rolled_points != acknowledged.points:
        problems.append(
            f"rollup_1m counts {rolled_points} points; the agents were acknowledged for {acknowledged.points}"
        )
    if not math.isclose(rolled_sum, acknowledged.value_sum, rel_tol=1e-9, abs_tol=1e-6):
        problems.append(
            f"rollup_1m sums to {rolled_sum!r}; the acknowledged points sum to {acknowledged.value_sum!r}"
        )
    return problems
