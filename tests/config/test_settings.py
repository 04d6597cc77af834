"""Settings: defaults, TOML file, environment overlay, and what the errors say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from config import (
    FileLocation,
    HttpSettings,
    MemoryLocation,
    S3Location,
    Settings,
    SettingsError,
    StoreSettings,
    load_settings,
)


def write(tmp_path: Path, text: str, name: str = "lm.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_lines(exc: pytest.ExceptionInfo[SettingsError]) -> list[str]:
    return str(exc.value).splitlines()


# --- defaults -------------------------------------------------------------------------


def test_defaults_serve_loopback_over_local_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings(environ={})
    assert settings.http.host == "127.0.0.1"
    assert settings.http.port == 8080
    assert settings.http.binds_loopback_only
    assert settings.store.url == f"file://{tmp_path}/lm-data"
    assert settings.store.location == FileLocation(path=tmp_path / "lm-data")
    assert settings.store.region == "us-east-1"
    assert settings.auth.tokens_file is None
    assert settings.ingest.acceptance == "s3_manifest"
    assert settings.ingest.max_frame_bytes == 8388608
    assert settings.ingest.max_raw_bytes == 64 * 1024 * 1024
    assert settings.ingest.spool_dir == tmp_path / "lm-spool"
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:-]*-\d+", settings.ingest.collector_id)
    assert settings.gc.max_delete_fraction == 0.1
    assert settings.rollup.spark_master == "local[*,4]"
    assert settings.rollup.compression == "zstd"
    assert settings.logging.format == "auto"
    assert settings.logging.level == "info"


def test_no_arguments_reads_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LM_HTTP__PORT", "9123")
    assert load_settings().http.port == 9123


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.http.port = 1  # type: ignore[misc]


# --- TOML file and environment ----------------------------------------------------------


def test_toml_overrides_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [store]
        url = "s3://my-bucket/some/prefix/"
        endpoint_url = "http://127.0.0.1:9000"
        [http]
        host = "0.0.0.0"
        port = 9000
        [ingest]
        collector_id = "collector-7"
        acceptance = "local_spool"
        [gc]
        dry_run = true
        [logging]
        level = "DEBUG"
        """,
    )
    settings = load_settings(path, environ={})
    assert settings.store.url == "s3://my-bucket/some/prefix"
    assert settings.store.location == S3Location(bucket="my-bucket", prefix="some/prefix")
    assert settings.store.endpoint_url == "http://127.0.0.1:9000"
    assert settings.http.port == 9000
    assert not settings.http.binds_loopback_only
    assert settings.ingest.collector_id == "collector-7"
    assert settings.ingest.acceptance == "local_spool"
    assert settings.gc.dry_run is True
    assert settings.gc.enabled is True  # untouched keys keep their defaults
    assert settings.logging.level == "debug"


def test_environment_beats_toml(tmp_path: Path) -> None:
    path = write(tmp_path, '[http]\nport = 9000\nhost = "0.0.0.0"\n')
    environ = {
        "LM_HTTP__PORT": "9001",
        "LM_STORE__URL": "memory://t1",
        "LM_GC__DRY_RUN": "true",
        "LM_GC__MAX_DELETE_FRACTION": "0.25",
        "LM_LOGGING__FORMAT": "json",
        "LM_LICENSE_FILE": "/opt/flexlm",  # not ours: ignored
        "HOME": "/root",
    }
    settings = load_settings(path, environ=environ)
    assert settings.http.port == 9001
    assert settings.http.host == "0.0.0.0"
    assert settings.store.location == MemoryLocation(name="t1")
    assert settings.gc.dry_run is True
    assert settings.gc.max_delete_fraction == 0.25
    assert settings.logging.format == "json"


def test_empty_environment_value_unsets_optional_key(tmp_path: Path) -> None:
    path = write(tmp_path, '[store]\nendpoint_url = "http://s3.local:9000"\n')
    settings = load_settings(path, environ={"LM_STORE__ENDPOINT_URL": ""})
    assert settings.store.endpoint_url is None


def test_relative_paths_resolve_against_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write(
        tmp_path,
        '[store]\nurl = "file://data/../store"\n[auth]\ntokens_file = "etc/tokens.toml"\n'
        '[ingest]\nspool_dir = "spool"\n',
    )
    settings = load_settings(path, environ={})
    assert settings.store.url == f"file://{tmp_path}/store"
    assert settings.auth.tokens_file == tmp_path / "etc" / "tokens.toml"
    assert settings.ingest.spool_dir == tmp_path / "spool"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("collector.internal", False),
    ],
)
def test_binds_loopback_only(host: str, loopback: bool) -> None:
    assert HttpSettings(host=host).binds_loopback_only is loopback


@pytest.mark.parametrize(
    ("url", "normalized"),
    [
        ("s3://bucket-1", "s3://bucket-1"),
        ("s3://bucket-1/", "s3://bucket-1"),
        ("s3://b.u.c/a/b/", "s3://b.u.c/a/b"),
        ("memory://", "memory://"),
        ("file:///var/lib/lm/", "file:///var/lib/lm"),
    ],
)
def test_store_url_normalized(url: str, normalized: str) -> None:
    assert StoreSettings(url=url).url == normalized


