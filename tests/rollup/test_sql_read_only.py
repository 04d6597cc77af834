"""``lm-rollup sql`` is read-only by default (issue 24 item 16): it holds the store's
credentials, which may write. Statements that write are refused before anything runs;
DuckDB itself opens nothing outside the rollup's tables and Iceberg metadata and its
settings are locked; ``--allow-writes`` is the explicit opt-in. On the fs store and on S3
through httpfs (MiniStack)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import duckdb
import pytest

from config.store_url import parse_store_url
from protocol import keys
from rollup.read import sql
from store.fs import FileSystemStore
from store.open import open_store
from tests.rollup.test_sql import Built, build, run, write_config
from tests.s3_servers import RunningServer


@pytest.fixture
def fs_dataset(tmp_path: Path) -> Built:
    """`tests.rollup.test_sql`'s dataset: v2 is 15 points rows."""
    root = tmp_path / "store"
    orphan, replaced = asyncio.run(build(FileSystemStore(root)))
    return Built(write_config(tmp_path / "lm.toml", f"file://{root}"), orphan, replaced)


@pytest.fixture(autouse=True)
def _keep_test_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in `tests.rollup.test_sql`: the commands' logging is not what is checked."""
    monkeypatch.setattr("rollup.__main__.configure_logging", lambda *_a, **_k: None)


def test_writes_are_refused_and_nothing_is_written(
    fs_dataset: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(fs_dataset.config)
    root = fs_dataset.config.parent / "store"
    outside = tmp_path / "out.csv"
    data_file = next((root / "rollup/v1/tables/points").rglob("*.parquet"))
    before = data_file.read_bytes()
    for statement in (
        f"COPY (SELECT 1 AS x) TO '{outside}'",
        # Over a data file of the dataset, where reads are allowed.
        f"COPY (SELECT * FROM points LIMIT 1) TO '{data_file}' (FORMAT parquet, USE_TMP_FILE false)",
        f"SELECT 1; COPY points TO '{outside}'",  # the first statement does not run either
        f"EXPORT DATABASE '{tmp_path / 'exported'}'",
        f"ATTACH '{tmp_path / 'new.db'}' AS other",
        "SET enable_external_access = true",
        "INSTALL httpfs",
        "CREATE TABLE t AS SELECT 1",
    ):
        code, out, err = run(capsys, "--config", config, "sql", statement)
        assert (code, out) == (2, ""), (statement, err)
        assert "error: SQL: read-only: a " in err and "--allow-writes" in err, err
        assert "Traceback" not in err
    assert not outside.exists() and not (tmp_path / "exported").exists()
    assert not (tmp_path / "new.db").exists()
    assert data_file.read_bytes() == before

    # Queries still work, including DESCRIBE/SHOW/SUMMARIZE and reading the tables'
    # directory (that is a read, if of more than the snapshot).
    for query in (
        "SELECT count(*) AS n FROM points",
        "WITH p AS (SELECT * FROM points) SELECT count(*) FROM p",
        "DESCRIBE points",
        "SUMMARIZE points",
        "EXPLAIN SELECT * FROM points",
        f"SELECT count(*) FROM read_parquet('{root}/rollup/v1/tables/points/**/*.parquet')",
    ):
        code, out, err = run(capsys, "--config", config, "sql", query)
        assert code == 0, (query, err)

    # Reading outside the dataset is refused by DuckDB itself.
    elsewhere = tmp_path / "elsewhere.csv"
    elsewhere.write_text("a\n1\n")
    code, _, err = run(capsys, "--config", config, "sql", f"SELECT * FROM read_csv('{elsewhere}')")
    assert code == 2 and "Permission Error" in err, err
    code, _, err = run(
        capsys, "--config", config, "sql", f"SELECT * FROM read_text('{root}/{keys.ROLLUP_POINTER_KEY}')"
    )  # fmt: skip
    assert code == 2 and "Permission Error" in err, err


def test_allow_writes_is_the_explicit_opt_in(
    fs_dataset: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "out.csv"
    code, _, err = run(
        capsys, "--config", str(fs_dataset.config), "sql", "--allow-writes",
        f"COPY (SELECT count(*) AS n FROM points) TO '{outside}'",
    )  # fmt: skip
    assert code == 0, err
    assert "warning: --allow-writes" in err
    assert outside.read_text().split() == ["n", "15"]


def test_the_engine_refuses_what_the_statement_check_would_miss(
    fs_dataset: Built, tmp_path: Path
) -> None:
    """`lock_read_only` alone: DuckDB refuses files outside the dataset, and its settings
    cannot be changed back."""
    location = parse_store_url(f"file://{fs_dataset.config.parent / 'store'}")
    connection = sql.open_duckdb(extensions=())
    try:
        sql.lock_read_only(connection, location)
        with pytest.raises(duckdb.PermissionException):
            connection.execute(f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'")
        for setting in ("enable_external_access = true", "allowed_directories = ['/']"):
            with pytest.raises(duckdb.InvalidInputException):
                connection.execute(f"SET {setting}")
    finally:
        connection.close()
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.s3
def test_no_write_through_httpfs(
    ministack_server: RunningServer,
    ministack_bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"s3://{ministack_bucket}/lm"
    endpoint = ministack_server.endpoint_url

    async def on_store(prefix: str | None) -> list[str]:
        """Build the dataset (None), or the keys under ``prefix``."""
        store = open_store(url, endpoint_url=endpoint)
        try:
            if prefix is None:
                await build(store)
                return []
            return [info.key async for info in store.list(prefix)]
        finally:
            await store.close()

    def keys_under(prefix: str) -> list[str]:
        return asyncio.run(on_store(prefix))

    asyncio.run(on_store(None))
    capsys.readouterr()
    config = str(write_config(tmp_path / "s3.toml", url, endpoint))
    target = f"s3://{ministack_bucket}/lm/rollup/v1/tables/points/written-by-sql.parquet"
    elsewhere = f"s3://{ministack_bucket}/lm/raw-blobs/v1/written-by-sql.parquet"
    for statement in (
        f"COPY (SELECT * FROM points) TO '{target}' (FORMAT parquet)",
        f"COPY (SELECT * FROM points) TO '{elsewhere}' (FORMAT parquet)",
    ):
        code, _, err = run(capsys, "--config", config, "sql", statement)
        assert code == 2 and "read-only" in err, err
    code, out, err = run(capsys, "--config", config, "sql", "SELECT count(*) AS n FROM points")
    assert (code, out.split()) == (0, ["n", "15"]), err  # reads still go through httpfs
    pointer = f"s3://{ministack_bucket}/lm/{keys.ROLLUP_POINTER_KEY}"  # exists, not data
    code, _, err = run(capsys, "--config", config, "sql", f"SELECT * FROM read_text('{pointer}')")
    assert code == 2 and "Permission Error" in err, err
    assert keys_under("raw-blobs/") == []
    assert not [k for k in keys_under("rollup/") if "written-by-sql" in k]

    code, _, err = run(
        capsys, "--config", config, "sql", "--allow-writes",
        f"COPY (SELECT * FROM points) TO '{target}' (FORMAT parquet)",
    )  # fmt: skip
    assert code == 0, err
    written = keys_under("rollup/v1/tables/points/written-by-sql")
    assert written == ["rollup/v1/tables/points/written-by-sql.parquet"]
