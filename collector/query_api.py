"""``GET /v1/query`` parameters (PROTOCOL §2): parsed and checked before any work is done.

``metric=M`` (required) ``&label=k=v`` (repeatable, all must hold) ``&agent=A``
``&from=T&to=T`` (half-open ``[from, to)``; RFC 3339, UTC when no offset is given, or unix
nanoseconds; default ``to`` = now, ``from`` = ``to`` - 1 h) ``&table=points|rollup_1m``
``&step=1m`` (the ``rollup_1m`` shape: one row per minute and series) ``&version=N`` or
``&as_of=T`` (the committed part as of that snapshot, `rollup.travel`).

The range applies to the table's time column: ``ts`` for points, ``window_start`` for
``rollup_1m`` (a minute is in the answer when it starts in ``[from, to)``).

A bad parameter raises `QueryError` (400 ``invalid_query`` naming ``param`` and what is
wrong); unknown parameters are refused too, so a typo never widens a query silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rollup import schemas

NS_PER_S = 1_000_000_000
NS_PER_MINUTE = 60 * NS_PER_S
DEFAULT_RANGE_NS = 3600 * NS_PER_S
MAX_LABELS = 64
PARAMS = frozenset({"metric", "label", "agent", "from", "to", "step", "table", "version", "as_of"})
REPEATABLE = frozenset({"label"})


class QueryError(Exception):
    """An answer other than 200, with its JSON body: ``{"error", "param"?, "detail"}``."""

    def __init__(
        self, status: int, error: str, detail: str, *, param: str | None = None, **extra: Any
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.param = param
        self.extra = extra

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.error}
        if self.param is not None:
            body["param"] = self.param
        body["detail"] = self.detail
        body.update(self.extra)
        return body


def invalid(param: str, detail: str) -> QueryError:
    return QueryError(400, "invalid_query", detail, param=param)


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


def parse_time_ns(param: str, text: str) -> int:
    """Unix nanoseconds, or RFC 3339 (UTC when no offset is given)."""
    if text.isdigit():
        value = int(text)
        if value >= 2**63:
            raise invalid(param, f"{text} is beyond int64 nanoseconds")
        return value
    try:
        moment = schemas.parse_timestamp(text)
    except ValueError as exc:
        raise invalid(param, f"not unix nanoseconds or RFC 3339: {exc}") from None
    seconds = int(moment.replace(microsecond=0).timestamp())
    return seconds * NS_PER_S + moment.microsecond * 1000


def _one(query: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = query.get(name) or []
    if len(values) > 1:
        raise invalid(name, "given more than once")
    return values[0] if values else None


def _text(param: str, value: str, *, low: int, high: int) -> str:
    size = len(value.encode("utf-8", "surrogatepass"))
    if not low <= size <= high:
        raise invalid(param, f"must be {low}..{high} UTF-8 bytes, got {size}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise invalid(param, "has a control character or undecodable bytes")
    return value


def _labels(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    if len(values) > MAX_LABELS:
        raise invalid("label", f"at most {MAX_LABELS} label filters, got {len(values)}")
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, label_value = value.partition("=")
        if not sep:
            raise invalid("label", f"{value!r} is not k=v")
        _text("label", key, low=1, high=128)
        _text("label", label_value, low=0, high=1024)
        if key in pairs and pairs[key] != label_value:
            raise invalid("label", f"label {key!r} asked with two values: nothing can match")
        pairs[key] = label_value
    return tuple(sorted(pairs.items()))


def parse_query(query: Mapping[str, Sequence[str]], *, now_ns: int) -> LiveQuery:
    """The checked query of a request's parameters (name → every value given)."""
    for name in query:
        if name not in PARAMS:
            raise invalid(name, f"unknown parameter; known: {sorted(PARAMS)}")
    metric = _one(query, "metric")
    if metric is None:
        raise invalid("metric", "required")
    _text("metric", metric, low=1, high=256)
    agent = _one(query, "agent")
    if agent is not None:
        _text("agent", agent, low=1, high=128)
    to_text, from_text = _one(query, "to"), _one(query, "from")
    to_ns = parse_time_ns("to", to_text) if to_text is not None else now_ns
    from_ns = (
        parse_time_ns("from", from_text) if from_text is not None else to_ns - DEFAULT_RANGE_NS
    )
    if from_ns >= to_ns:
        raise invalid("from", f"must be before to ({from_ns} >= {to_ns})")
    step, table = _one(query, "step"), _one(query, "table")
    if step is not None and step != "1m":
        raise invalid("step", f"only 1m is supported, got {step!r}")
    if table is not None and table not in ("points", "rollup_1m"):
        raise invalid("table", f"must be points or rollup_1m, got {table!r}")
    if step is not None and table == "points":
        raise invalid("step", "step=1m answers in the rollup_1m shape; not with table=points")
    shape = "rollup_1m" if step is not None else (table or "points")
    version_text, as_of_text = _one(query, "version"), _one(query, "as_of")
    if version_text is not None and as_of_text is not None:
        raise invalid("version", "give version or as_of, not both")
    version: int | None = None
    if version_text is not None:
        if not version_text.isdigit() or not 1 <= int(version_text) < 2**63:
            raise invalid("version", f"must be a positive integer, got {version_text!r}")
        version = int(version_text)
    as_of = ns_to_datetime(parse_time_ns("as_of", as_of_text)) if as_of_text else None
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
