"""The receivers' identity rule: points → one frame under a content-derived identity."""

from __future__ import annotations

import math
import uuid

import pytest

from collector.receivers.frames import (
    PointRows,
    build_frame,
    content_boot_id,
    content_digest,
    point_problem,
)
from protocol.frame import FrameError, decode_frame

T0 = 1_760_000_000_000_000_000


def rows_of(*points: tuple[int, str, float, dict[str, str]]) -> PointRows:
    rows = PointRows()
    for point in points:
        rows.append(*point)
    return rows


SAMPLE = rows_of(
    (T0, "cpu", 1.5, {"host": "a", "dc": "x"}),
    (T0 + 1, "cpu", 2.5, {"dc": "x", "host": "a"}),
    (T0 + 2, "up", 1.0, {}),
)


def test_the_same_points_always_make_the_same_frame_and_identity() -> None:
    first, header = build_frame("prom-1", SAMPLE)
    again, _ = build_frame(
        "prom-1", rows_of(*[(t, m, v, lab or {}) for t, m, v, lab in _zip(SAMPLE)])
    )
    assert first == again
    assert (header.seq_start, header.seq_end, header.record_count) == (0, 2, 3)
    assert header.boot_id == content_boot_id(SAMPLE)
    assert header.boot_id.version == 8 and header.boot_id.variant == uuid.RFC_4122
    decoded = decode_frame(first)
    assert decoded.points.column("metric").to_pylist() == ["cpu", "cpu", "up"]
    assert decoded.points.column("value").to_pylist() == [1.5, 2.5, 1.0]


def test_label_order_does_not_change_the_identity_but_every_field_does() -> None:
    base = content_digest(SAMPLE)
    reordered = rows_of(
        (T0, "cpu", 1.5, {"dc": "x", "host": "a"}),
        (T0 + 1, "cpu", 2.5, {"host": "a", "dc": "x"}),
        (T0 + 2, "up", 1.0, {}),
    )
    assert content_digest(reordered) == base
    variants = [
        rows_of((T0 + 5, "cpu", 1.5, {"host": "a", "dc": "x"})),  # fewer rows
        rows_of(*[(T0 + 9, m, v, lab or {}) for _, m, v, lab in _zip(SAMPLE)]),
        rows_of(*[(t, m + "x", v, lab or {}) for t, m, v, lab in _zip(SAMPLE)]),
        rows_of(*[(t, m, v + 1, lab or {}) for t, m, v, lab in _zip(SAMPLE)]),
        rows_of(*[(t, m, v, {"host": "b"}) for t, m, v, _ in _zip(SAMPLE)]),
        rows_of(*reversed(list(_zip(SAMPLE)))),  # order is content: seq follows it
        # length prefixes: "ab"+"c" and "a"+"bc" are different points
        rows_of((T0, "ab", 1.0, {"c": ""})),
    ]
    digests = {content_digest(variant) for variant in variants}
    assert base not in digests and len(digests) == len(variants)
    assert content_digest(rows_of((T0, "a", 1.0, {"bc": ""}))) != content_digest(variants[-1])


def _zip(rows: PointRows) -> list[tuple[int, str, float, dict[str, str] | None]]:
    return list(zip(rows.ts_ns, rows.metrics, rows.values, rows.labels, strict=True))


def test_nan_payloads_and_signed_zeros_are_different_content() -> None:
    quiet = rows_of((T0, "m", math.nan, {}))
    negative_zero = rows_of((T0, "m", -0.0, {}))
    assert content_digest(quiet) != content_digest(rows_of((T0, "m", 0.0, {})))
    assert content_digest(negative_zero) != content_digest(rows_of((T0, "m", 0.0, {})))


def test_point_problem_names_each_rule_the_frame_enforces() -> None:
    assert point_problem(T0, "cpu", {"a": "b"}) is None
    assert "int64" in (point_problem(2**63, "cpu", {}) or "")
    assert "metric name" in (point_problem(T0, "", {}) or "")
    assert "metric name" in (point_problem(T0, "m" * 257, {}) or "")
    assert "65 labels" in (point_problem(T0, "m", {f"k{i}": "" for i in range(65)}) or "")
    assert "label name" in (point_problem(T0, "m", {"k" * 129: "v"}) or "")
    assert "value" in (point_problem(T0, "m", {"k": "v" * 1025}) or "")
    assert "UTF-8" in (point_problem(T0, "m", {"k": "\ud800"}) or "")
    # What point_problem lets through, the frame takes.
    build_frame("a", rows_of((T0, "m" * 256, 1.0, {f"k{i}": "v" * 1024 for i in range(64)})))


def test_build_frame_refuses_what_no_frame_can_carry() -> None:
    with pytest.raises(ValueError):
        build_frame("a", PointRows())
    with pytest.raises(FrameError):
        build_frame("a" * 129, SAMPLE)
