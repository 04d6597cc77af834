"""Repeated label keys are found whatever the row length and the distance between the two
entries: rows of up to `NEARBY_CHECK_MAX_ENTRIES` entries are checked by comparing
neighbours, longer ones (and any repeat) by sorting; both must agree with a plain Python
oracle, error message included (the first offending row, its repeated key)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from protocol import _points_check as checks
from protocol.frame import FrameError, check_payload, decode_header
from tests.protocol import frame_vectors as v
from tests.protocol.test_frame import frame_of, table

Rows = list[list[tuple[str, str]] | None]


def oracle(rows: Rows) -> set[str] | None:
    """The messages `check_payload` may give for ``rows`` (the first offending row, any
    key it repeats), or None when they are valid."""
    for number, row in enumerate(rows):
        keys = [key for key, _value in row or []]
        repeated = {key for key in keys if keys.count(key) > 1}
        if repeated:
            return {f"labels: row {number} has duplicate key {key!r}" for key in repeated}
    return None


def outcome(rows: Rows) -> str | None:
    frame = frame_of(
        table(
            value=pa.array([1.0] * len(rows)),
            labels=pa.array(rows, v.LABELS),
        )
    )
    try:
        check_payload(frame, decode_header(frame), max_raw_bytes=1 << 26)
    except FrameError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("width", [2, 3, checks.NEARBY_CHECK_MAX_ENTRIES, 9, 64])
@pytest.mark.parametrize("distance", [1, 2, 7])
def test_a_repeat_at_any_distance_in_short_and_long_rows(width: int, distance: int) -> None:
    if distance >= width:
        pytest.skip("the row is shorter than the distance")
    keys = [f"k{i}" for i in range(width)]
    repeated = list(keys)
    repeated[distance] = keys[0]
    rows: Rows = [[(k, "v") for k in keys], None, [(k, "v") for k in repeated], []]
    message = f"labels: row 2 has duplicate key {keys[0]!r}"
    assert outcome(rows) == message and oracle(rows) == {message}
    rows[2] = [(k, "v") for k in keys]
    assert outcome(rows) is None


def test_equal_keys_in_neighbouring_rows_are_not_repeats() -> None:
    rows: Rows = [[("a", "1"), ("b", "1")], [("b", "2"), ("a", "2")], [("a", "3")], [("a", "4")]]
    assert outcome(rows) is None


@pytest.mark.parametrize("seed", range(12))
def test_random_frames_agree_with_the_oracle(seed: int) -> None:
    rng = random.Random(seed)
    rows: Rows = []
    for _ in range(rng.randint(1, 60)):
        if rng.random() < 0.1:
            rows.append(None)
            continue
        width = rng.choice([0, 1, 2, 3, 4, 8, 9, 12])
        pool = [f"k{i}" for i in range(rng.choice([width or 1, 2 * width + 1]))]
        rows.append([(rng.choice(pool), "v") for _ in range(width)])
    expected = oracle(rows)
    got = outcome(rows)
    assert got is None if expected is None else got in expected, (got, expected)
