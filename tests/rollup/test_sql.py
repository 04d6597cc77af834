"""``lm-rollup sql``: DuckDB over exactly a committed snapshot's files, time travel on
``sql`` and ``query``, offline extension loading, and S3 through httpfs (MiniStack)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest

from chaos.s3_server import child_env
from protocol import keys
from protocol.clock import ManualClock
from rollup.__main__ import main
from rollup.read import sql
from rollup.table.owner import OwnerLease
from rollup.table.schemas import POINTS_SCHEMA, ROLLUP_1M_SCHEMA
from store.base import ObjectStore
from store.fs import FileSystemStore
from store.open import open_store
from tests.rollup.dataset_builder import commit_rows, hour_at, parquet_bytes, points
from tests.s3_servers import RunningServer

V1_AT = "2026-11-21T13:00:00Z"  # created_at of version 1 (the ManualClock below)
V2_AT = "2026-11-21T13:01:00Z"


@dataclass
class Built:
    config: Path
    orphan_key: str
    replaced_key: str


async def build(store: ObjectStore) -> tuple[str, str]:
    """v1: cpu (hour 0, 10 rows, labelled) and mem (hour 1, 10 rows); v2 (one minute
    later) replaces the cpu file with 5 rows; then an orphan file that no commit names
    (a failed run). Returns (orphan key, replaced key)."""
    clock = ManualClock(hour_at(3).start_ns)
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    v1 = await commit_rows(
        store,
        owner,
        clock,
        data=[
            ("points", hour_at(0), points(hour_at(0), 10, labels={"host": "a"})),
            ("points", hour_at(1), points(hour_at(1), 10, metric="mem", seq_start=10)),
        ],
    )
    replaced = v1.snapshot.data_files("points")[0].path
    clock.advance(60)
    await commit_rows(
        store,
        owner,
        clock,
        data=[("points", hour_at(0), points(hour_at(0), 5, value_start=100))],
        remove=[replaced],
    )
    orphan = keys.rollup_data_key("points", hour_at(0), str(uuid.uuid4()))
    await store.put(orphan, parquet_bytes(points(hour_at(0), 7, seq_start=500)))
    return orphan, replaced


def write_config(path: Path, url: str, endpoint: str | None = None) -> Path:
    lines = ["[store]", f'url = "{url}"']
    if endpoint is not None:
        lines.append(f'endpoint_url = "{endpoint}"')
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def fs_dataset(tmp_path: Path) -> Built:
    root = tmp_path / "store"
    orphan, replaced = asyncio.run(build(FileSystemStore(root)))
    return Built(write_config(tmp_path / "lm.toml", f"file://{root}"), orphan, replaced)


@pytest.fixture(autouse=True)
def _keep_test_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """`main` would point the root log handler at this test's captured stderr, which is
    closed once the test ends; the commands' logging is not what these tests check."""
    monkeypatch.setattr("rollup.__main__.configure_logging", lambda *_a, **_k: None)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_sql_sees_exactly_the_snapshot_files_and_agrees_with_query(
    fs_dataset: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(fs_dataset.config)
    code, out, err = run(
        capsys, "--config", config, "sql", "SELECT * FROM points ORDER BY seq", "--format", "csv"
    )
    assert code == 0, err
    assert f"snapshot: version 2 committed {V2_AT}" in err
    ours = csv_rows(out)
    code, out, _ = run(capsys, "--config", config, "query", "points", "--format", "csv")
    assert code == 0
    expected = sorted(csv_rows(out), key=lambda row: int(row["seq"]))
    assert ours == expected and len(ours) == 15  # not the orphan's 7, not the replaced 10
    assert [r["value"] for r in ours[:5]] == ["100.0", "101.0", "102.0", "103.0", "104.0"]
    # A glob over the table directory reads the orphan and the replaced file too.
    root = fs_dataset.config.parent / "store"
    globbed = duckdb.sql(
        f"SELECT count(*) FROM read_parquet('{root}/rollup/v1/tables/points/**/*.parquet', "
        "hive_partitioning = false)"
    ).fetchall()
    assert globbed == [(15 + 7 + 10,)]


def test_views_have_the_table_types_and_an_empty_table_is_a_typed_view(
    fs_dataset: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(fs_dataset.config)
    describe = "SELECT column_name, column_type FROM (DESCRIBE {})"
    code, out, err = run(
        capsys, "--config", config, "sql", describe.format("points"), "--format", "json"
    )
    assert code == 0, err
    assert json.loads(out) == [
        {"column_name": name, "column_type": sql.duckdb_type(POINTS_SCHEMA.field(name).type)}
        for name in POINTS_SCHEMA.names
    ]
    assert json.loads(out)[0] == {"column_name": "ts", "column_type": "TIMESTAMP WITH TIME ZONE"}
    assert json.loads(out)[2] == {"column_name": "labels", "column_type": "MAP(VARCHAR, VARCHAR)"}
    # rollup_1m has no files: a view with its columns and no rows, not an error.
    code, out, err = run(
        capsys, "--config", config, "sql", "SELECT * FROM rollup_1m", "--format", "csv"
    )
    assert code == 0, err
    assert out.splitlines() == [",".join(ROLLUP_1M_SCHEMA.names)]
    code, out, _ = run(
        capsys, "--config", config, "sql", describe.format("rollup_1m"), "--format", "json"
    )
    assert [c["column_name"] for c in json.loads(out)] == ROLLUP_1M_SCHEMA.names
    # Before the first commit every table is such a view.
    empty = write_config(tmp_path / "empty.toml", f"file://{tmp_path / 'nothing'}")
    code, out, err = run(capsys, "--config", str(empty), "sql", "SELECT count(*) AS n FROM points")
    assert (code, out.split()) == (0, ["n", "0"])
    assert "none committed yet" in err


@pytest.mark.parametrize("command", ["sql", "query"])
def test_version_and_as_of_pick_the_snapshot(
    fs_dataset: Built, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    config = str(fs_dataset.config)
    args = ["SELECT * FROM points"] if command == "sql" else ["points"]

    def rows(*flags: str) -> int:
        code, out, err = run(capsys, "--config", config, command, *args, "--format", "json", *flags)
        assert code == 0, err
        return len(json.loads(out))

    assert rows() == 15
    assert rows("--version", "1") == 20
    assert rows("--version", "2") == 15
    assert rows("--as-of", V1_AT) == 20  # at the commit's second
    assert rows("--as-of", "2026-11-21T13:00:59Z") == 20
    assert rows("--as-of", V2_AT) == 15
    assert rows("--as-of", "2026-11-21T15:00:00+02:00") == 20  # 13:00 UTC
    assert rows("--as-of", "2030-01-01") == 15
    code, _, err = run(
        capsys, "--config", config, command, *args, "--as-of", "2026-11-21T12:59:59Z"
    )
    assert code == 2
    assert "no snapshot was committed at or before 2026-11-21T12:59:59+00:00" in err
    assert "oldest committed is version 1" in err
    code, _, err = run(capsys, "--config", config, command, *args, "--version", "9")
    assert code == 2 and "version 9 does not exist (latest is 2)" in err
    with pytest.raises(SystemExit) as exited:
        main(["--config", config, command, *args, "--version", "1", "--as-of", V1_AT])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_bad_sql_is_a_clear_error_and_exit_2(
    fs_dataset: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(fs_dataset.config)
    for query, problem in [
        ("SELEC 1", "error: SQL: Parser Error: syntax error"),
        ("SELECT * FROM nope", "error: SQL: Catalog Error"),
        ("SELECT nope FROM points", "error: SQL: Binder Error"),
    ]:
        code, out, err = run(capsys, "--config", config, "sql", query)
        assert (code, out) == (2, ""), err
        assert problem in err and "Traceback" not in err
    # A file the snapshot lists that was deleted under it: an error, never skipped.
    root = fs_dataset.config.parent / "store"
    (root / fs_dataset.replaced_key).unlink()
    code, out, err = run(
        capsys, "--config", config, "sql", "SELECT count(*) FROM points", "--version", "1"
    )
    assert code == 2 and "Traceback" not in err
    assert "error: 1 data file(s) of version 1 are gone (first: rollup/v1/tables/" in err
    assert "read a newer version" in err


NETWORKLESS = ["unshare", "--net", "--"]


def networkless_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run([*NETWORKLESS, "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not networkless_available(), reason="unshare --net is not permitted here")
def test_extensions_load_from_the_wheels_with_no_network(fs_dataset: Built) -> None:
    """In a network namespace of its own (no interface but a down loopback), the CLI runs
    and every extension comes from its wheel; an S3 read fails on the network, not on a
    missing or downloaded extension."""
    script = (
        "import sys\n"
        "from rollup.read import sql\n"
        "from rollup.__main__ import main\n"
        f"code = main(['--config', {str(fs_dataset.config)!r}, 'sql', "
        '"SELECT extension_name FROM duckdb_extensions() WHERE loaded AND extension_name '
        "IN ('httpfs', 'avro', 'iceberg') ORDER BY 1\", '--format', 'csv'])\n"
        "assert code == 0, code\n"
        "c = sql.open_duckdb()\n"
        "sql.add_s3_secret(c, sql.S3Access('b', 'us-east-1', 'http://127.0.0.1:9', None))\n"
        'c.execute("SET http_retries = 0")\n'
        "try:\n"
        "    c.sql(\"SELECT * FROM read_parquet('s3://b/x.parquet')\").fetchall()\n"
        "except Exception as exc:\n"
        "    print('S3:', type(exc).__name__, exc)\n"
    )
    done = subprocess.run(
        [*NETWORKLESS, sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:4] == ["extension_name", "avro", "httpfs", "iceberg"], done.stdout
    s3_line = lines[4]
    assert s3_line.startswith("S3: IOException") or s3_line.startswith("S3: HTTPException"), s3_line
    assert "extension" not in s3_line.lower(), s3_line


@pytest.mark.s3
def test_sql_reads_s3_through_httpfs_with_the_store_settings(
    ministack_server: RunningServer,
    ministack_bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"s3://{ministack_bucket}/lm"
    endpoint = ministack_server.endpoint_url

    async def build_on_s3() -> None:
        store = open_store(url, endpoint_url=endpoint)
        try:
            await build(store)
        finally:
            await store.close()

    asyncio.run(build_on_s3())
    capsys.readouterr()  # the build's log lines
    config = str(write_config(tmp_path / "s3.toml", url, endpoint))
    code, out, err = run(
        capsys, "--config", config, "sql", "SELECT * FROM points ORDER BY seq", "--format", "csv"
    )
    assert code == 0, err
    ours = csv_rows(out)
    code, out, err = run(capsys, "--config", config, "query", "points", "--format", "csv")
    assert code == 0, err
    assert ours == sorted(csv_rows(out), key=lambda row: int(row["seq"])) and len(ours) == 15
    code, out, err = run(
        capsys, "--config", config, "sql", "SELECT count(*) AS n FROM points", "--as-of", V1_AT
    )
    assert (code, out.split()) == (0, ["n", "20"]), err
