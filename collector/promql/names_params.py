"""Parameters of the names endpoints (PROTOCOL §5 "Names"), checked before any work.

``match[]`` (repeatable series selectors, `collector.promql.selector`), ``start`` and
``end`` (unix seconds with an optional fraction, or RFC 3339, as Prometheus' API) and
``limit`` (a positive integer; 0 or absent: no limit). From the query string or, for
``POST``, a form body (Grafana sends both ways).

The range: both given, as given; ``start`` alone, through now; ``end`` alone, or neither,
the ``query.names_default_range_s`` before it. ``start`` after ``end``, or a range longer
than ``query.names_max_range_s``, is 400.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..params import NS_PER_S, QueryError, time_ns
from .selector import Matcher, SelectorError, parse_selector

MAX_MATCH_PARAMS = 64
MAX_LIMIT = 10_000_000
KNOWN = frozenset({"match[]", "start", "end", "limit"})


def bad_data(message: str) -> QueryError:
    return QueryError(400, "bad_data", message)


@dataclass(frozen=True, slots=True)
class NamesRequest:
    selectors: tuple[tuple[Matcher, ...], ...]  # empty: every series
    start_ns: int
    end_ns: int
    limit: int  # 0: none


def _one(params: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = params.get(name) or []
    if len(values) > 1:
        raise bad_data(f"{name} given {len(values)} times")
    return values[0] if values else None


def _time(name: str, value: str) -> int:
    try:
        return time_ns(name, value)
    except QueryError as exc:
        raise bad_data(f"invalid parameter {name!r}: {exc.detail}") from None


def parse_names(
    params: Mapping[str, Sequence[str]],
    *,
    now_ns: int,
    default_range_s: float,
    max_range_s: float,
) -> NamesRequest:
    """The checked request; `QueryError` (400 ``bad_data``) naming the parameter."""
    unknown = sorted(set(params) - KNOWN)
    if unknown:
        raise bad_data(f"unknown parameter {unknown[0]!r} (known: {', '.join(sorted(KNOWN))})")
    texts = list(params.get("match[]") or [])
    if len(texts) > MAX_MATCH_PARAMS:
        raise bad_data(f"at most {MAX_MATCH_PARAMS} match[] parameters, got {len(texts)}")
    selectors = []
    for text in texts:
        try:
            selectors.append(parse_selector(text))
        except SelectorError as exc:
            raise bad_data(f"invalid parameter 'match[]' {text[:200]!r}: {exc}") from None
    start_text, end_text = _one(params, "start"), _one(params, "end")
    default_ns = int(default_range_s * NS_PER_S)
    end_ns = _time("end", end_text) if end_text is not None else now_ns
    start_ns = _time("start", start_text) if start_text is not None else end_ns - default_ns
    if start_ns > end_ns:
        raise bad_data("invalid parameter 'end': end timestamp must not be before start time")
    if end_ns - start_ns > int(max_range_s * NS_PER_S):
        raise bad_data(
            f"the range from start to end is {(end_ns - start_ns) / NS_PER_S:g} s, longer than"
            f" query.names_max_range_s ({max_range_s:g} s): narrow start/end"
        )
    limit_text = _one(params, "limit")
    limit = 0
    if limit_text is not None:
        if not limit_text.isdigit() or int(limit_text) > MAX_LIMIT:
            raise bad_data(f"invalid parameter 'limit': {limit_text[:40]!r} is not 0..{MAX_LIMIT}")
        limit = int(limit_text)
    return NamesRequest(tuple(selectors), start_ns, end_ns, limit)
