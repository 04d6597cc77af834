"""The documented spark-submit command runs the same job (once: it starts its own JVM)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollup.read.verify import verify
from rollup.table.commit import load_latest
from store.fs import FileSystemStore
from tests.rollup.conftest import (
    DATA_START_NS,
    accept,
    assert_rollup_equal,
    committed_rollup,
    expected_rollup,
    make_frame,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_spark_submit_runs_the_job(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path / "store")
    frames = [
        make_frame(
            [
                (DATA_START_NS + (b * 10 + i) * 10**9, "temp", float(i), {"room": str(b)})
                for i in range(10)
            ],
            seq_start=b * 10,
        )
        for b in range(3)
    ]
    asyncio.run(accept(store, frames))
    config = tmp_path / "rollup.toml"
    config.write_text(
        f'[store]\nurl = "file://{store.root}"\n\n[rollup]\nowner_lease_ttl_s = 60.0\n\n'
        '[logging]\nformat = "json"\n'
    )
    scratch = tmp_path / "spark"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LM_")}
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=str(REPO_ROOT),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(scratch),
    )
    spark_submit = Path(sys.executable).parent / "spark-submit"
    completed = subprocess.run(
        [
            str(spark_submit),
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            "--driver-java-options",
            f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData",
            "rollup/job/spark_entry.py",
            "--config",
            str(config),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert '"outcome": "committed"' in completed.stdout

    latest = asyncio.run(load_latest(store))
    assert latest is not None and latest.snapshot.version == 1
    assert_rollup_equal(asyncio.run(committed_rollup(store)), expected_rollup(frames))
    assert asyncio.run(verify(store)).ok
