"""The one error `config` raises, and how validation problems are worded.

`SettingsError`: the settings or tokens file, or an ``LM_...`` environment variable, is
wrong. Nothing is retried: print the message (it names the key, where the value came
from, and what is wrong with it) and exit with a non-zero status.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_core import ErrorDetails


@dataclass(frozen=True, slots=True)
class SettingsProblem:
    """One thing wrong: ``key`` (dotted, e.g. ``http.port``; empty for a whole file),
    ``source`` (a file path or ``environment variable LM_...``) and ``problem``."""

    key: str
    source: str
    problem: str

    def __str__(self) -> str:
        if self.key:
            return f"{self.key} in {self.source}: {self.problem}"
        return f"{self.source}: {self.problem}"


class SettingsError(ValueError):
    """Invalid configuration. ``problems`` lists every problem found, in order; the
    message is one line per problem. Fix the configuration; retrying cannot help."""

    def __init__(self, problems: Sequence[SettingsProblem]) -> None:
        if not problems:
            raise ValueError("SettingsError needs at least one problem")
        self.problems: tuple[SettingsProblem, ...] = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def single(cls, *, key: str, source: str, problem: str) -> SettingsError:
        return cls([SettingsProblem(key=key, source=source, problem=problem)])


class CrossFieldError(ValueError):
    """Raised by a `Settings` validator that relates several keys: ``key`` is the one
    reported (dotted, from the root), ``related`` the others whose sources are named too."""

    def __init__(self, key: str, message: str, *, related: Sequence[str] = ()) -> None:
        self.key = key
        self.related = tuple(related)
        super().__init__(message)


def loc_to_key(loc: Iterable[int | str]) -> str:
    """``("http", "port")`` → ``http.port``; list indexes become ``[i]``."""
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        else:
            key += f".{part}" if key else part
    return key


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'port'?)`` when a close match exists, else ``""``."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


_BOUNDS = {
    "greater_than_equal": ("ge", ">="),
    "greater_than": ("gt", ">"),
    "less_than_equal": ("le", "<="),
    "less_than": ("lt", "<"),
}

_TYPE_WORDS = {
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "path_type": "must be a path string",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "model_type": "must be a table",
    "model_attributes_type": "must be a table",
    "dict_type": "must be a table",
}


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def describe_error(error: ErrorDetails) -> str:
    """Word one pydantic error as ``must be <= 65535, got 70000``: the problem first,
    then the offending value."""
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "is required"
    if kind in _BOUNDS:
        name, op = _BOUNDS[kind]
        text = f"must be {op} {ctx[name]}"
    elif kind in _TYPE_WORDS:
        text = _TYPE_WORDS[kind]
    elif kind == "literal_error":
        text = f"must be one of {ctx['expected']}"
    elif kind == "string_too_short":
        n = ctx["min_length"]
        text = "must not be empty" if n == 1 else f"must be at least {n} characters"
    elif kind == "string_too_long":
        text = f"must be at most {ctx['max_length']} characters"
    elif kind == "string_pattern_mismatch":
        text = f"must match the pattern {ctx['pattern']}"
    elif kind == "value_error" and "error" in ctx:
        text = str(ctx["error"])
    else:
        text = error["msg"]
    return f"{text}, got {_short_repr(error['input'])}"
