"""Prometheus label matchers on presented names (PROTOCOL §5 "Matchers").

``EQ``, ``NEQ``, ``RE``, ``NRE`` (``prometheus.LabelMatcher.Type`` 0-3) compare a
series' *presented* label value (`protocol.prom_names`); a series that lacks the label
is compared as ``""``. A regex compiles as ``^(?:re)$`` with RE2 through google-re2
(linear time whatever the pattern: ``(a+)+$`` over a 100 kB value takes microseconds),
never with Python's ``re``; ``.`` does not match a newline, as in Prometheus 2.x (Go's
``regexp`` without the ``s`` flag; Prometheus 3 changed that). A pattern RE2 refuses is
a `MatcherError` (400) naming it.

Column-wise: `LabelMatcher.mask` takes a column of values (one per series, never per
sample), runs a regex once per *distinct* value and spreads the answer back with numpy.

Limits: at most `MAX_MATCHERS` matchers a query and `MAX_PATTERN_BYTES` a pattern
(`MatcherError` naming the limit): Prometheus' engine sends one matcher per label of a
selector, and RE2's compile time and memory grow with the pattern (its automaton is
also capped at `RE2_MAX_MEM` bytes, beyond which the pattern is refused).

Prometheus' rule that a selector needs a matcher that does not match ``""``
(`check_not_all_empty`) belongs to the PromQL parser and to the names endpoints'
``match[]``; Prometheus' *remote read server* does not apply it (its TSDB selects every
series lacking the labels, and nothing for a query without matchers), and neither does
`collector.promql.read_endpoint`: such a read is bounded by ``max_read_samples``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import re2

KINDS = ("EQ", "NEQ", "RE", "NRE")
"""By ``prometheus.LabelMatcher.Type`` number."""
MAX_MATCHERS = 64
MAX_PATTERN_BYTES = 64 * 1024
RE2_MAX_MEM = 8 << 20

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is the caller's 400, not a log line
_OPTIONS.never_capture = True  # only whether it matches: no submatch bookkeeping
_OPTIONS.max_mem = RE2_MAX_MEM


class MatcherError(ValueError):
    """A matcher that cannot be used: the message names it; ``limit`` names the limit
    it exceeds, if that is the problem."""

    def __init__(self, message: str, *, limit: str | None = None) -> None:
        super().__init__(message)
        self.limit = limit


class MatcherSpec(Protocol):
    """Anything with a matcher's three fields (`collector.promql.selector.Matcher`)."""

    @property
    def kind(self) -> str | int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> str: ...


def _short(text: str) -> str:
    return repr(text if len(text) <= 200 else text[:200] + "...")


def compile_regex(pattern: str) -> Any:
    """``^(?:pattern)$`` compiled by RE2; `MatcherError` naming a refused pattern."""
    if len(pattern.encode("utf-8", "surrogatepass")) > MAX_PATTERN_BYTES:
        raise MatcherError(
            f"regex {_short(pattern)} is longer than {MAX_PATTERN_BYTES} bytes (MAX_PATTERN_BYTES)",
            limit="MAX_PATTERN_BYTES",
        )
    try:
        return re2.compile(f"^(?:{pattern})$", _OPTIONS)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else str(exc)
        if isinstance(detail, bytes):  # google-re2 reports RE2's message as bytes
            detail = detail.decode("utf-8", "replace")
        raise MatcherError(f"invalid regex {_short(pattern)}: {detail}") from None
    except (TypeError, ValueError) as exc:  # e.g. a lone surrogate
        raise MatcherError(f"invalid regex {_short(pattern)}: {exc}") from None


