"""The differential test's notion of equal (tests/collector/promql/diff/compare.py): it
holds for equal answers and fails on a changed value, a missing or extra series, a
shifted timestamp, a different result type or status."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.collector.promql.diff.compare import differences, equal, has_non_nan, same_value

A = {"__name__": "x", "job": "a"}
B = {"__name__": "x", "job": "b"}


def vector(*series: tuple[dict[str, str], str], at: float = 1763722033.0) -> dict[str, Any]:
    result = [{"metric": labels, "value": [at, value]} for labels, value in series]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def matrix(*series: tuple[dict[str, str], list[tuple[float, str]]]) -> dict[str, Any]:
    result = [{"metric": labels, "values": [list(p) for p in points]} for labels, points in series]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def scalar(value: str, at: float = 1763722033.0) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "scalar", "result": [at, value]}}


MATRIX = matrix(
    (A, [(1763722000, "1"), (1763722045, "NaN"), (1763722090, "+Inf")]),
    (B, [(1763722000, "0.30000000000000004"), (1763722045, "-2.5e-07")]),
)


def test_equal_answers_are_equal_in_any_series_order() -> None:
    assert equal(MATRIX, copy.deepcopy(MATRIX))
    reordered = copy.deepcopy(MATRIX)
    reordered["data"]["result"].reverse()
    assert equal(MATRIX, reordered)
    assert equal(vector((A, "1"), (B, "2")), vector((B, "2"), (A, "1")))
    assert equal(scalar("NaN"), scalar("NaN"))
    assert equal(vector(), vector())
    error = {"status": "error", "errorType": "bad_data", "error": "parse error"}
    assert equal(error, {**error, "error": "another text"})


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("1", "1.0000000001", True),  # 1e-10 relative
        ("1", "1.000000002", False),  # 2e-9 relative
        ("1e300", "1.0000000001e300", True),
        ("0", "1e-300", False),  # relative only: no absolute slack around 0
        ("0", "-0", True),
        ("NaN", "NaN", True),
        ("NaN", "0", False),
        ("0", "NaN", False),
        ("+Inf", "+Inf", True),
        ("+Inf", "-Inf", False),
        ("+Inf", "1e308", False),
    ],
)
def test_values(a: str, b: str, same: bool) -> None:
    assert same_value(a, b) is same and same_value(b, a) is same


def test_a_changed_value_differs() -> None:
    changed = copy.deepcopy(MATRIX)
    changed["data"]["result"][1]["values"][0][1] = "0.3000001"
    problems = differences(MATRIX, changed)
    assert len(problems) == 1 and "0.30000000000000004" in problems[0]
    assert not equal(vector((A, "1")), vector((A, "2")))
    assert not equal(scalar("1"), scalar("1.5"))
    nan = copy.deepcopy(MATRIX)
    nan["data"]["result"][0]["values"][1][1] = "0"
    assert not equal(MATRIX, nan)


def test_a_missing_or_extra_series_differs() -> None:
    missing = copy.deepcopy(MATRIX)
    del missing["data"]["result"][0]
    assert any("missing from ours" in p for p in differences(MATRIX, missing))
    assert any("only in ours" in p for p in differences(missing, MATRIX))
    relabeled = vector((A, "1"), ({**B, "extra": "1"}, "2"))
    assert not equal(vector((A, "1"), (B, "2")), relabeled)
    assert not equal(vector((A, "1")), vector())
    twice = vector((A, "1"), (A, "1"))
    assert any("twice" in p for p in differences(vector((A, "1")), twice))


def test_a_shifted_timestamp_or_a_missing_sample_differs() -> None:
    shifted = copy.deepcopy(MATRIX)
    shifted["data"]["result"][0]["values"][2][0] = 1763722090.001
    assert any("timestamps differ" in p for p in differences(MATRIX, shifted))
    short = copy.deepcopy(MATRIX)
    short["data"]["result"][1]["values"].pop()
    assert any("timestamps differ" in p for p in differences(MATRIX, short))
    assert not equal(vector((A, "1"), at=100.0), vector((A, "1"), at=100.5))
    assert not equal(scalar("1", at=100.0), scalar("1", at=101.0))


def test_a_different_shape_or_status_differs() -> None:
    assert not equal(vector((A, "1")), matrix((A, [(1763722033.0, "1")])))
    error = {"status": "error", "errorType": "unavailable", "error": "remote read failed"}
    assert not equal(vector(), error)
    assert not equal(error, vector())
    assert not equal(error, {**error, "errorType": "execution"})


def test_has_non_nan() -> None:
    assert has_non_nan(MATRIX) and has_non_nan(vector((A, "NaN"), (B, "0")))
    assert not has_non_nan(vector()) and not has_non_nan(vector((A, "NaN")))
    assert not has_non_nan(matrix((A, [(1, "NaN")]))) and not has_non_nan(scalar("NaN"))
    assert has_non_nan(scalar("0"))
    assert not has_non_nan({"status": "error", "errorType": "bad_data", "error": "x"})
