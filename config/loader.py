"""Load `Settings`: defaults → TOML file → ``LM_<SECTION>__<KEY>`` environment variables.

This module and `config.tokens` are the only places in the project that read files and
the environment. Every value remembers where it came from, so a validation error names
the key, the source (file path or variable name) and the problem::

    http.port in /etc/lm.toml: must be <= 65535, got 70000
    http.prot in environment variable LM_HTTP__PROT: unknown key (did you mean LM_HTTP__PORT?)

Environment values are strings; scalars (ints, floats, bools such as ``true``/``false``/
``1``/``0``) are converted by the field's type, list and table fields take JSON or a TOML
inline value (``["a-*", "b"]``), and an empty value sets an optional field to ``None``.
A variable is "ours" when it starts with ``LM_`` and either contains ``__`` or starts
with a section name (``LM_HTTP_PORT``, a missing underscore, is an error, not silently
ignored); other ``LM_...`` variables (``LM_LICENSE_FILE``) are left alone.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from config.errors import (
    CrossFieldError,
    SettingsError,
    SettingsProblem,
    describe_error,
    did_you_mean,
    loc_to_key,
)
from config.settings import Settings

ENV_PREFIX = "LM_"
ENV_DELIMITER = "__"
_DEFAULTS = "defaults"

# Where each configured value came from: (section, key, ...) → source description.
_Origins = dict[tuple[str, ...], str]


def load_settings(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Validated settings from the defaults, the TOML file at ``path`` (if given) and
    ``environ`` (default: the process environment). Raises `SettingsError` listing every
    problem found; nothing is partially applied."""
    env = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    origins: _Origins = {}
    if path is not None:
        data = read_toml_file(path)
        _record_origins(data, (), str(path), origins)
    problems = _overlay_environment(data, env, origins)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        problems.extend(_problems_from(exc, origins))
    if problems:
        raise SettingsError(problems)
    return settings