@dataclass(frozen=True, slots=True)
class LabelMatcher:
    """One compiled matcher."""

    kind: str  # "EQ" | "NEQ" | "RE" | "NRE"
    name: str
    value: str
    regex: Any = None  # RE2 program, for RE and NRE

    def matches(self, value: str) -> bool:
        """Whether a series whose presented ``name`` is ``value`` ("" when absent) matches."""
        if self.kind == "EQ":
            return value == self.value
        if self.kind == "NEQ":
            return value != self.value
        found = self.regex.fullmatch(value) is not None
        return bool(found) if self.kind == "RE" else not found

    @property
    def matches_empty(self) -> bool:
        """Whether it matches a series lacking the label."""
        return self.matches("")

    def mask(self, values: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
        """Per value of a string column (null: the label is absent, read as ``""``),
        whether it matches. A regex runs once per distinct value."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks() if values.num_chunks else pa.array([], pa.string())
        values = pc.fill_null(values.cast(pa.string()), "")
        if self.kind in ("EQ", "NEQ"):
            equal = pc.equal(values, pa.scalar(self.value, pa.string()))
            hits = np.asarray(equal.to_numpy(zero_copy_only=False), dtype=bool)
            return hits if self.kind == "EQ" else ~hits
        encoded = pc.dictionary_encode(values)
        distinct = encoded.dictionary.to_pylist()
        found = np.fromiter(
            (self.regex.fullmatch(text) is not None for text in distinct),
            dtype=bool,
            count=len(distinct),
        )
        if self.kind == "NRE":
            found = ~found
        indices = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        result: npt.NDArray[np.bool_] = found[indices]
        return result


def compile_matcher(kind: str | int, name: str, value: str) -> LabelMatcher:
    """A matcher from its kind (name or ``LabelMatcher.Type`` number), name and value."""
    if isinstance(kind, int) and not isinstance(kind, bool):
        if not 0 <= kind < len(KINDS):
            raise MatcherError(f"matcher on {_short(name)}: unknown type {kind}")
        kind = KINDS[kind]
    if kind not in KINDS:
        raise MatcherError(f"matcher on {_short(name)}: unknown type {kind!r}")
    regex = compile_regex(value) if kind in ("RE", "NRE") else None
    return LabelMatcher(kind, name, value, regex)


def compile_matchers(specs: Iterable[MatcherSpec]) -> tuple[LabelMatcher, ...]:
    """Compile every matcher of one query; `MatcherError` past `MAX_MATCHERS` (checked
    before anything is compiled) or for a pattern RE2 refuses."""
    listed = list(specs) if not isinstance(specs, Sequence) else specs
    if len(listed) > MAX_MATCHERS:
        raise MatcherError(
            f"{len(listed)} matchers in one query; at most {MAX_MATCHERS} (MAX_MATCHERS)",
            limit="MAX_MATCHERS",
        )
    return tuple(compile_matcher(s.kind, s.name, s.value) for s in listed)


def all_match_empty(matchers: Sequence[LabelMatcher]) -> bool:
    """True when every matcher matches ``""`` (or there is none)."""
    return all(m.matches_empty for m in matchers)


def check_not_all_empty(matchers: Sequence[LabelMatcher]) -> None:
    """Prometheus' selector rule (the PromQL parser's, and the names endpoints'
    ``match[]``): one matcher must not match ``""``. `MatcherError` otherwise."""
    if all_match_empty(matchers):
        raise MatcherError(
            "vector selector must contain at least one non-empty matcher (one that does"
            " not match the empty string)"
        )


def select_label_sets(
    names: pa.Array | pa.ChunkedArray,
    labels: pa.Array | pa.ChunkedArray,
    matchers: Sequence[LabelMatcher],
) -> npt.NDArray[np.bool_]:
    """Per label set — ``names``: presented metric names; ``labels``: the presented
    labels other than ``__name__``, a ``map<string, string>`` column — whether every
    matcher holds. Column-wise; one entry per series."""
    keep = np.ones(len(names), dtype=bool)
    for matcher in matchers:
        if not keep.any():
            break
        if matcher.name == "__name__":
            values: pa.Array | pa.ChunkedArray = names
        else:
            values = pc.map_lookup(labels, pa.scalar(matcher.name, pa.string()), "first")
        keep &= matcher.mask(values)
    return keep
