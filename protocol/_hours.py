"""UTC hours: the partition unit of every by-time index, catalog and rollup table
(``date=YYYY-MM-DD/hour=HH`` in keys, ``YYYY-MM-DDTHH`` in the ledger). Part of
`protocol.keys`' API (``keys.UtcHour``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime

from protocol._identity_keys import KeyFormatError

NS_PER_S = 1_000_000_000
_HOUR_RE = r"date=(\d{4}-\d{2}-\d{2})/hour=(\d{2})"


@dataclass(frozen=True, slots=True, order=True)
class UtcHour:
    """One UTC hour: the partition unit of every by-time index and rollup table."""

    day: date
    hour: int

    def __post_init__(self) -> None:
        if not 0 <= self.hour <= 23:
            raise KeyFormatError(f"hour must be 0..23, got {self.hour}")

    @classmethod
    def from_unix_ns(cls, unix_ns: int) -> UtcHour:
        moment = datetime.fromtimestamp(unix_ns // NS_PER_S, tz=UTC)
        return cls(moment.date(), moment.hour)

    @classmethod
    def parse_partition(cls, text: str) -> UtcHour:
        """Parse ``date=YYYY-MM-DD/hour=HH``."""
        match = re.fullmatch(_HOUR_RE, text)
        if not match:
            raise KeyFormatError(f"not a date=YYYY-MM-DD/hour=HH partition: {text!r}")
        return cls._from_parts(match.group(1), match.group(2), text)

    @classmethod
    def parse_iso(cls, text: str) -> UtcHour:
        """Parse the ledger's ``YYYY-MM-DDTHH``."""
        match = re.fullmatch(r"(\d{4}-\d{2}-\d{2})T(\d{2})", text)
        if not match:
            raise KeyFormatError(f"not a YYYY-MM-DDTHH hour: {text!r}")
        return cls._from_parts(match.group(1), match.group(2), text)

    @classmethod
    def _from_parts(cls, day_text: str, hour_text: str, whole: str) -> UtcHour:
        try:
            day = date.fromisoformat(day_text)
        except ValueError as exc:
            raise KeyFormatError(f"bad date in {whole!r}: {exc}") from None
        return cls(day, int(hour_text))

    @property
    def partition(self) -> str:
        return f"date={self.day.isoformat()}/hour={self.hour:02d}"

    @property
    def iso(self) -> str:
        return f"{self.day.isoformat()}T{self.hour:02d}"

    @property
    def start_ns(self) -> int:
        start = datetime(self.day.year, self.day.month, self.day.day, self.hour, tzinfo=UTC)
        return int(start.timestamp()) * NS_PER_S

    def next(self) -> UtcHour:
        return UtcHour.from_unix_ns(self.start_ns + 3600 * NS_PER_S)

    def shifted(self, hours: int) -> UtcHour:
        return UtcHour.from_unix_ns(self.start_ns + hours * 3600 * NS_PER_S)

    def __str__(self) -> str:
        return self.iso


def hours_between(first: UtcHour, last: UtcHour) -> list[UtcHour]:
    """Every hour from ``first`` to ``last`` inclusive (empty when last < first)."""
    hours: list[UtcHour] = []
    current = first
    while current <= last:
        hours.append(current)
        current = current.next()
    return hours
