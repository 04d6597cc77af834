"""Real collectors accept a synthetic fleet (duplicates, identity conflicts) into an fs
store and log it to the index; ``lm-reconciler run --once`` catalogs it (steady pass
over the log; the first run's full audit finds nothing missing); ``lm-rollup run`` (the
CLI's run path, on the shared Spark session) includes it; the rollup_1m totals equal
what the agents' ground truth says was accepted, and ``lm-rollup verify`` passes, from
the catalog and from the manifests."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from agent.fleet import RunOptions, SpoolSettings, run_fleet
from agent.load import LoadSpec
from collector.launch import CollectorProcess, start_collector
from config import load_settings
from reconciler.__main__ import main as reconciler_main
from rollup.__main__ import main, run_command
from store.fs import FileSystemStore
from tests.rollup.conftest import read_table


@pytest.fixture
def collectors(tmp_path: Path) -> Iterator[list[CollectorProcess]]:
    env = {"LM_STORE__URL": f"file://{tmp_path / 'store'}"}
    started = [
        start_collector(
            work_dir=tmp_path / "logs",
            name=f"collector-{i}",
            env={**env, "LM_INGEST__COLLECTOR_ID": f"e2e-collector-{i}"},
        )
        for i in (1, 2)
    ]
    try:
        yield started
    finally:
        for process in started:
            process.stop()


def test_rollup_totals_equal_what_the_fleet_got_accepted(
    spark: SparkSession,
    tmp_path: Path,
    collectors: list[CollectorProcess],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = LoadSpec(
        agents=4,
        batches=6,
        points_per_batch=150,
        duplicate_rate=0.2,
        conflict_rate=0.15,
        seed=7,
        start_ns=time.time_ns() - 3 * 3600 * 10**9,  # data hours differ from accepted hours
    )
    fleet = run_fleet(
        urls=[c.url for c in collectors],
        token=None,
        spool=SpoolSettings(directory=tmp_path / "spool", fsync=False),
        spec=spec,
        options=RunOptions(max_rounds=2, round_delay_s=0.1),
    )
    result = asyncio.run(fleet)  # sync test: the CLI paths below run their own event loops
    for process in collectors:
        assert process.stop() == 0  # SIGTERM flushes the index log buffer
    truth = result.truth.totals()
    assert truth.batches == spec.total_batches and result.truth.conflicts_sent

    monkeypatch.setenv("LM_STORE__URL", f"file://{tmp_path / 'store'}")
    monkeypatch.setenv("LM_LOGGING__FORMAT", "json")
    capsys.readouterr()
    assert reconciler_main(["run", "--once"]) == 0
    reconciled = _pass_report(capsys.readouterr().out)
    assert reconciled["steady"]["rows_cataloged"] >= truth.batches  # and the quarantines
    assert reconciled["audit"]["status"] == "completed"
    assert reconciled["audit"]["cataloged"] == 0  # the log named every record
    settings = load_settings(None)
    assert run_command(spark, settings, progress=False) == 0
    summary = _summary(capsys.readouterr().out)
    assert summary["outcome"] == "committed"
    assert summary["batches"] == truth.batches and summary["points"] == truth.points

    rollup = asyncio.run(read_table(FileSystemStore(tmp_path / "store"), "rollup_1m"))
    assert sum(rollup["count"].to_pylist()) == truth.points
    assert math.isclose(
        math.fsum(v for v in rollup["sum"].to_pylist() if v is not None),
        truth.value_sum,
        rel_tol=1e-12,
    )
    assert main(["verify"]) == 0
    assert main(["verify", "--from-manifests"]) == 0
    assert "missing" not in capsys.readouterr().out

    # Once more: nothing left to do.
    assert run_command(spark, settings, progress=False) == 0
    assert _summary(capsys.readouterr().out)["outcome"] == "up-to-date"


def _pass_report(stdout: str) -> dict[str, Any]:
    """``lm-reconciler run --once``'s JSON document (the last line that holds one)."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{") and '"epoch"' in line:
            document: dict[str, Any] = json.loads(line)
            return document
    raise AssertionError(f"no pass report in {stdout[-2000:]!r}")


def _summary(stdout: str) -> dict[str, Any]:
    """The run summary: the JSON document that ends stdout (unconfigured structlog
    writes its lines to stdout in tests; the CLI sends them to stderr)."""
    start = 0 if stdout.startswith("{") else stdout.index("\n{\n") + 1
    document: dict[str, Any] = json.loads(stdout[start:])
    return document
