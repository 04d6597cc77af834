"""Fault decisions for the chaos proxy: what can go wrong, and which request gets what.

Pure: no I/O. `decide` is a function of the seed, the phase name, the operation, the key
and how many requests for that (operation, key) came before, so a seed replays the same
fault schedule whatever the interleaving of requests for different keys (see
`chaos.proxy`). `classify` turns an S3 request into ``(operation, key)``.

Kinds (`FaultKind`): ``latency`` (a `Latency` distribution, before anything else),
``error_500``, ``slowdown_503``, ``conflict_409`` (conditional PUTs only, as on S3),
``reset``, ``timeout``, ``lost_answer`` (applied, then the answer lost: reset, 500, or
held), ``late_apply`` (held until the client gives up, then applied) and ``outage``
(a `Phase` with ``outage=True`` resets every request).
"""

from __future__ import annotations

import enum
import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from yarl import URL

OPERATIONS = (
    "get",
    "head",
    "list",
    "put",
    "put_if_none_match",
    "put_if_match",
    "delete",
    "post",
    "other",
)
CONDITIONAL_PUTS = frozenset({"put_if_none_match", "put_if_match"})
MUTATING = frozenset({"put", "put_if_none_match", "put_if_match", "delete", "post"})


class FaultKind(enum.StrEnum):
    LATENCY = "latency"
    ERROR_500 = "error_500"
    SLOWDOWN_503 = "slowdown_503"
    CONFLICT_409 = "conflict_409"
    RESET = "reset"
    TIMEOUT = "timeout"
    LOST_ANSWER = "lost_answer"
    LATE_APPLY = "late_apply"
    OUTAGE = "outage"


# The order in which rates are laid out on [0, 1): part of the schedule's definition.
RATED_KINDS = (
    FaultKind.ERROR_500,
    FaultKind.SLOWDOWN_503,
    FaultKind.CONFLICT_409,
    FaultKind.RESET,
    FaultKind.TIMEOUT,
    FaultKind.LOST_ANSWER,
    FaultKind.LATE_APPLY,
)
LostMode = Literal["reset", "error_500", "hold"]
LOST_MODES: tuple[LostMode, ...] = ("reset", "error_500", "hold")


@dataclass(frozen=True, slots=True)
class Latency:
    """A delay distribution in seconds, capped at ``cap_s``:

    - ``fixed``: ``a``; ``uniform``: between ``a`` and ``b``;
    - ``exponential``: mean ``a``; ``lognormal``: median ``a``, shape sigma ``b``.
    ``rate`` is the share of requests delayed at all (the rest go straight on)."""

    distribution: Literal["fixed", "uniform", "exponential", "lognormal"]
    a: float
    b: float = 0.0
    cap_s: float = 5.0
    rate: float = 1.0

    def __post_init__(self) -> None:
        if self.a < 0 or self.b < 0 or self.cap_s < 0 or not 0 <= self.rate <= 1:
            raise ValueError(f"invalid latency {self}")

    def sample(self, rng: random.Random) -> float:
        if rng.random() >= self.rate:
            return 0.0
        if self.distribution == "fixed":
            value = self.a
        elif self.distribution == "uniform":
            value = rng.uniform(self.a, max(self.a, self.b))
        elif self.distribution == "exponential":
            value = rng.expovariate(1.0 / self.a) if self.a > 0 else 0.0
        else:
            value = self.a * math.exp(rng.gauss(0.0, self.b)) if self.a > 0 else 0.0
        return min(self.cap_s, value)


@dataclass(frozen=True, slots=True)
class FaultRule:
    """Faults for requests whose operation is in ``ops`` (``None``: any) and whose key
    starts with ``prefix``. ``rates`` per kind are probabilities that add up to <= 1."""

    rates: Mapping[FaultKind, float] = field(default_factory=dict)
    ops: frozenset[str] | None = None
    prefix: str = ""
    latency: Latency | None = None

    def __post_init__(self) -> None:
        unknown = set(self.ops or ()) - set(OPERATIONS)
        if unknown:
            raise ValueError(f"unknown operations {sorted(unknown)}; use {OPERATIONS}")
        bad = [k for k in self.rates if k not in RATED_KINDS]
        if bad:
            raise ValueError(f"{bad} are not rated fault kinds; use {RATED_KINDS}")
        if any(r < 0 for r in self.rates.values()) or sum(self.rates.values()) > 1 + 1e-9:
            raise ValueError(f"rates must be >= 0 and add up to <= 1, got {dict(self.rates)}")

    def matches(self, op: str, key: str) -> bool:
        return (self.ops is None or op in self.ops) and key.startswith(self.prefix)


@dataclass(frozen=True, slots=True)
class Phase:
    """A named set of rules; ``outage`` makes the store unreachable (every request reset)."""

    name: str
    rules: tuple[FaultRule, ...] = ()
    outage: bool = False


CALM = Phase("calm")


@dataclass(frozen=True, slots=True)
class Decision:
    kind: FaultKind | None
    delay_s: float = 0.0
    lost_mode: LostMode = "reset"
    late_fraction: float = 0.0  # of ``late_extra_s``, for ``late_apply``


def decide(seed: int, phase: Phase, op: str, key: str, occurrence: int) -> Decision:
    """The fault for the ``occurrence``-th request (0-based) of ``op`` on ``key``. Pure."""
    if phase.outage:
        return Decision(FaultKind.OUTAGE)
    rule = next((r for r in phase.rules if r.matches(op, key)), None)
    if rule is None:
        return Decision(None)
    rng = random.Random(f"{seed}/{phase.name}/{op}/{key}/{occurrence}")
    delay = rule.latency.sample(rng) if rule.latency is not None else 0.0
    draw = rng.random()
    lost_mode = LOST_MODES[rng.randrange(len(LOST_MODES))]
    late_fraction = rng.random()
    cumulative = 0.0
    for kind in RATED_KINDS:
        rate = rule.rates.get(kind, 0.0)
        if kind is FaultKind.CONFLICT_409 and op not in CONDITIONAL_PUTS:
            rate = 0.0  # S3 answers 409 ConditionalRequestConflict to conditional writes only
        cumulative += rate
        if draw < cumulative:
            return Decision(kind, delay, lost_mode, late_fraction)
    return Decision(None, delay)


def classify(method: str, url: URL, headers: Mapping[str, str], root: str) -> tuple[str, str]:
    """``(operation, key)`` of an S3 request (path-style addressing). ``root`` is
    ``"bucket/prefix/"`` (or ``"bucket/"``); keys outside it keep their full path."""
    path = url.path.lstrip("/")
    key = path[len(root) :] if path.startswith(root) else path
    method = method.upper()
    if method == "GET" and url.query.get("list-type") == "2":
        list_prefix = url.query.get("prefix", "")
        full = root.split("/", 1)[1] if "/" in root else ""
        return "list", list_prefix[len(full) :] if list_prefix.startswith(full) else list_prefix
    if method == "GET":
        return "get", key
    if method == "HEAD":
        return "head", key
    if method == "DELETE":
        return "delete", key
    if method == "POST":
        return "post", key
    if method == "PUT":
        if "If-None-Match" in headers:
            return "put_if_none_match", key
        if "If-Match" in headers:
            return "put_if_match", key
        return "put", key
    return "other", key


def decision_term(op: str, key: str, occurrence: int, kind: FaultKind) -> int:
    digest = hashlib.sha256(f"{op}\n{key}\n{occurrence}\n{kind.value}".encode()).digest()
    return int.from_bytes(digest, "big")
