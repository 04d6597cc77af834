"""How read commands print rows (``lm-rollup query``, ``history``, ``sql``, ``lm-collector
query``): an aligned table for people, CSV or JSON for programs (times as RFC 3339,
label maps as objects)."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

FORMATS = ("table", "csv", "json")


def _cell(value: Any) -> Any:
    """A JSON-friendly form of one value: times as RFC 3339, maps as objects."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, list) and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        return dict(value)
    return value


def _text(value: Any) -> str:
    value = _cell(value)
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(value)


def _table_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.12g}"
    return _text(value)


def render(rows: Sequence[dict[str, Any]], columns: Sequence[str], fmt: str, out: TextIO) -> None:
    """Write ``rows`` (dicts keyed by ``columns``) as an aligned table, CSV, or JSON."""
    if fmt == "json":
        document = [{c: _cell(row.get(c)) for c in columns} for row in rows]
        out.write(json.dumps(document, ensure_ascii=False, indent=1) + "\n")
        return
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([_text(row.get(c)) for c in columns] for row in rows)
        return
    # For people: 12 significant digits hide float noise (157.18099999999998 → 157.181);
    # csv and json keep every digit.
    cells = [[_table_text(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    for line in [list(columns), *cells]:
        out.write("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() + "\n")
