"""Reading points from a file: JSON lines or CSV.

JSON lines (``.jsonl``, ``.ndjson``, ``.json``): one object per line,
``{"ts": <ns int or RFC 3339 string>, "metric": "...", "value": 1.0, "labels": {...}}``;
``labels`` may be absent or null. Blank lines are skipped.

CSV (``.csv``): columns ``ts,metric,value[,labels]``; a first row naming those columns is
a header and skipped. ``labels`` is empty, a JSON object, or ``k=v;k2=v2``. ``value``
accepts anything `float` does (including ``nan``/``inf``).

Rules checked here (PROTOCOL §1): metric 1..256 UTF-8 bytes; at most 64 labels, keys
1..128 bytes and unique, values 0..1024 bytes; ts a non-negative integer of nanoseconds
or RFC 3339 with an explicit offset (``Z`` or ``±HH:MM``, up to 9 fraction digits).
Every problem raises `PointsFileError` naming the file, the 1-based line and the field.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from protocol.frame_encode import points_table

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))"
)
_CSV_HEADER = ["ts", "metric", "value", "labels"]


class PointsFileError(ValueError):
    """A points file is malformed. ``line`` is 1-based; ``field`` names the column or key
    (``None`` when the whole line is wrong)."""

    def __init__(self, path: str, line: int, field: str | None, problem: str) -> None:
        where = f"{path}:{line}" + (f": field {field!r}" if field else "")
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line = line
        self.field = field
        self.problem = problem


@dataclass(frozen=True, slots=True)
class Point:
    ts_ns: int
    metric: str
    value: float
    labels: dict[str, str] | None


def read_points(path: str | Path, *, file_format: str | None = None) -> Iterator[Point]:
    """Yield the points of ``path`` in file order. ``file_format`` is ``"jsonl"`` or
    ``"csv"``; by default it follows the suffix. Raises `PointsFileError`."""
    path = Path(path)
    chosen = file_format or _format_of(path)
    with open(path, encoding="utf-8", newline="") as handle:
        if chosen == "jsonl":
            yield from _jsonl_points(str(path), handle)
        elif chosen == "csv":
            yield from _csv_points(str(path), handle)
        else:
            raise ValueError(f"unknown points file format {chosen!r} (jsonl or csv)")


def batches_of(points: Iterable[Point], size: int) -> Iterator[pa.Table]:
    """Group points into canonical Arrow tables of at most ``size`` rows."""
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    chunk: list[Point] = []
    for point in points:
        chunk.append(point)
        if len(chunk) == size:
            yield _table(chunk)
            chunk = []
    if chunk:
        yield _table(chunk)


def parse_ts(raw: Any) -> int:
    """Nanoseconds since the epoch from an int or an RFC 3339 string (`ValueError`)."""
    if isinstance(raw, bool):
        raise ValueError("expected nanoseconds or an RFC 3339 string, got a boolean")
    if isinstance(raw, int):
        if raw < 0:
            raise ValueError(f"must be >= 0, got {raw}")
        return raw
    if not isinstance(raw, str):
        raise ValueError(f"expected nanoseconds or an RFC 3339 string, got {raw!r}")
    text = raw.strip()
    if text.isdigit():
        return int(text)
    match = _RFC3339.fullmatch(text)
    if not match:
        raise ValueError(f"not RFC 3339 with an offset (e.g. 2026-11-21T10:00:00Z): {raw!r}")
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    fraction = (match.group(7) or "").ljust(9, "0")
    offset = timedelta(0)
    if match.group(9):
        sign = 1 if match.group(9) == "+" else -1
        offset = sign * timedelta(hours=int(match.group(10)), minutes=int(match.group(11)))
    try:
        moment = datetime(year, month, day, hour, minute, second, tzinfo=UTC) - offset
    except ValueError as exc:
        raise ValueError(f"invalid date/time {raw!r}: {exc}") from None
    ns = int((moment - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()) * 1_000_000_000
    ns += int(fraction)
    if ns < 0:
        raise ValueError(f"before 1970: {raw!r}")
    return ns


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    raise ValueError(f"cannot tell the format of {path} from its suffix; use jsonl or csv")


def _jsonl_points(path: str, lines: Iterable[str]) -> Iterator[Point]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise PointsFileError(path, number, None, f"not valid JSON: {exc}") from None
        if not isinstance(record, dict):
            raise PointsFileError(path, number, None, "expected a JSON object")
        for required in ("ts", "metric", "value"):
            if required not in record:
                raise PointsFileError(path, number, required, "missing")
        value = record["value"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PointsFileError(path, number, "value", f"expected a number, got {value!r}")
        labels = record.get("labels")
        if labels is not None and not isinstance(labels, dict):
            raise PointsFileError(path, number, "labels", "expected an object or null")
        yield _point(path, number, record["ts"], record["metric"], float(value), labels)


def _csv_points(path: str, handle: Iterable[str]) -> Iterator[Point]:
    reader = csv.reader(handle)
    first = True
    for row in reader:
        number = reader.line_num  # the row's last physical line (quoted newlines)
        if first and [c.strip().lower() for c in row] in (_CSV_HEADER, _CSV_HEADER[:3]):
            first = False
            continue
        first = False
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) not in (3, 4):
            raise PointsFileError(
                path,
                number,
                None,
                f"expected 3 or 4 columns (ts,metric,value[,labels]), got {len(row)}",
            )
        try:
            value = float(row[2])
        except ValueError:
            raise PointsFileError(
                path, number, "value", f"expected a number, got {row[2]!r}"
            ) from None
        labels = _csv_labels(path, number, row[3]) if len(row) == 4 else None
        yield _point(path, number, row[0], row[1], value, labels)


def _csv_labels(path: str, number: int, text: str) -> dict[str, str] | None:
    text = text.strip()
    if not text:
        return None
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise PointsFileError(path, number, "labels", f"not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise PointsFileError(path, number, "labels", "expected a JSON object")
        return parsed
    labels: dict[str, str] = {}
    for pair in text.split(";"):
        if not pair.strip():
            continue
        key, sep, value = pair.partition("=")
        if not sep:
            raise PointsFileError(path, number, "labels", f"expected k=v, got {pair!r}")
        key = key.strip()
        if key in labels:
            raise PointsFileError(path, number, "labels", f"duplicate label key {key!r}")
        labels[key] = value
    return labels


def _point(
    path: str, number: int, ts: Any, metric: Any, value: float, labels: dict[str, Any] | None
) -> Point:
    try:
        ts_ns = parse_ts(ts)
    except ValueError as exc:
        raise PointsFileError(path, number, "ts", str(exc)) from None
    if not isinstance(metric, str) or not 1 <= len(metric.encode("utf-8")) <= 256:
        raise PointsFileError(path, number, "metric", "must be a string of 1..256 bytes")
    return Point(ts_ns, metric, value, _check_labels(path, number, labels))


def _check_labels(path: str, number: int, labels: dict[str, Any] | None) -> dict[str, str] | None:
    if labels is None:
        return None
    if len(labels) > 64:
        raise PointsFileError(path, number, "labels", f"at most 64 labels, got {len(labels)}")
    for key, value in labels.items():
        field = f"labels.{key}"
        if not 1 <= len(key.encode("utf-8")) <= 128:
            raise PointsFileError(path, number, field, "label names must be 1..128 bytes")
        if not isinstance(value, str):
            raise PointsFileError(path, number, field, f"expected a string, got {value!r}")
        if len(value.encode("utf-8")) > 1024:
            raise PointsFileError(path, number, field, "label values must be <= 1024 bytes")
    return labels


def _table(points: list[Point]) -> pa.Table:
    return points_table(
        [p.ts_ns for p in points],
        [p.metric for p in points],
        [p.value for p in points],
        [p.labels for p in points],
    )
