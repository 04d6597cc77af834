"""Equal, as the differential test means it (issue 32): two Prometheus HTTP API answers
hold the same series (label sets), at the same timestamps, with values equal within 1e-9
relative, NaN equal to NaN (the JSON carries values as strings: ``"NaN"``, ``"+Inf"``,
``"-Inf"``).

`differences` returns what differs, in words (empty when equal); `equal` is its
emptiness. Series are matched by label set, never by position: a PromQL answer's order
is the engine's, not part of its meaning (no expression of the test uses ``sort``).
Both answers failing counts as equal when their ``errorType`` is the same.
"""

from __future__ import annotations

import math
from typing import Any

REL_TOL = 1e-9
LabelSet = frozenset[tuple[str, str]]


def parse_value(text: str) -> float:
    """A sample value as Prometheus writes it (Go's ``strconv.FormatFloat``)."""
    return float(text)  # "NaN", "+Inf", "-Inf" and decimals alike


def same_value(a: str, b: str) -> bool:
    x, y = parse_value(a), parse_value(b)
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if math.isinf(x) or math.isinf(y):
        return x == y
    return x == y or math.isclose(x, y, rel_tol=REL_TOL, abs_tol=0.0)


def _series(result: list[dict[str, Any]], key: str) -> tuple[dict[LabelSet, Any], list[str]]:
    found: dict[LabelSet, Any] = {}
    problems = []
    for entry in result:
        labels: LabelSet = frozenset(entry["metric"].items())
        if labels in found:
            problems.append(f"series {dict(labels)} twice in one answer")
        found[labels] = entry[key]
    return found, problems


def _samples(
    where: str, reference: list[list[Any]], ours: list[list[Any]], limit: int = 3
) -> list[str]:
    problems = []
    ref_times = [point[0] for point in reference]
    our_times = [point[0] for point in ours]
    if ref_times != our_times:
        missing = sorted(set(ref_times) - set(our_times))[:limit]
        extra = sorted(set(our_times) - set(ref_times))[:limit]
        problems.append(f"{where}: timestamps differ (missing {missing}, extra {extra})")
        return problems
    for (at, want), (_, got) in zip(reference, ours, strict=True):
        if not same_value(want, got):
            problems.append(f"{where} at {at}: reference {want}, ours {got}")
            if len(problems) >= limit:
                break
    return problems


def differences(reference: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """What differs between two whole API answers (``{"status": ..., "data": ...}``)."""
    if reference.get("status") != "success" or ours.get("status") != "success":
        if reference.get("status") == ours.get("status") and reference.get("errorType") == ours.get(
            "errorType"
        ):
            return []
        return [
            f"status: reference {reference.get('status')} {reference.get('error', '')!r}, "
            f"ours {ours.get('status')} {ours.get('error', '')!r}"
        ]
    return data_differences(reference["data"], ours["data"])


def data_differences(reference: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """What differs between two ``data`` objects (vector, matrix, scalar or string)."""
    kind = reference["resultType"]
    if ours["resultType"] != kind:
        return [f"resultType: reference {kind}, ours {ours['resultType']}"]
    if kind in ("scalar", "string"):
        ref_point, our_point = reference["result"], ours["result"]
        if ref_point[0] != our_point[0]:
            return [f"{kind} time: reference {ref_point[0]}, ours {our_point[0]}"]
        same = (
            same_value(*[p[1] for p in (ref_point, our_point)])
            if kind == "scalar"
            else (ref_point[1] == our_point[1])
        )
        return [] if same else [f"{kind}: reference {ref_point[1]}, ours {our_point[1]}"]
    key = "value" if kind == "vector" else "values"
    ref_series, problems = _series(reference["result"], key)
    our_series, our_problems = _series(ours["result"], key)
    problems += [f"ours: {p}" for p in our_problems]
    missing = [dict(s) for s in ref_series.keys() - our_series.keys()]
    extra = [dict(s) for s in our_series.keys() - ref_series.keys()]
    if missing:
        problems.append(f"{len(missing)} series missing from ours, e.g. {missing[:2]}")
    if extra:
        problems.append(f"{len(extra)} series only in ours, e.g. {extra[:2]}")
    for labels in sorted(ref_series.keys() & our_series.keys(), key=sorted):
        want, got = ref_series[labels], our_series[labels]
        if kind == "vector":
            want, got = [want], [got]
        problems += _samples(str(dict(sorted(labels))), want, got)
    return problems


def equal(reference: dict[str, Any], ours: dict[str, Any]) -> bool:
    return not differences(reference, ours)


def has_non_nan(answer: dict[str, Any]) -> bool:
    """Whether a successful answer holds at least one series (or scalar) with a value
    that is not NaN."""
    if answer.get("status") != "success":
        return False
    data = answer["data"]
    kind = data["resultType"]
    if kind == "scalar":
        return not math.isnan(parse_value(data["result"][1]))
    if kind == "string":
        return True
    if kind == "vector":
        return any(not math.isnan(parse_value(e["value"][1])) for e in data["result"])
    return any(
        not math.isnan(parse_value(point[1])) for e in data["result"] for point in e["values"]
    )
