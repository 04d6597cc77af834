"""The canonical series string: the reference function and its vectorised twin agree."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollup.table.series import canonical_series, series_array

LABELS = pa.map_(pa.string(), pa.string())


def test_examples() -> None:
    assert canonical_series("cpu", None) == "cpu"
    assert canonical_series("cpu", {}) == "cpu"
    assert canonical_series("cpu", {"z": "1", "a": "2"}) == 'cpu{a="2",z="1"}'
    assert canonical_series("m", {"k": 'a\\b"c\nd'}) == 'm{k="a\\\\b\\"c\\nd"}'


def test_names_are_escaped_so_label_sets_never_collide() -> None:
    tricky = canonical_series("m", {'a="x",b': "y"})
    plain = canonical_series("m", {"a": "x", "b": "y"})
    assert tricky != plain


def test_vectorised_handles_null_empty_sliced_and_chunked() -> None:
    metric = pa.array(["a", "b", "c", "d"])
    labels = pa.array([[("y", "1"), ("x", "2")], None, [], [("k", "v")]], LABELS)
    expected = ['a{x="2",y="1"}', "b", "c", 'd{k="v"}']
    assert series_array(metric, labels).to_pylist() == expected
    assert series_array(metric.slice(1, 3), labels.slice(1, 3)).to_pylist() == expected[1:]
    chunked = series_array(
        pa.chunked_array([metric.slice(0, 2), metric.slice(2)]),
        pa.chunked_array([labels.slice(0, 2), labels.slice(2)]),
    )
    assert chunked.to_pylist() == expected
    assert series_array(metric.dictionary_encode(), labels).to_pylist() == expected
    assert series_array(pa.array([], pa.string()), pa.array([], LABELS)).to_pylist() == []
    assert series_array(pa.array(["a"]), pa.array([None], LABELS)).to_pylist() == ["a"]


def test_vectorised_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="rows"):
        series_array(pa.array(["a"]), pa.array([], LABELS))
    with pytest.raises(ValueError, match="null"):
        series_array(pa.array([None], pa.string()), pa.array([None], LABELS))


_text = st.text(alphabet=st.sampled_from('ab"\\\n=,{}é\u00ff\U0001f600 '), max_size=6)
_row = st.one_of(st.none(), st.dictionaries(_text.filter(bool), _text, max_size=5))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_text.filter(bool), _row), max_size=12), st.integers(0, 3))
def test_vectorised_agrees_with_the_reference(
    rows: list[tuple[str, dict[str, str] | None]], cut: int
) -> None:
    metric = pa.array([m for m, _ in rows], pa.string())
    labels = pa.array([None if d is None else list(d.items()) for _, d in rows], LABELS)
    expected = [canonical_series(m, d) for m, d in rows]
    assert series_array(metric, labels).to_pylist() == expected
    assert series_array(metric.slice(cut), labels.slice(cut)).to_pylist() == expected[cut:]
