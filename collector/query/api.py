"""``GET /v1/query`` parameters (PROTOCOL §2): parsed and checked before any work is done.

``metric=M`` (required) ``&label=k=v`` (repeatable, all must hold) ``&agent=A``
``&from=T&to=T`` (half-open ``[from, to)``; RFC 3339, UTC when no offset is given, or unix
seconds with an optional fraction, as Prometheus's API — a bare number ≥ 10^11 is refused,
never read as milli- or nanoseconds (`collector.params.time_ns`); default ``to`` = now,
``from`` = ``to`` - 1 h) ``&table=points|rollup_1m``
``&step=1m`` (the ``rollup_1m`` shape: one row per minute and series) ``&version=N`` or
``&as_of=T`` (a time as ``from``/``to``: the committed part as of that snapshot,
`collector.query.committed`).

The range applies to the table's time column: ``ts`` for points, ``window_start`` for
``rollup_1m`` (a minute is in the answer when it starts in ``[from, to)``).

A bad parameter raises `QueryError` (400 ``invalid_query`` naming ``param`` and what is
wrong; `collector.params`); unknown parameters are refused too, so a typo never widens a
query silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from protocol.frame import MAX_AGENT_ID_BYTES

from ..params import (
    INT64_LIMIT,
    NS_PER_S,
    QueryError,
    check_names,
    integer,
    invalid,
    one,
    text,
    time_ns,
)

__all__ = ["LiveQuery", "QueryError", "invalid", "ns_to_datetime", "parse_query"]
NS_PER_MINUTE = 60 * NS_PER_S
DEFAULT_RANGE_NS = 3600 * NS_PER_S
MAX_LABELS = 64
PARAMS = frozenset({"metric", "label", "agent", "from", "to", "step", "table", "version", "as_of"})
REPEATABLE = frozenset({"label"})


@dataclass(frozen=True, slots=True)
class LiveQuery:
    """A checked query. Times are unix nanoseconds; ``table`` is the answer's shape."""

    metric: str
    labels: tuple[tuple[str, str], ...]
    agent: str | None
    from_ns: int
    to_ns: int
    table: str  # "points" | "rollup_1m"
    version: int | None = None
    as_of: datetime | None = None

    @property
    def start(self) -> datetime:
        return ns_to_datetime(self.from_ns)

    @property
    def end(self) -> datetime:
        return ns_to_datetime(self.to_ns)

    @property
    def points_range_ns(self) -> tuple[int, int]:
        """The ``ts`` range of the points that make up the answer: ``[from, to)`` for
        points; for ``rollup_1m``, every point whose minute starts in ``[from, to)``."""
        if self.table == "points":
            return self.from_ns, self.to_ns
        return _ceil_minute(self.from_ns), _ceil_minute(self.to_ns)


def _ceil_minute(ns: int) -> int:
    return -((-ns) // NS_PER_MINUTE) * NS_PER_MINUTE


def ns_to_datetime(ns: int) -> datetime:
    """Microsecond precision (the tables' unit), floored."""
    return datetime.fromtimestamp(ns // 1000 / 1_000_000, tz=UTC)


def _labels(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    if len(values) > MAX_LABELS:
        raise invalid("label", f"at most {MAX_LABELS} label filters, got {len(values)}")
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, label_value = value.partition("=")
        if not sep:
            raise invalid("label", f"{value!r} is not k=v")
        text("label", key, low=1, high=128)
        text("label", label_value, low=0, high=1024)
        if key in pairs and pairs[key] != label_value:
            raise invalid("label", f"label {key!r} asked with two values: nothing can match")
        pairs[key] = label_value
    return tuple(sorted(pairs.items()))


def parse_query(query: Mapping[str, Sequence[str]], *, now_ns: int) -> LiveQuery:
    """The checked query of a request's parameters (name → every value given)."""
    check_names(query, PARAMS)
    metric = one(query, "metric")
    if metric is None:
        raise invalid("metric", "required")
    text("metric", metric, low=1, high=256)
    agent = one(query, "agent")
    if agent is not None:
        text("agent", agent, low=1, high=MAX_AGENT_ID_BYTES)
    to_text, from_text = one(query, "to"), one(query, "from")
    to_ns = time_ns("to", to_text) if to_text is not None else now_ns
    from_ns = time_ns("from", from_text) if from_text is not None else to_ns - DEFAULT_RANGE_NS
    if from_ns >= to_ns:
        raise invalid("from", f"must be before to ({from_ns} >= {to_ns})")
    step, table = one(query, "step"), one(query, "table")
    if step is not None and step != "1m":
        raise invalid("step", f"only 1m is supported, got {step!r}")
    if table is not None and table not in ("points", "rollup_1m"):
        raise invalid("table", f"must be points or rollup_1m, got {table!r}")
    if step is not None and table == "points":
        raise invalid("step", "step=1m answers in the rollup_1m shape; not with table=points")
    shape = "rollup_1m" if step is not None else (table or "points")
    version_text, as_of_text = one(query, "version"), one(query, "as_of")
    if version_text is not None and as_of_text is not None:
        raise invalid("version", "give version or as_of, not both")
    version = None
    if version_text is not None:
        version = integer("version", version_text, low=1, high=INT64_LIMIT - 1)
    as_of = ns_to_datetime(time_ns("as_of", as_of_text)) if as_of_text is not None else None
    return LiveQuery(
        metric=metric,
        labels=_labels(query.get("label") or []),
        agent=agent,
        from_ns=from_ns,
        to_ns=to_ns,
        table=shape,
        version=version,
        as_of=as_of,
    )