def read_toml_file(path: Path) -> dict[str, Any]:
    """The parsed TOML document at ``path``; `SettingsError` naming the file (and the
    line, for syntax errors) when it cannot be read or parsed."""
    source = str(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SettingsError.single(
            key="", source=source, problem=f"cannot read: {reason}"
        ) from None
    except UnicodeDecodeError as exc:
        raise SettingsError.single(
            key="", source=source, problem=f"not UTF-8 text (byte {exc.start})"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError.single(
            key="", source=source, problem=_describe_toml_error(exc)
        ) from None


def _describe_toml_error(exc: tomllib.TOMLDecodeError) -> str:
    # Python 3.11's TOMLDecodeError has no lineno attribute; the position is only in
    # the message, as "... (at line 3, column 8)" or "... (at end of document)".
    message = str(exc)
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if match:
        base = message[: match.start()]
        return f"invalid TOML at line {match[1]}, column {match[2]}: {base}"
    return f"invalid TOML: {message}"


def _record_origins(
    value: Mapping[str, Any], prefix: tuple[str, ...], source: str, origins: _Origins
) -> None:
    for key, item in value.items():
        path = (*prefix, key)
        origins[path] = source
        if isinstance(item, Mapping):
            _record_origins(item, path, source, origins)


# --- environment ----------------------------------------------------------------------


def _overlay_environment(
    data: dict[str, Any], environ: Mapping[str, str], origins: _Origins
) -> list[SettingsProblem]:
    """Set every ``LM_...`` value into ``data`` (beating the file); problems for
    variables that look like ours but name no setting or hold unparseable values."""
    problems: list[SettingsProblem] = []
    sections = list(Settings.model_fields)
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :]
        source = f"environment variable {name}"
        if ENV_DELIMITER not in rest:
            section = next((s for s in sections if rest.lower().startswith(s + "_")), None)
            if section is not None:
                key = rest[len(section) + 1 :].lower()
                hint = f"{ENV_PREFIX}{section.upper()}{ENV_DELIMITER}{key.upper()}"
                problem = f"section and key must be separated by '__' (did you mean {hint}?)"
                problems.append(SettingsProblem(f"{section}.{key}", source, problem))
            continue
        parts = tuple(part.lower() for part in rest.split(ENV_DELIMITER))
        target = _resolve_field(parts)
        if isinstance(target, SettingsProblem):
            problems.append(SettingsProblem(target.key, source, target.problem))
            continue
        try:
            value = _parse_env_value(environ[name], target)
        except ValueError as exc:
            problems.append(SettingsProblem(".".join(parts), source, str(exc)))
            continue
        if _set_path(data, parts, value):
            origins[parts] = source
    return problems


def _resolve_field(parts: tuple[str, ...]) -> Any:
    """The annotation of the field at ``parts``, or a `SettingsProblem` (with an empty
    source) saying which part names nothing."""
    model: type[BaseModel] = Settings
    for depth, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            what = "unknown section" if depth == 0 else "unknown key"
            hint = did_you_mean(part, fields)
            if hint:
                close = hint.split("'")[1]
                fixed = (*parts[:depth], close, *parts[depth + 1 :])
                hint = f" (did you mean {ENV_PREFIX}{ENV_DELIMITER.join(fixed).upper()}?)"
            return SettingsProblem(".".join(parts), "", what + hint)
        annotation = fields[part].annotation
        nested = _model_class(annotation)
        if depth == len(parts) - 1:
            return annotation
        if nested is None:
            return SettingsProblem(".".join(parts), "", f"{part!r} has no sub-keys")
        model = nested
    raise AssertionError("unreachable: parts is never empty")


def _model_class(annotation: Any) -> type[BaseModel] | None:
    base = _strip(annotation)
    if isinstance(base, type) and issubclass(base, BaseModel):
        return base
    return None


def _strip(annotation: Any) -> Any:
    """The annotation without ``Annotated[...]`` and ``| None``."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _strip(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _strip(args[0])
    return annotation


def _is_optional(annotation: Any) -> bool:
    if get_origin(annotation) is Annotated:
        return _is_optional(get_args(annotation)[0])
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def _is_structured(annotation: Any) -> bool:
    base = _strip(annotation)
    origin = get_origin(base) or base
    if isinstance(origin, type) and issubclass(origin, BaseModel):
        return True
    return origin in (list, tuple, set, frozenset, dict) or (
        get_origin(base) is not None and get_origin(base).__module__ == "collections.abc"
    )


def _parse_env_value(raw: str, annotation: Any) -> Any:
    if raw == "" and _is_optional(annotation):
        return None
    if not _is_structured(annotation):
        return raw  # pydantic converts "9000", "true", "1.5" by the field's type
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        raise ValueError(f'must be a JSON or TOML value such as ["a", "b"], got {raw!r}') from None


def _set_path(data: dict[str, Any], parts: tuple[str, ...], value: Any) -> bool:
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            return False  # the file has a non-table here; validation reports it
        node = child
    node[parts[-1]] = value
    return True


# --- validation errors ----------------------------------------------------------------


def _problems_from(exc: ValidationError, origins: _Origins) -> list[SettingsProblem]:
    problems: list[SettingsProblem] = []
    for error in exc.errors(include_url=False):
        loc = tuple(str(part) for part in error["loc"])
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, CrossFieldError):
            keys = (cause.key, *cause.related)
            sources = [_source_of(tuple(k.split(".")), origins) for k in keys]
            named = [s for s in dict.fromkeys(sources) if s != _DEFAULTS] or [_DEFAULTS]
            problems.append(SettingsProblem(cause.key, ", ".join(named), str(cause)))
            continue
        key = loc_to_key(error["loc"])
        source = _source_of(loc, origins)
        if error["type"] == "extra_forbidden":
            problem = _describe_unknown(loc, error["input"])
        else:
            problem = describe_error(error)
        problems.append(SettingsProblem(key, source, problem))
    return problems


def _source_of(loc: tuple[str, ...], origins: _Origins) -> str:
    for end in range(len(loc), 0, -1):
        if loc[:end] in origins:
            return origins[loc[:end]]
    return _DEFAULTS


def _describe_unknown(loc: tuple[str, ...], value: Any) -> str:
    parent: type[BaseModel] | None = Settings
    for part in loc[:-1]:
        parent = _model_class(parent.model_fields[part].annotation) if parent else None
    choices = list(parent.model_fields) if parent else []
    hint = did_you_mean(loc[-1], choices)
    if len(loc) == 1:
        if not isinstance(value, Mapping):
            return "not inside any section; put it under a [section] table" + hint
        return "unknown section" + hint
    return "unknown key" + hint
