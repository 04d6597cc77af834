"""`protocol.prom_names` (PROTOCOL §5 "Series model"): the test vectors of docs/reading.md,
and the column-wise presentation equal to the reference on random label sets."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.prom_names import (
    escape_label_array,
    escape_metric_array,
    lm_escape_label,
    lm_escape_metric,
    present_labels,
    presented_labels_array,
)

METRIC_VECTORS = [
    ("http.server.duration", "http_server_duration"),
    ("up", "up"),
    ("a:b", "a:b"),
    ("1xx", "_1xx"),
    ("é.ms", "__ms"),
    ("a-b c", "a_b_c"),
    ("__x__", "__x__"),
]
LABEL_VECTORS = [
    ("service.name", "service_name"),
    ("a:b", "a_b"),
    ("9lives", "_9lives"),
    ("ünit", "_nit"),
    ("le", "le"),
]


@pytest.mark.parametrize(("stored", "presented"), METRIC_VECTORS)
def test_metric_vectors(stored: str, presented: str) -> None:
    assert lm_escape_metric(stored) == presented
    assert escape_metric_array(pa.array([stored])).to_pylist() == [presented]


@pytest.mark.parametrize(("stored", "presented"), LABEL_VECTORS)
def test_label_vectors(stored: str, presented: str) -> None:
    assert lm_escape_label(stored) == presented
    assert escape_label_array(pa.array([stored])).to_pylist() == [presented]


def test_presented_set_drops_empty_values_names_and_clashes() -> None:
    labels = {"x.y": "dotted", "x_y": "exact", "__name__": "stored", "e": "", "z": "1"}
    pairs, dropped = present_labels("a.b", labels)
    # The stored name equal to its presentation keeps it; the other is dropped.
    assert pairs == (("__name__", "a_b"), ("x_y", "exact"), ("z", "1"))
    assert dropped == 1
    # Without an exact owner, the byte-smallest stored name wins.
    pairs, dropped = present_labels("m", {"x.y": "dot", "x-y": "dash"})
    assert pairs == (("__name__", "m"), ("x_y", "dash"))
    assert dropped == 1


NAMES = st.sampled_from(["a", "b", "a.b", "a_b", "a-b", "_", "1x", "__name__", "é", "x:y", ""])
VALUES = st.sampled_from(["", "v", "w", '"', "é"])
MAPS = st.one_of(st.none(), st.dictionaries(NAMES, VALUES, max_size=6))


@settings(max_examples=60, deadline=None)
@given(st.lists(MAPS, max_size=40), st.integers(0, 5))
def test_column_wise_equals_the_reference(maps: list[dict[str, str] | None], cut: int) -> None:
    column = pa.array(
        [None if m is None else list(m.items()) for m in maps],
        pa.map_(pa.string(), pa.string()),
    )
    sliced = column.slice(min(cut, len(column)))
    got, dropped = presented_labels_array(sliced)
    want_dropped = 0
    for stored, presented in zip(maps[min(cut, len(maps)) :], got.to_pylist(), strict=True):
        pairs, lost = present_labels("m", stored)
        want_dropped += lost
        assert [pair for pair in pairs if pair[0] != "__name__"] == [
            tuple(pair) for pair in presented or []
        ]
    assert dropped == want_dropped
