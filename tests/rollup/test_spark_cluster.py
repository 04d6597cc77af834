"""The rollup on a real Spark standalone cluster: a master and two workers (separate JVMs,
`tests.rollup.spark_cluster`), the project shipped to the executors as a built zip
through ``--py-files``, the store on MiniStack (S3 is all the executors share with the
driver).

How the test knows the executors run the zip and nothing else of this checkout: the
workers start with a clean environment in directories of their own; spark-submit runs
outside the repository with no ``PYTHONPATH`` and an entry file copied out of it; every
Python (driver and executors) is `python_without_the_project`, which cannot reach the
venv's editable install of this project; and the entry file (``cluster_probe_entry.py``)
has every executor report, before the job, the file each project module came from.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from rollup.__main__ import main as rollup_main
from rollup.job.pyfiles import build_pyfiles
from store.open import open_store
from tests.rollup.conftest import (
    DATA_START_NS,
    SentFrame,
    accept,
    assert_rollup_equal,
    committed_rollup,
    expected_rollup,
    make_frame,
)
from tests.rollup.spark_cluster import WORKER_CORES, StandaloneCluster, spark_submit
from tests.s3_servers import TEST_REGION, RunningServer

REPO_ROOT = Path(__file__).resolve().parents[2]
FRAMES_PER_AGENT = 4
POINTS_PER_FRAME = 300  # 3 agents x 4 frames: 3,600 points over two data hours


def test_the_cluster_registers_two_workers(spark_cluster: StandaloneCluster) -> None:
    state = spark_cluster.state()
    assert state["status"] == "ALIVE" and state["url"] == spark_cluster.master_url
    alive = [w for w in state["workers"] if w["state"] == "ALIVE"]
    assert len(alive) == 2 and state["aliveworkers"] == 2
    assert {w["host"] for w in alive} == {"127.0.0.1"}
    assert [w["cores"] for w in alive] == [WORKER_CORES] * 2
    assert [w["memory"] for w in alive] == [1024, 1024]
    # Three JVMs, each the leader of its own process group (stopped as one).
    pids = [d.process.pid for d in [spark_cluster.master, *spark_cluster.workers]]
    assert len(set(pids)) == 3
    assert all(os.getpgid(pid) == pid for pid in pids)


@pytest.mark.s3
@pytest.mark.slow  # ~30 s (CI deselects no marker: it runs in every full run)
def test_the_rollup_runs_on_the_cluster_from_the_built_zip(
    spark_cluster: StandaloneCluster,
    ministack_server: RunningServer,
    ministack_bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"s3://{ministack_bucket}/lm"
    endpoint = ministack_server.endpoint_url
    frames = [
        make_frame(
            [
                (DATA_START_NS + (i * 7 + b) * 6 * 10**9, metric, float(i * b), {"host": agent})
                for i in range(POINTS_PER_FRAME)
                for metric in ("cpu", "mem")
            ][:POINTS_PER_FRAME],
            agent_id=agent,
            seq_start=b * POINTS_PER_FRAME,
        )
        for agent in ("agent-a", "agent-b", "agent-c")
        for b in range(FRAMES_PER_AGENT)
    ]
    asyncio.run(_accept_on_s3(url, endpoint, frames))
    accepted_points = sum(sent.manifest.record_count for sent in frames)

    dist = tmp_path / "dist"
    built = build_pyfiles(dist)
    config = tmp_path / "rollup.toml"
    config.write_text(
        f'[store]\nurl = "{url}"\nendpoint_url = "{endpoint}"\nregion = "{TEST_REGION}"\n\n'
        '[rollup]\nowner_lease_ttl_s = 60.0\n\n[logging]\nformat = "json"\n'
    )
    entry = dist / "cluster_probe_entry.py"  # outside the repository, like the zip
    shutil.copyfile(Path(__file__).with_name("cluster_probe_entry.py"), entry)
    report_path = tmp_path / "probe.json"

    completed = spark_submit(
        spark_cluster.master_url,
        tmp_path,
        [
            *("--py-files", str(built.zip_path)),
            *(str(entry), str(report_path), "--config", str(config), "run"),
        ],
    )

    # spark-submit's Python runner sends the driver's stderr to stdout.
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    summary = _summary(completed.stdout)
    assert summary["outcome"] == "committed", summary
    assert summary["batches"] == len(frames) and summary["points"] == accepted_points

    # Exact totals: the committed rollup_1m is the one computed from the frames alone.
    got = asyncio.run(_committed_rollup_on_s3(url, endpoint))
    assert sum(row["count"] for row in got.values()) == accepted_points
    assert_rollup_equal(got, expected_rollup(frames))
    capsys.readouterr()
    assert rollup_main(["--config", str(config), "verify"]) == 0
    assert rollup_main(["--config", str(config), "verify", "--from-manifests"]) == 0
    assert "missing" not in capsys.readouterr().out

    # It ran on the cluster: one application, on both workers' executors...
    state = spark_cluster.state()
    assert [app["name"] for app in state["completedapps"]] == ["lm-rollup"]
    report = json.loads(report_path.read_text())
    executor_dirs = {Path(probe["cwd"]) for probe in report["executors"]}
    assert {_worker_of(d, spark_cluster) for d in executor_dirs} == set(spark_cluster.worker_dirs())
    # ...and every process imported the project from the zip it was shipped, nothing else.
    for probe in report["executors"]:
        shipped = Path(probe["cwd"]) / built.zip_path.name  # fetched from the driver
        assert all(f.startswith(f"{shipped}/") for f in probe["files"].values()), probe
        assert hashlib.sha256(shipped.read_bytes()).hexdigest() == built.sha256
        _assert_sees_no_source_tree(probe)
    driver = report["driver"]  # spark-submit's copy of the zip, in its userFiles directory
    assert all(f"/{built.zip_path.name}/" in f for f in driver["files"].values()), driver
    _assert_sees_no_source_tree(driver)


async def _accept_on_s3(url: str, endpoint: str, frames: list[SentFrame]) -> None:
    store = open_store(url, endpoint_url=endpoint)
    try:
        await accept(store, frames)
    finally:
        await store.close()


async def _committed_rollup_on_s3(url: str, endpoint: str) -> dict[Any, dict[str, Any]]:
    store = open_store(url, endpoint_url=endpoint)
    try:
        return await committed_rollup(store, endpoint)
    finally:
        await store.close()


def _summary(stdout: str) -> dict[str, Any]:
    """The run summary: the last indented JSON document (``{`` to ``}`` on lines of their
    own). spark-submit's Python runner merges the driver's stderr, log lines included,
    into its stdout."""
    lines = stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    end = lines.index("}", start)
    document: dict[str, Any] = json.loads("\n".join(lines[start : end + 1]))
    return document


def _worker_of(executor_dir: Path, cluster: StandaloneCluster) -> Path:
    """The worker work dir an executor ran in (``<work-dir>/<app-id>/<executor-id>``)."""
    work_dir = executor_dir.parents[1]
    assert work_dir in cluster.worker_dirs(), executor_dir
    return work_dir


def _assert_sees_no_source_tree(probe: dict[str, Any]) -> None:
    """No directory on the path holds the project's packages, no PYTHONPATH names the
    repository, and the editable install's finder is not loaded."""
    for entry in probe["sys_path"]:
        assert not (Path(entry) / "rollup" / "__init__.py").is_file(), (entry, probe)
    # The venv may live inside the checkout (a fresh clone's .venv): only entries that
    # are the repository itself or one of its package directories count.
    for entry in str(probe["pythonpath"]).split(":"):
        path = Path(entry) if entry else None
        if path is None or REPO_ROOT not in (path, *path.parents):
            continue
        assert (REPO_ROOT / ".venv") in (path, *path.parents), (entry, probe)
    assert not [f for f in probe["meta_path"] if "Editable" in f], probe
