"""The canonical series string (PROTOCOL §4): one text per (metric, label set).

``metric`` followed, when there are labels, by ``{name="value",...}`` with the labels
sorted by name (code point order, which is also UTF-8 byte order) and ``\\``, ``"`` and
newline escaped as ``\\\\``, ``\\"`` and ``\\n`` (Prometheus text style). No braces when
there are no labels (``None`` or empty).

Decision: label *names* are escaped the same way as values. For every name Prometheus
allows this changes nothing; for the odd names PROTOCOL §1 allows (any UTF-8) it keeps
two different label sets from producing the same string.

`canonical_series` is the reference; `series_array` is the same function vectorised over
pyarrow arrays (pure pyarrow: the Spark executors call it on Arrow batches). They agree on
every input (tests compare them on random label sets).
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def canonical_series(metric: str, labels: Mapping[str, str] | None) -> str:
    """The canonical series string of one sample's metric and labels."""
    if not labels:
        return metric
    body = ",".join(f'{_escape(name)}="{_escape(labels[name])}"' for name in sorted(labels))
    return f"{metric}{{{body}}}"


def _escape_array(values: pa.Array) -> pa.Array:
    # Backslash first, so the backslashes the later replacements add are not doubled.
    escaped = pc.replace_substring(values, "\\", "\\\\")
    escaped = pc.replace_substring(escaped, '"', '\\"')
    return pc.replace_substring(escaped, "\n", "\\n")


def series_array(
    metric: pa.Array | pa.ChunkedArray, labels: pa.Array | pa.ChunkedArray
) -> pa.StringArray:
    """`canonical_series` for each row of ``metric`` (string-like) and ``labels``
    (``map<string, string>``; a null map means no labels). Raises `ValueError` if the
    lengths differ or ``metric`` has nulls."""
    if isinstance(metric, pa.ChunkedArray):
        metric = metric.combine_chunks()
    if isinstance(labels, pa.ChunkedArray):
        labels = labels.combine_chunks()
    if len(metric) != len(labels):
        raise ValueError(f"metric has {len(metric)} rows, labels {len(labels)}")
    metric = pc.cast(metric, pa.string()) if metric.type != pa.string() else metric
    if metric.null_count:
        raise ValueError("metric must not be null")
    if len(labels) == 0:
        return pa.array([], pa.string())
    # Concatenating a (possibly sliced) array gives one whose offsets start at its own
    # children, so offsets, keys and items below line up.
    labels = pa.concat_arrays([labels])
    offsets = labels.offsets
    # pc.list_parent_indices on a MapArray aborts the process in pyarrow 26: work on a
    # plain ListArray over the same offsets instead.
    key_lists = pa.ListArray.from_arrays(offsets, labels.keys)
    parents = pc.list_parent_indices(key_lists)
    start = offsets[0].as_py()
    end = offsets[-1].as_py()
    names = labels.keys.slice(start, end - start)
    values = labels.items.slice(start, end - start)
    # Sort within each row by name; the row index leads, so rows stay contiguous and
    # in order, and the original offsets (shifted to 0) still delimit them.
    order = pc.sort_indices(
        pa.table({"row": parents, "name": names}),
        sort_keys=[("row", "ascending"), ("name", "ascending")],
    )
    pairs = pc.binary_join_element_wise(
        _escape_array(pc.take(names, order)),
        '="',
        _escape_array(pc.take(pc.fill_null(values, ""), order)),
        "",
        null_handling="replace",
    )
    pairs = pc.binary_join_element_wise(pairs, '"', "")
    shifted = pc.subtract(offsets, pa.scalar(start, offsets.type))
    joined = pc.binary_join(pa.ListArray.from_arrays(shifted, pairs), ",")
    # A null map, or an empty one, means no labels: the series is the metric alone.
    has_labels = pc.and_(pc.is_valid(labels), pc.greater(pc.list_value_length(key_lists), 0))
    braced = pc.binary_join_element_wise("{", joined, "}", "")
    suffix = pc.if_else(has_labels, braced, "")
    result: pa.StringArray = pc.binary_join_element_wise(metric, suffix, "")
    return result