# --- errors: key, source and problem ----------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "key", "problem"),
    [
        ('[http]\nport = "eighty"\n', "http.port", "must be an integer, got 'eighty'"),
        ("[http]\nport = 70000\n", "http.port", "must be <= 65535, got 70000"),
        ("[http]\nport = -1\n", "http.port", "must be >= 0, got -1"),
        ("[http]\nprot = 80\n", "http.prot", "unknown key (did you mean 'port'?)"),
        ("[htpp]\nport = 80\n", "htpp", "unknown section (did you mean 'http'?)"),
        ("port = 80\n", "port", "not inside any section"),
        ('[store]\nurl = "ftp://x"\n', "store.url", "must start with file://, memory:// or s3://"),
        ('[store]\nurl = "s3://UPPER"\n', "store.url", "bucket name 'UPPER' is invalid"),
        ('[store]\nurl = "s3://b-1/a//b"\n', "store.url", "empty, '.' or '..' segment"),
        ('[store]\nurl = "file://"\n', "store.url", "file:// needs a directory"),
        ('[store]\nendpoint_url = "localhost:9000"\n', "store.endpoint_url", "http:// or https://"),
        (
            '[logging]\nformat = "yaml"\n',
            "logging.format",
            "must be one of 'json', 'console' or 'auto', got 'yaml'",
        ),
        (
            '[ingest]\nacceptance = "fast"\n',
            "ingest.acceptance",
            "must be one of 's3_manifest' or 'local_spool', got 'fast'",
        ),
        ('[ingest]\ncollector_id = "has space"\n', "ingest.collector_id", "must match"),
        ("[gc]\nmax_delete_fraction = 2.0\n", "gc.max_delete_fraction", "must be <= 1.0, got 2.0"),
        ('[auth]\ntokens_file = ""\n', "auth.tokens_file", "must not be empty"),
        ("http = 5\n", "http", "must be a table, got 5"),
    ],
)
def test_file_errors_name_key_source_and_problem(
    tmp_path: Path, toml: str, key: str, problem: str
) -> None:
    path = write(tmp_path, toml)
    with pytest.raises(SettingsError) as exc:
        load_settings(path, environ={})
    [line] = error_lines(exc)
    assert line.startswith(f"{key} in {path}: ")
    assert problem in line
    [reported] = exc.value.problems
    assert (reported.key, reported.source) == (key, str(path))


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "[http]\nport = 70000\nhost = 5\n[stor]\nx = 1\n")
    with pytest.raises(SettingsError) as exc:
        load_settings(path, environ={"LM_HTTP__PROT": "1"})
    keys = sorted(p.key for p in exc.value.problems)
    assert keys == ["http.host", "http.port", "http.prot", "stor"]


@pytest.mark.parametrize(
    ("name", "value", "key", "problem"),
    [
        ("LM_HTTP__PORT", "abc", "http.port", "must be an integer, got 'abc'"),
        ("LM_HTTP__PORT", "70000", "http.port", "must be <= 65535, got '70000'"),
        ("LM_GC__ENABLED", "maybe", "gc.enabled", "must be true or false"),
        ("LM_LOGGING__FORMAT", "xml", "logging.format", "must be one of"),
        ("LM_HTTP__PROT", "1", "http.prot", "unknown key (did you mean LM_HTTP__PORT?)"),
        ("LM_HTPP__PORT", "1", "htpp.port", "unknown section (did you mean LM_HTTP__PORT?)"),
        ("LM_NOPE__X", "1", "nope.x", "unknown section"),
        ("LM_HTTP__PORT__X", "1", "http.port.x", "has no sub-keys"),
        (
            "LM_HTTP_PORT",
            "1",
            "http.port",
            "must be separated by '__' (did you mean LM_HTTP__PORT?)",
        ),
        ("LM_HTTP__", "1", "http.", "unknown key"),
    ],
)
def test_environment_errors_name_the_variable(
    name: str, value: str, key: str, problem: str
) -> None:
    with pytest.raises(SettingsError) as exc:
        load_settings(environ={name: value})
    [line] = error_lines(exc)
    assert line.startswith(f"{key} in environment variable {name}: ")
    assert problem in line


def test_error_source_follows_the_winning_value(tmp_path: Path) -> None:
    path = write(tmp_path, "[http]\nport = 70000\n")
    with pytest.raises(SettingsError) as exc:
        load_settings(path, environ={"LM_HTTP__PORT": "80000"})
    assert str(exc.value) == (
        "http.port in environment variable LM_HTTP__PORT: must be <= 65535, got '80000'"
    )


def test_mark_grace_must_outlast_a_collector_request(tmp_path: Path) -> None:
    path = write(tmp_path, "[gc]\nmark_grace_s = 30\n")
    with pytest.raises(SettingsError) as exc:
        load_settings(path, environ={"LM_INGEST__REQUEST_BUDGET_S": "20"})
    [problem] = exc.value.problems
    assert problem.key == "gc.mark_grace_s"
    assert problem.source == f"{path}, environment variable LM_INGEST__REQUEST_BUDGET_S"
    assert "must be > ingest.request_budget_s" in problem.problem
    assert "= 55 (the longest a collector request can take to land" in problem.problem
    assert "when collectors have their own settings file, copy those" in problem.problem
    assert problem.problem.endswith("got 30")


