"""Readers for the operator files under deploy/: systemd units, the Dockerfile and its
ignore file, Kubernetes quantities and a small IAM policy evaluator.

Each reader understands exactly the subset of its format that deploy/ uses and fails
loudly (AssertionError, ValueError) on anything else, so a new construct in a deploy
file makes the consistency tests say so instead of silently checking nothing.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# --- systemd units ----------------------------------------------------------------------


@dataclass
class Unit:
    """A systemd unit file: ``sections[name]`` is the ordered list of (key, value)."""

    path: Path
    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def values(self, section: str, key: str) -> list[str]:
        return [v for k, v in self.sections.get(section, []) if k == key]

    def value(self, section: str, key: str) -> str:
        found = self.values(section, key)
        assert len(found) == 1, f"{self.path.name}: [{section}] {key}= set {len(found)} times"
        return found[0]

    def environment(self) -> dict[str, str]:
        """``Environment=`` assignments of [Service] (not EnvironmentFile= contents)."""
        env: dict[str, str] = {}
        for assignment in self.values("Service", "Environment"):
            for word in shlex.split(assignment):
                name, sep, value = word.partition("=")
                assert sep, f"{self.path.name}: Environment={assignment!r} is not NAME=VALUE"
                env[name] = value
        return env

    def exec_argv(self, key: str = "ExecStart", instance: str = "example") -> list[str]:
        """``key``'s command line with specifiers and ``${VAR}`` from Environment= expanded,
        as systemd would split it."""
        command = self.value("Service", key).lstrip("-@:+!")
        command = command.replace("%i", instance).replace("%H", "host").replace("%%", "%")
        env = self.environment()

        def expand(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2)
            assert name in env, f"{self.path.name}: {key} uses ${name}, not set by Environment="
            return env[name]

        return shlex.split(re.sub(r"\$\{(\w+)\}|\$(\w+)", expand, command))


def read_unit(path: Path) -> Unit:
    unit = Unit(path)
    current: str | None = None
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            unit.sections.setdefault(current, [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"{path.name}: cannot read line {raw!r}"
        unit.sections[current].append((key.strip(), value.strip()))
    return unit


_DURATION_UNITS = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}


def systemd_seconds(text: str) -> float:
    """``30s``, ``55min``, ``1min 30s``, ``90`` (seconds) → seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text.strip())
    assert parts, f"not a systemd time span: {text!r}"
    return sum(float(number) * _DURATION_UNITS[unit or "s"] for number, unit in parts)


# --- Kubernetes -------------------------------------------------------------------------

_QUANTITY_FACTORS = {
    "": 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
}


def k8s_bytes(quantity: str | int) -> int:
    match = re.fullmatch(r"(\d+)([A-Za-z]*)", str(quantity))
    assert match and match.group(2) in _QUANTITY_FACTORS, f"unsupported quantity {quantity!r}"
    return int(match.group(1)) * _QUANTITY_FACTORS[match.group(2)]


