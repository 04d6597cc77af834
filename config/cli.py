"""The flags every console script takes: ``--config``, ``--log-level``, ``--log-format``.

`add_settings_flags` adds them to a parser and to every subcommand under it, so they may
be written before or after the subcommand (``lm-collector --config x.toml serve`` and
``lm-collector serve --config x.toml``, the way operators and systemd units write it).
Given in both places, the one after the subcommand wins.

`settings_from_flags` loads the settings the flags name. The logging flags override
``[logging]``, and are applied as the ``LM_LOGGING__LEVEL`` / ``LM_LOGGING__FORMAT``
environment variables of this process, so processes it starts with the same settings
(collector workers, Spark workers) log the same way.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import get_args

from config.loader import load_settings
from config.settings import LoggingSettings, Settings

_LEVELS = get_args(LoggingSettings.model_fields["level"].annotation)
_FORMATS = get_args(LoggingSettings.model_fields["format"].annotation)
_ENV = {"log_level": "LM_LOGGING__LEVEL", "log_format": "LM_LOGGING__FORMAT"}
LOGGING_ENV = tuple(_ENV.values())
"""The environment variables `settings_from_flags` sets in this process."""


def add_settings_flags(
    parser: argparse.ArgumentParser,
    *,
    config_help: str = "TOML settings file (default: built-in defaults + LM_* env)",
) -> None:
    """Add the shared flags to ``parser`` and to each subcommand parser under it (call it
    after adding the subcommands)."""
    _add(parser, config_help, default=None)
    for sub in _subcommand_parsers(parser):
        # SUPPRESS: a subcommand that was not given the flag keeps the value given before it.
        _add(sub, config_help, default=argparse.SUPPRESS)


def settings_from_flags(args: argparse.Namespace) -> Settings:
    """The settings ``--config`` names (defaults when absent), with the logging flags
    applied. Raises `SettingsError`."""
    for flag, variable in _ENV.items():
        value = getattr(args, flag, None)
        if value is not None:
            os.environ[variable] = value
    config: Path | None = getattr(args, "config", None)
    return load_settings(config)


def settings_flags_given(args: argparse.Namespace) -> bool:
    """Whether any of the shared flags was given (for scripts whose logging defaults
    differ from ``[logging]``'s when none is)."""
    return any(getattr(args, flag, None) is not None for flag in ("config", *_ENV))


def _add(parser: argparse.ArgumentParser, config_help: str, *, default: object) -> None:
    group = parser.add_argument_group("settings")
    group.add_argument("--config", type=Path, default=default, help=config_help)
    group.add_argument(
        "--log-level",
        type=str.lower,
        choices=_LEVELS,
        default=default,
        help="overrides [logging] level",
    )
    group.add_argument(
        "--log-format", choices=_FORMATS, default=default, help="overrides [logging] format"
    )


def _subcommand_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = []
    for action in parser._actions:  # argparse has no public way to reach subcommands
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += [sub, *_subcommand_parsers(sub)]
    return found
