"""The demo's read-and-delete step, after the rollup: SQL, then deleting one series.

1. ``lm-rollup sql`` (DuckDB over exactly the committed snapshot) prints points per metric.
2. One series is deleted with ``lm-rollup delete`` (its metric and every label): first a
   ``--dry-run`` that says how many rows it would mask, then the commit (a tombstone:
   a few small writes, no data file touched).
3. ``lm-rollup query`` no longer returns the series, the ``rollup_1m`` totals dropped by
   exactly its points, and ``lm-rollup verify`` still proves every accepted batch was
   included once (deletes mask rows; they never change the ledger).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from demo.rollup_step import rollup_cli


def _json(done: subprocess.CompletedProcess[str], what: str, problems: list[str]) -> Any:
    if done.returncode != 0:
        problems.append(f"{what} exited with {done.returncode}: {done.stderr.strip()}")
        return None
    return json.loads(done.stdout)


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.rstrip().splitlines())


def run(store_dir: Path, start_ns: int, step: Callable[[str], None]) -> tuple[list[str], int]:
    """Run the step; return the problems found (empty when every check holds) and how
    many points the delete masked."""
    env = {**os.environ, "LM_STORE__URL": f"file://{store_dir}"}
    problems: list[str] = []
    per_metric = "SELECT metric, count(*) AS rows, sum(count) AS points FROM rollup_1m "
    per_metric += "GROUP BY metric ORDER BY metric"
    step(f'lm-rollup sql "{per_metric}"')
    done = rollup_cli(env, "sql", per_metric)
    print(_indent(done.stdout))
    if done.returncode != 0:
        return [f"lm-rollup sql exited with {done.returncode}: {done.stderr.strip()}"], 0

    pick = "SELECT series, metric, labels, sum(count) AS points FROM rollup_1m "
    pick += "GROUP BY ALL ORDER BY series LIMIT 1"
    chosen = _json(rollup_cli(env, "sql", pick, "--format", "json"), "lm-rollup sql", problems)
    if not chosen:
        return problems or ["the rollup has no series to delete"], 0
    series, metric, points = chosen[0]["series"], chosen[0]["metric"], chosen[0]["points"]
    labels = chosen[0]["labels"] or {}
    before = _total(env, problems)
    # The demo's points lie in the hours after start_ns: a day covers them all.
    to = datetime.fromtimestamp(start_ns / 1e9, tz=UTC) + timedelta(days=1)
    flags = ["--metric", metric]
    for name, value in sorted(labels.items()):
        flags += ["--label", f"{name}={value}"]
    flags += ["--to", to.isoformat().replace("+00:00", "Z")]
    flags += ["--reason", "lm-demo: delete one series"]
    step(f"lm-rollup delete {' '.join(flags[:-2])} --reason ... --dry-run  ({series})")
    dry = rollup_cli(env, "delete", *flags, "--dry-run", "--limit", "0")
    print(_indent(dry.stderr))
    if dry.returncode != 0:
        problems.append(f"lm-rollup delete --dry-run exited with {dry.returncode}")
    step("lm-rollup delete (commits a tombstone; every reader masks the rows)")
    deleted = _json(rollup_cli(env, "delete", *flags), "lm-rollup delete", problems)
    if deleted is None:
        return problems, 0
    print(f"    tombstone {deleted['tombstone']} committed as version {deleted['version']}")

    where = f"series = '{series}'"
    step(f"lm-rollup query rollup_1m --where '{where}'")
    rows = _json(
        rollup_cli(env, "query", "rollup_1m", "--where", where, "--format", "json"),
        "lm-rollup query",
        problems,
    )
    print(f"    {len(rows or [])} rows: the series is gone")
    if rows:
        problems.append(f"the deleted series {series} still returns {len(rows)} rows")
    after = _total(env, problems)
    print(f"    rollup_1m points: {before} before, {after} after, {points} deleted")
    if before is not None and after is not None and before - after != points:
        problems.append(f"rollup_1m lost {before - after} points; the series had {points}")
    verified = rollup_cli(env, "verify")
    print(_indent(verified.stderr))
    if verified.returncode != 0:
        problems.append(f"lm-rollup verify after the delete exited with {verified.returncode}")
    return problems, int(points)


def _total(env: dict[str, str], problems: list[str]) -> int | None:
    rows = _json(
        rollup_cli(env, "sql", "SELECT sum(count) AS points FROM rollup_1m", "--format", "json"),
        "lm-rollup sql",
        problems,
    )
    return int(rows[0]["points"]) if rows else None