def pod_specs(document: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The pod spec of a Deployment, DaemonSet or CronJob (nothing for other kinds)."""
    if document["kind"] in ("Deployment", "DaemonSet"):
        yield document["spec"]["template"]["spec"]
    elif document["kind"] == "CronJob":
        yield document["spec"]["jobTemplate"]["spec"]["template"]["spec"]


# --- Dockerfile and its ignore file -----------------------------------------------------


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, instruction: str) -> str | None:
        found = [arg for ins, arg in self.instructions if ins == instruction]
        return found[-1] if found else None


def read_dockerfile(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages in order). Continuation lines are joined."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    logical: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    for line in logical:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name, base))
        elif instruction == "ARG" and not stages:
            key, _, default = rest.partition("=")
            args[key.strip()] = default.strip()
        else:
            assert stages, f"{instruction} before any FROM"
            stages[-1].instructions.append((instruction, rest.strip()))
    return args, stages


def exec_form(argument: str) -> list[str]:
    """An ENTRYPOINT/CMD in JSON (exec) form."""
    value = json.loads(argument)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), argument
    return value


def copy_sources(stage: Stage) -> list[str]:
    """Sources of COPY instructions that read the build context (not --from=)."""
    sources: list[str] = []
    for instruction, argument in stage.instructions:
        if instruction != "COPY" or argument.startswith("--from="):
            continue
        words = argument.split()
        assert not words[0].startswith("--"), f"unsupported COPY flag in {argument!r}"
        sources.extend(word.rstrip("/") for word in words[:-1])
    return sources


def dockerignore_patterns(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def docker_ignores(patterns: Iterable[str], relative_path: str) -> bool:
    """Whether the build context leaves ``relative_path`` out: the last pattern matching
    the path or one of its parent directories decides (``!`` re-includes)."""
    parts = relative_path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        if any(fnmatchcase(candidate, glob) for candidate in candidates):
            ignored = not negated
    return ignored


# --- IAM --------------------------------------------------------------------------------


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _condition_holds(
    condition: Mapping[str, Mapping[str, Any]], context: Mapping[str, str]
) -> bool:
    """The condition operators deploy/bucket-policy uses, evaluated against ``context``
    (a key absent from the context is absent from the request)."""
    for operator, tests in condition.items():
        for key, expected in tests.items():
            actual = context.get(key)
            wanted = [str(v).lower() for v in _as_list(expected)]
            if operator == "Null":
                holds = (actual is None) == (wanted == ["true"])
            elif operator == "Bool":
                holds = actual is not None and actual.lower() in wanted
            elif operator == "ArnNotEquals":
                holds = actual is None or actual.lower() not in wanted
            elif operator == "StringLike":
                holds = actual is not None and any(fnmatchcase(actual, w) for w in wanted)
            else:
                raise AssertionError(f"the test evaluator does not know {operator!r}: teach it")
            if not holds:
                return False
    return True


def statement_applies(
    statement: Mapping[str, Any], action: str, resource: str, context: Mapping[str, str]
) -> bool:
    assert "NotAction" not in statement and "NotResource" not in statement, (
        "NotAction/NotResource make policies hard to reason about; the evaluator refuses them"
    )
    actions = [a.lower() for a in _as_list(statement["Action"])]
    if not any(fnmatchcase(action.lower(), pattern) for pattern in actions):
        return False
    if not any(fnmatchcase(resource, pattern) for pattern in _as_list(statement["Resource"])):
        return False
    return _condition_holds(statement.get("Condition", {}), context)


def allowed(
    identity_policy: Mapping[str, Any],
    bucket_policy: Mapping[str, Any],
    action: str,
    resource: str,
    context: Mapping[str, str],
) -> bool:
    """Same-account evaluation: allowed by the identity policy and denied by neither."""
    statements = [*identity_policy["Statement"], *bucket_policy["Statement"]]
    if any(
        s["Effect"] == "Deny" and statement_applies(s, action, resource, context)
        for s in statements
    ):
        return False
    return any(
        s["Effect"] == "Allow" and statement_applies(s, action, resource, context)
        for s in identity_policy["Statement"]
    )


ACCOUNT = "111122223333"
POLICIES = DEPLOY / "bucket-policy"
POLICY_FILES = {
    "collector": "collector-policy.json",
    "reconciler": "reconciler-policy.json",
    "gc": "reconciler-gc-policy.json",
    "rollup": "rollup-policy.json",
}
"""Each role of deploy/bucket-policy and the identity policy attached to it."""


def role_arn(role: str) -> str:
    return f"arn:aws:iam::{ACCOUNT}:role/lightmetrics-{role}"


def load_policy(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((POLICIES / name).read_text(encoding="utf-8"))
    assert document["Version"] == "2012-10-17"
    return document


def role_may(
    role: str, action: str, resource: str, *, extra: Mapping[str, str] | None = None
) -> bool:
    """Whether ``role`` may make ``action`` on ``resource`` (an ARN) under the shipped
    identity policy of the role and the bucket policy, over TLS."""
    context = {"aws:PrincipalArn": role_arn(role), "aws:SecureTransport": "true", **(extra or {})}
    return allowed(
        load_policy(POLICY_FILES[role]),
        load_policy("bucket-policy.json"),
        action,
        resource,
        context,
    )