def test_log_lookback_must_cover_the_skew_and_a_segment_creates_budget(tmp_path: Path) -> None:
    # PROTOCOL §3.7: a segment cut at T lands by T + ingest.index_put_budget_s.
    path = write(tmp_path, "[reconciler]\nlookback_s = 60\n")
    with pytest.raises(SettingsError) as exc:
        load_settings(path, environ={})
    [problem] = exc.value.problems
    assert problem.key == "reconciler.lookback_s"
    assert "must be >= store.max_clock_skew_s + ingest.index_put_budget_s = 70" in problem.problem
    assert problem.problem.endswith("got 60")
    fits = load_settings(path, environ={"LM_INGEST__INDEX_PUT_BUDGET_S": "40"})
    assert fits.log_lookback_floor_s() == 50.0  # the live follower's lookback
    with pytest.raises(SettingsError) as exc:
        load_settings(path, environ={"LM_INGEST__INDEX_PUT_BUDGET_S": "30"})
    [problem] = exc.value.problems
    assert problem.key == "ingest.index_put_budget_s"
    assert "must be > store.connect_timeout_s + store.read_timeout_s = 35" in problem.problem


def test_signed_delete_expiry_must_fit_well_within_the_lease(tmp_path: Path) -> None:
    path = write(tmp_path, "[reconciler]\nlease_ttl_s = 6\n")
    settings = load_settings(path, environ={})  # a collector may load this file
    assert settings.gc_lease_problem() == (
        "gc.delete_expiry_s + store.max_clock_skew_s + store.connect_timeout_s = 20 must be "
        "<= 2/3 of reconciler.lease_ttl_s = 4: the lease must outlive a signed delete, the "
        "skew and the network delay whenever it is sent (raise the lease TTL or lower the "
        "expiry, the skew limit or the connect timeout)"
    )
    fits = {
        "LM_GC__DELETE_EXPIRY_S": "1",
        "LM_STORE__MAX_CLOCK_SKEW_S": "2",
        "LM_STORE__CONNECT_TIMEOUT_S": "1",
    }
    assert load_settings(path, environ=fits).gc_lease_problem() is None
    assert load_settings(path, environ={"LM_GC__ENABLED": "false"}).gc_lease_problem() is None


def test_connection_cap_must_hold_the_requests_in_flight(tmp_path: Path) -> None:
    path = write(tmp_path, "[http]\nmax_in_flight_requests = 100\n")
    with pytest.raises(SettingsError) as exc:
        load_settings(path, environ={"LM_HTTP__MAX_CONNECTIONS": "99"})
    [problem] = exc.value.problems
    assert problem.key == "http.max_connections"
    assert problem.source == f"environment variable LM_HTTP__MAX_CONNECTIONS, {path}"
    assert "must be >= http.max_in_flight_requests = 100" in problem.problem
    assert load_settings(path, environ={"LM_HTTP__MAX_CONNECTIONS": "100"}).http.max_connections


def test_malformed_toml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, '[http]\nhost = "x"\nport = \n')
    with pytest.raises(SettingsError) as exc:
        load_settings(path, environ={})
    message = str(exc.value)
    assert message.startswith(f"{path}: invalid TOML at line 3")


def test_duplicate_toml_key_is_a_syntax_error(tmp_path: Path) -> None:
    path = write(tmp_path, "[http]\nport = 1\nport = 2\n")
    with pytest.raises(SettingsError, match=r"invalid TOML at line 3"):
        load_settings(path, environ={})


def test_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(SettingsError) as exc:
        load_settings(path, environ={})
    assert str(exc.value) == f"{path}: cannot read: No such file or directory"


def test_non_utf8_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[ingest]\ncollector_id = "caf\xe9"\n')
    with pytest.raises(SettingsError, match=r"latin1\.toml: not UTF-8 text"):
        load_settings(path, environ={})


# --- environment value parsing for list/table fields (later sections add such fields) ---


@pytest.mark.parametrize(
    ("raw", "annotation", "parsed"),
    [
        ('["eu-*", "b"]', tuple[str, ...], ["eu-*", "b"]),  # JSON
        ("['eu-*', 'b']", list[str], ["eu-*", "b"]),  # TOML inline array
        ("{a = 1}", dict[str, int], {"a": 1}),  # TOML inline table
        ("", list[str] | None, None),
        ("9000", int, "9000"),  # scalars are left to pydantic's conversion
    ],
)
def test_structured_environment_values(raw: str, annotation: object, parsed: object) -> None:
    from config.loader import _parse_env_value

    assert _parse_env_value(raw, annotation) == parsed


def test_unparseable_structured_environment_value() -> None:
    from config.loader import _parse_env_value

    with pytest.raises(ValueError, match="must be a JSON or TOML value"):
        _parse_env_value("[unclosed", list[str])
