"""Matchers over a column of presented label sets (PROTOCOL §5 "Matchers").

A set's value for a label it lacks is ``""``. Regexes compile as ``^(?:re)$`` with RE2
(google-re2: linear time; ``.`` does not match a newline, as in Prometheus 2.x); a pattern
RE2 refuses is a `ValueError` naming it, never handed to another engine. A regex is run
once per distinct value of the column (values belong to series, not to samples), and the
result is spread back column-wise.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import re2

from .selector import Matcher

MAX_PATTERN_BYTES = 64 * 1024
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
_OPTIONS.max_mem = 8 << 20  # bounds the DFA a caller's pattern may build


def compile_regex(pattern: str) -> re2._Regexp:
    if len(pattern.encode()) > MAX_PATTERN_BYTES:
        raise ValueError(f"regex longer than {MAX_PATTERN_BYTES} bytes")
    try:
        return re2.compile(f"^(?:{pattern})$", _OPTIONS)
    except re2.error as exc:
        raise ValueError(f"invalid regex {pattern[:200]!r}: {exc}") from None


def matches_empty(matcher: Matcher) -> bool:
    """Whether ``matcher`` matches a series lacking its label (value ``""``)."""
    if matcher.kind == "EQ":
        return matcher.value == ""
    if matcher.kind == "NEQ":
        return matcher.value != ""
    found = compile_regex(matcher.value).fullmatch("") is not None
    return found if matcher.kind == "RE" else not found


def check_selector(matchers: tuple[Matcher, ...]) -> None:
    """Prometheus' rule: one matcher must not match ``""``. `ValueError` otherwise."""
    if all(matches_empty(matcher) for matcher in matchers):
        raise ValueError(
            "vector selector must contain at least one non-empty matcher (one that does"
            " not match the empty string)"
        )


def value_mask(values: pa.Array | pa.ChunkedArray, matcher: Matcher) -> pa.Array:
    """True where ``values`` (nulls read as ``""``) satisfy ``matcher``."""
    values = pc.fill_null(values, "")
    if matcher.kind in ("EQ", "NEQ"):
        equal = pc.equal(values, matcher.value)
        return equal if matcher.kind == "EQ" else pc.invert(equal)
    regex = compile_regex(matcher.value)
    encoded = pc.dictionary_encode(values)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    hits = np.fromiter(
        (regex.fullmatch(text) is not None for text in encoded.dictionary.to_pylist()),
        dtype=bool,
        count=len(encoded.dictionary),
    )
    if matcher.kind == "NRE":
        hits = ~hits
    return pa.array(hits[np.asarray(encoded.indices.to_numpy(zero_copy_only=False), np.int64)])


def selector_mask(
    names: pa.Array | pa.ChunkedArray,
    labels: pa.Array | pa.ChunkedArray,
    matchers: tuple[Matcher, ...],
) -> pa.Array:
    """True for the label sets (``names``: presented metric names; ``labels``: presented
    labels, a map column) that every matcher holds for. `ValueError` names a bad regex,
    or a selector whose every matcher matches ``""``."""
    check_selector(matchers)
    keep: pa.Array = pa.array(np.ones(len(names), dtype=bool))
    for matcher in matchers:
        if matcher.name == "__name__":
            values = names
        else:
            values = pc.map_lookup(labels, matcher.name, "first")
        keep = pc.and_(keep, value_mask(values, matcher))
    return keep
