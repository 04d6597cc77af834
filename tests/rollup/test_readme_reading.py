"""The "Reading the data" examples (docs/reading.md) run as written (DuckDB over the published
Iceberg table, pyiceberg with time travel, Spark over the snapshot's file list, and the
``lm-rollup sql`` commands) and agree with ``lm-rollup query``."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from protocol import keys
from rollup.__main__ import main
from rollup.iceberg.publish import table_url
from tests.rollup.test_iceberg import Dataset, canonical

README = Path(__file__).resolve().parents[2] / "docs" / "reading.md"


def section() -> str:
    return README.read_text()


def snippet(defines: str) -> dict[str, Any]:
    """Execute the section's python block that defines ``defines``; its namespace."""
    blocks = re.findall(r"```python\n(.*?)```", section(), flags=re.S)
    [code] = [block for block in blocks if f"def {defines}(" in block]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


@pytest.fixture(autouse=True)
def _keep_test_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rollup.__main__.configure_logging", lambda *_a, **_k: None)


@pytest.fixture
async def dataset(tmp_path: Path) -> Dataset:
    built = Dataset(tmp_path / "store")
    await built.build()
    await built.publish()
    return built


async def test_duckdb_and_pyiceberg_examples(dataset: Dataset) -> None:
    per_metric = snippet("duckdb_iceberg")["duckdb_iceberg"](table_url(dataset.url, "points"))
    assert per_metric == [("cpu", 5), ("mem", 10)]
    rows = snippet("pyiceberg_rows")["pyiceberg_rows"]
    metadata = str(dataset.root / keys.rollup_iceberg_metadata_key("points", 2))
    assert canonical(rows(metadata)) == await dataset.query("points")
    await dataset.commit(remove=[dataset.versions[1].snapshot.data_files("points")[0].path])
    await dataset.publish()
    newest = str(dataset.root / keys.rollup_iceberg_metadata_key("points", 3))
    assert canonical(rows(newest)) == await dataset.query("points")  # mem only now
    assert canonical(rows(newest, 2)) == await dataset.query("points", 2)


async def test_spark_example_reads_exactly_the_snapshot(
    spark: SparkSession, dataset: Dataset
) -> None:
    frame = snippet("spark_points")["spark_points"](spark, str(dataset.root))
    ours = await dataset.query("points")
    assert sorted(r["seq"] for r in frame.select("seq").collect()) == sorted(r["seq"] for r in ours)
    files = snippet("snapshot_files")["snapshot_files"](str(dataset.root), "points")
    assert len(files) == len(dataset.versions[-1].snapshot.data_files("points"))


def test_sql_commands(dataset: Dataset, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "lm.toml"
    config.write_text(f'[store]\nurl = "{dataset.url}"\n')
    commands = [
        shlex.split(line)[1:]
        for line in section().splitlines()
        if line.startswith(".venv/bin/lm-rollup ")
    ]
    assert len(commands) == 3
    outputs = []
    for argv in commands:
        code = main(["--config", str(config), *argv])
        out, err = capsys.readouterr()
        assert code == 0, (argv, err)
        outputs.append(out)
    assert outputs[0].split("\n")[1].split()[:2] == ["cpu", "5"]
    assert outputs[1].splitlines()[0].startswith("window_start,series")
