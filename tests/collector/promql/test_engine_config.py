"""The engine's configuration (PROTOCOL §5) as Prometheus 2.42's own tools judge it:
``promtool check config`` and ``promtool check web-config`` accept what
`collector.promql.engine_config` and ``lm-collector promql-config`` write; every flag is
one ``prometheus --help`` lists; secrets are 0600 in a 0700 directory."""

from __future__ import annotations

import re
import stat
import subprocess
from pathlib import Path

import bcrypt
import pytest

from collector.__main__ import main
from collector.promql.engine_config import (
    ENGINE_USER,
    EngineFiles,
    engine_flags,
    private_directory,
    prom_duration,
    write_engine_config,
)
from config.query_settings import PromqlSettings
from tests.prometheus_binary import PROMTOOL, require_prometheus

SETTINGS = PromqlSettings(
    remote_timeout_s=20, query_timeout_s=30.5, forward_timeout_s=40, lookback_delta_s=600
)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    require_prometheus()
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=30)


def test_written_config_is_accepted_by_promtool(tmp_path: Path) -> None:
    files, password = write_engine_config(
        tmp_path / "engine", read_url="http://127.0.0.1:8080/api/v1/read", settings=SETTINGS
    )
    checked = _promtool("check", "config", str(files.config_file))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    checked = _promtool("check", "web-config", str(files.web_config_file))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    text = files.config_file.read_text()
    assert "read_recent: true" in text and 'remote_timeout: "20s"' in text
    assert f'credentials_file: "{files.read_token_file}"' in text
    assert "scrape_configs" not in text and "external_labels" not in text
    hashed = re.search(rf'"{ENGINE_USER}": "(.+)"', files.web_config_file.read_text())
    assert hashed is not None and bcrypt.checkpw(password.encode(), hashed[1].encode())
    assert files.password_file.read_text().strip() == password
    assert stat.S_IMODE(files.directory.stat().st_mode) == 0o700
    for path in (files.config_file, files.web_config_file, files.password_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_flags_are_prometheus_flags_with_the_settings(tmp_path: Path) -> None:
    binary = require_prometheus()
    known = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    flags = engine_flags(
        EngineFiles(tmp_path),
        SETTINGS,
        max_concurrency=3,
        listen="127.0.0.1:9999",
        tsdb_path=tmp_path / "tsdb",
    )
    for flag in flags:
        assert f"{flag.split('=')[0]}=" in known.stderr + known.stdout, flag
    assert "--query.timeout=30500ms" in flags and "--query.lookback-delta=600s" in flags
    assert "--query.max-concurrency=3" in flags
    assert "--web.listen-address=127.0.0.1:9999" in flags


def test_durations_and_private_directory(tmp_path: Path) -> None:
    assert [prom_duration(s) for s in (60, 0.25, 90.5, 0.001)] == ["60s", "250ms", "90500ms", "1ms"]
    with pytest.raises(ValueError):
        prom_duration(0.0001)
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    assert stat.S_IMODE(private_directory(loose).stat().st_mode) == 0o700
    (tmp_path / "link").symlink_to(loose)
    with pytest.raises(ValueError, match="symlink"):
        private_directory(tmp_path / "link")


def test_promql_config_command_writes_a_sidecar_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LM_QUERY__MAX_CONCURRENT_PROMQL", "5")
    monkeypatch.setenv("LM_QUERY__PROMQL__CREDENTIALS_DIR", str(tmp_path / "engine"))
    assert main(["promql-config", "--listen", "127.0.0.1:19091"]) == 0
    files = EngineFiles(tmp_path / "engine")
    assert _promtool("check", "config", str(files.config_file)).returncode == 0
    assert 'url: "http://127.0.0.1:8080/api/v1/read"' in files.config_file.read_text()
    env = (files.directory / "prometheus.env").read_text()
    assert env.startswith("PROMETHEUS_ARGS=--config.file=")
    assert "--query.max-concurrency=5" in env and "--web.listen-address=127.0.0.1:19091" in env
    assert "prometheus --config.file=" in capsys.readouterr().out
    # No directory at all is a clear error, exit 2, nothing written.
    monkeypatch.delenv("LM_QUERY__PROMQL__CREDENTIALS_DIR")
    assert main(["promql-config"]) == 2
    assert "--dir" in capsys.readouterr().err


def test_engine_settings_are_checked_before_the_collector_binds(tmp_path: Path) -> None:
    from collector.startup_checks import StartupError, check_startup
    from config import Settings

    binary = tmp_path / "prometheus"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    engine = Settings(query={"promql": {"prometheus": str(binary)}})
    with pytest.raises(StartupError, match=r"--workers 1.*got --workers 2"):
        check_startup(engine, workers=2)
    check_startup(engine, workers=1)
    check_startup(Settings(), workers=2)
    # What would only fail later is refused before binding: a missing binary, a sidecar
    # without the directory its read token goes to.
    missing = Settings(query={"promql": {"prometheus": str(tmp_path / "nowhere")}})
    with pytest.raises(StartupError, match="not an executable file"):
        check_startup(missing, workers=1)
    sidecar = Settings(query={"promql": {"url": "http://127.0.0.1:9091"}})
    with pytest.raises(StartupError, match="credentials_dir"):
        check_startup(sidecar, workers=1)
