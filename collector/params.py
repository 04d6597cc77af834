"""Query-string parameters of the read endpoints (``GET /v1/query``, ``GET /v1/conflicts``),
checked before any work is done.

They are network input: whatever the percent-decoding produced — U+FFFD for invalid
UTF-8 (yarl), lone surrogates for raw non-ASCII bytes (aiohttp's pure-Python parser
decodes with ``surrogateescape``), Unicode digits. Every check refuses with `QueryError`
(400 ``invalid_query`` naming ``param`` and what is wrong) and no exception of the
parsing itself reaches the client as a 500: ``int()`` of a digit ``str.isdigit`` accepts
(``²``), a date outside Python's range (`OverflowError`), ``int()`` past 4300 digits.
Numbers are ASCII digits only. A value echoed in an error is ``repr``-quoted and cut
short (a lone surrogate is shown as ``\\udcff``, never sent as one).

Times (PROTOCOL §2, `time_ns`): RFC 3339 (UTC when no offset is given) or unix
**seconds** with an optional fraction — the Prometheus HTTP API's convention — floored to
the nanosecond. A bare number ≥ 10^11 (the year 5138 in seconds) is refused naming the
unit: it is milliseconds or nanoseconds, and read as seconds it would answer for another
time silently. These times are 1970-01-01 ≤ t < 2262-04-11 (int64 nanoseconds).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from rollup.table import schemas

NS_PER_S = 1_000_000_000
MAX_UNIX_SECONDS = 10**11
INT64_LIMIT = 2**63
_SECONDS = re.compile(r"([0-9]+)(?:\.([0-9]+))?")
_DIGITS = re.compile(r"[0-9]+")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SHOWN = 64


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
    return QueryError(400, "invalid_query", detail, param=shown(param))


def shown(value: str) -> str:
    """``value`` safe to put in an answer: lone surrogates spelled ``\\udcxx``, at most
    64 characters."""
    safe = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return safe if len(safe) <= _SHOWN else safe[:_SHOWN] + "..."


def quoted(value: str) -> str:
    """``value`` quoted for a detail message (``repr`` escapes surrogates), cut short."""
    return repr(value if len(value) <= _SHOWN else value[:_SHOWN] + "...")


def check_names(query: Mapping[str, Sequence[str]], known: frozenset[str]) -> None:
    """Unknown parameters are refused: a typo must never widen a query silently."""
    for name in query:
        if name not in known:
            raise invalid(name, f"unknown parameter; known: {sorted(known)}")


def one(query: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = query.get(name) or []
    if len(values) > 1:
        raise invalid(name, "given more than once")
    return values[0] if values else None


def text(param: str, value: str, *, low: int, high: int) -> str:
    """``value`` if it is ``low..high`` UTF-8 bytes with no control character and
    nothing undecodable (a lone surrogate)."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if not low <= size <= high:
        raise invalid(param, f"must be {low}..{high} UTF-8 bytes, got {size}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise invalid(param, "has a control character or bytes that are not UTF-8")
    return value


def integer(param: str, value: str, *, low: int, high: int) -> int:
    """An ASCII decimal integer in ``low..high``."""
    if not _DIGITS.fullmatch(value) or len(value) > len(str(high)) + 1:
        raise invalid(param, f"must be an integer {low}..{high}, got {quoted(value)}")
    number = int(value)
    if not low <= number <= high:
        raise invalid(param, f"must be an integer {low}..{high}, got {number}")
    return number


def time_ns(param: str, value: str) -> int:
    """Unix seconds (fraction allowed) or RFC 3339 (UTC without an offset), as unix ns."""
    match = _SECONDS.fullmatch(value)
    if match is None:
        return _in_range(param, value, _rfc3339_ns(param, value, need_offset=False))
    whole, fraction = match.group(1), match.group(2) or ""
    if len(whole.lstrip("0")) > len(str(MAX_UNIX_SECONDS)) or int(whole) >= MAX_UNIX_SECONDS:
        raise invalid(
            param,
            f"{quoted(value)} is too large for unix seconds (a bare number must be below "
            "10^11; milliseconds and nanoseconds are not accepted): give unix seconds "
            "with an optional fraction (e.g. 1795755366.25) or RFC 3339",
        )
    return _in_range(param, value, int(whole) * NS_PER_S + int(fraction[:9].ljust(9, "0")))


def unix_ns_or_rfc3339(param: str, value: str) -> int:
    """Unix nanoseconds (ASCII digits, int64) or RFC 3339 with an offset (``Z`` or
    ``±hh:mm``), any year: for a filter, a time before 1970 or after 2262 is a time."""
    if _DIGITS.fullmatch(value):
        return integer(param, value, low=0, high=INT64_LIMIT - 1)
    return _rfc3339_ns(param, value, need_offset=True)


def _rfc3339_ns(param: str, value: str, *, need_offset: bool) -> int:
    unit = "unix nanoseconds" if need_offset else "unix seconds"
    try:
        moment = datetime.fromisoformat(
            value.replace("Z", "+00:00") if value.endswith("Z") else value
        )
        if need_offset and moment.tzinfo is None:
            raise invalid(param, f"needs a timezone (e.g. Z), got {quoted(value)}")
        moment = schemas.parse_timestamp(value)
    except (ValueError, OverflowError):
        raise invalid(param, f"not {unit} or RFC 3339: {quoted(value)}") from None
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000


def _in_range(param: str, value: str, ns: int) -> int:
    if not 0 <= ns < INT64_LIMIT:
        raise invalid(param, f"{quoted(value)} is outside 1970-01-01 .. 2262-04-11")
    return ns
