"""The settings flags of every console script, before or after the subcommand.

``lm-collector serve --config x.toml`` is how operators and systemd units write it; before,
only ``lm-collector --config x.toml serve`` parsed (and ``lm-agent`` only the other way).
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.__main__ import build_parser as agent_parser
from chaos.__main__ import build_parser as chaos_parser
from collector.__main__ import build_parser as collector_parser
from collector.launch import start_collector
from config import SettingsError
from config.cli import settings_flags_given, settings_from_flags
from demo.__main__ import build_parser as demo_parser
from reconciler.__main__ import build_parser as reconciler_parser
from rollup.__main__ import build_parser as rollup_parser

FLAGS = ["--config", "x.toml", "--log-level", "DEBUG", "--log-format", "json"]
SCRIPTS: list[tuple[str, Callable[[], argparse.ArgumentParser], list[list[str]]]] = [
    ("lm-collector", collector_parser, [["serve"], ["probe"], ["conflicts"], ["token", "n"]]),
    (
        "lm-reconciler",
        reconciler_parser,
        [["run", "--once"], ["audit"], ["gc"], ["problems"], ["status"]],
    ),
    ("lm-agent", agent_parser, [["send"]]),
    (
        "lm-rollup",
        rollup_parser,
        [["run"], ["query", "points"], ["history"], ["verify"], ["vacuum"]],
    ),
    (
        "lm-chaos",
        chaos_parser,
        [["run", "--scenario", "race", "--duration", "1"], ["simulate"], ["list"]],
    ),
    ("lm-demo", demo_parser, [[]]),
]
CASES = [
    pytest.param(build, command, id=f"{name} {' '.join(command[:1])}".strip())
    for name, build, commands in SCRIPTS
    for command in commands
]


@pytest.mark.parametrize(("build", "command"), CASES)
@pytest.mark.parametrize("where", ["before", "after"])
def test_settings_flags_parse_before_or_after_the_subcommand(
    build: Callable[[], argparse.ArgumentParser], command: list[str], where: str
) -> None:
    argv = [*FLAGS, *command] if where == "before" else [*command, *FLAGS]
    args = build().parse_args(argv)
    assert (args.config, args.log_level, args.log_format) == (Path("x.toml"), "debug", "json")
    assert settings_flags_given(args)


@pytest.mark.parametrize(("build", "command"), CASES)
def test_without_flags_nothing_is_set(
    build: Callable[[], argparse.ArgumentParser], command: list[str]
) -> None:
    args = build().parse_args(command)
    assert (args.config, args.log_level, args.log_format) == (None, None, None)
    assert not settings_flags_given(args)


def test_the_flag_after_the_subcommand_wins() -> None:
    args = collector_parser().parse_args(["--config", "a.toml", "serve", "--config", "b.toml"])
    assert args.config == Path("b.toml")


def test_logging_flags_override_the_file_and_reach_child_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("LM_LOGGING__LEVEL", "LM_LOGGING__FORMAT"):
        monkeypatch.setenv(variable, "unset")  # so that monkeypatch restores it afterwards
        monkeypatch.delenv(variable)
    config = tmp_path / "x.toml"
    config.write_text('[logging]\nlevel = "warning"\nformat = "console"\n')
    from_file = settings_from_flags(
        collector_parser().parse_args(["probe", "--config", str(config)])
    )
    assert (from_file.logging.level, from_file.logging.format) == ("warning", "console")
    args = collector_parser().parse_args(["probe", "--config", str(config), "--log-level", "error"])
    assert settings_from_flags(args).logging.level == "error"
    assert os.environ["LM_LOGGING__LEVEL"] == "error"  # what spawned workers load


def test_a_bad_config_file_is_a_settings_error(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[ingest]\nno_such_key = 1\n")
    with pytest.raises(SettingsError, match="no_such_key"):
        settings_from_flags(reconciler_parser().parse_args(["status", "--config", str(config)]))


def test_collector_serve_takes_config_after_the_subcommand(tmp_path: Path) -> None:
    """The systemd way, as a real process: ``lm-collector serve --config FILE``."""
    config = tmp_path / "collector.toml"
    config.write_text(
        f'[store]\nurl = "file://{tmp_path / "store"}"\n\n'
        '[ingest]\ncollector_id = "from-the-config-file"\n\n[metrics]\nenabled = false\n'
    )
    collector = start_collector(
        work_dir=tmp_path / "logs",
        name="config-after",
        env={},
        # start_collector sets LM_LOGGING__FORMAT=json: the flag overrides it.
        args=("--config", str(config), "--log-format", "console"),
    )
    try:
        with urllib.request.urlopen(f"{collector.url}/healthz", timeout=10) as response:
            assert json.loads(response.read())["collector_id"] == "from-the-config-file"
    finally:
        assert collector.stop() == 0
    log = collector.log_path.read_text()
    assert "probe_passed" in log and '"event"' not in log
