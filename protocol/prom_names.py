"""How a stored series is presented to Prometheus tools (PROTOCOL §5 "Series model").

``lm_escape``: every code point outside Prometheus' classic class (metric names
``[a-zA-Z_:][a-zA-Z0-9_:]*``, label names ``[a-zA-Z_][a-zA-Z0-9_]*``) becomes ``_``, and a
leading digit gets a ``_`` prefix. Nothing is collapsed and no suffix is added
(``http.server.duration`` → ``http_server_duration``). Label values are never changed.

A presented label set is ``__name__`` = the escaped metric plus the stored labels, where a
label with an empty value is absent, a stored label named ``__name__`` is dropped, and so
is one whose presented name is ``__name__``. Where two stored names of one series present
the same name, the stored name equal to its presented name keeps it, else the
byte-smallest stored name; the others are dropped (the caller counts them,
``lm_query_dropped_labels_total``).

`present_labels` is the reference, one series at a time; `presented_labels_array` is the
same function over a column of label maps (pure pyarrow, so Spark executors and the query
collector call it on Arrow batches without a Python object per row). Tests hold both to
the test vectors of docs/reading.md and to each other on random label sets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NAME_LABEL = "__name__"
_METRIC_OUTSIDE = "[^a-zA-Z0-9_:]"
_LABEL_OUTSIDE = "[^a-zA-Z0-9_]"
# Python's `re` runs here only on the fixed patterns above, never on a caller's pattern.
_METRIC_OUTSIDE_RE = re.compile(_METRIC_OUTSIDE)
_LABEL_OUTSIDE_RE = re.compile(_LABEL_OUTSIDE)


def _lead_digit(text: str) -> str:
    return "_" + text if text[:1].isascii() and text[:1].isdigit() else text


def lm_escape_metric(name: str) -> str:
    """A stored metric name as a Prometheus classic metric name."""
    return _lead_digit(_METRIC_OUTSIDE_RE.sub("_", name))


def lm_escape_label(name: str) -> str:
    """A stored label name as a Prometheus classic label name."""
    return _lead_digit(_LABEL_OUTSIDE_RE.sub("_", name))


def present_labels(
    metric: str, labels: Mapping[str, str] | None
) -> tuple[tuple[tuple[str, str], ...], int]:
    """The presented label set of one stored series, sorted by name (byte order, as
    Prometheus' ``labels.Labels``), ``__name__`` included, and how many stored labels
    were dropped because another stored name presents the same name."""
    keepers: dict[str, tuple[bool, str, str]] = {}
    dropped = 0
    for stored, value in (labels or {}).items():
        if value == "" or stored == NAME_LABEL:
            continue
        presented = lm_escape_label(stored)
        if presented == NAME_LABEL:
            continue
        # The exact name first, then the byte-smallest stored name.
        rank = (stored != presented, stored.encode(), value)
        current = keepers.get(presented)
        if current is not None:
            dropped += 1
            if (current[0], current[1].encode(), current[2]) <= rank:
                continue
        keepers[presented] = (stored != presented, stored, value)
    pairs = [(NAME_LABEL, lm_escape_metric(metric))]
    pairs += [(name, kept[2]) for name, kept in keepers.items()]
    pairs.sort(key=lambda pair: pair[0].encode())
    return tuple(pairs), dropped


def _escape_array(values: pa.Array, outside: str) -> pa.Array:
    escaped = pc.replace_substring_regex(values, pattern=outside, replacement="_")
    return pc.replace_substring_regex(escaped, pattern="^([0-9])", replacement="_\\1")


def escape_metric_array(names: pa.Array | pa.ChunkedArray) -> pa.Array:
    """`lm_escape_metric` over a string column."""
    return _escape_array(names, _METRIC_OUTSIDE)


def escape_label_array(names: pa.Array | pa.ChunkedArray) -> pa.Array:
    """`lm_escape_label` over a string column."""
    return _escape_array(names, _LABEL_OUTSIDE)


def presented_labels_array(labels: pa.Array | pa.ChunkedArray) -> tuple[pa.MapArray, int]:
    """The presented labels (``__name__`` not included) of each row of a
    ``map<string, string>`` column (a null map: no labels), names sorted in byte order,
    and how many stored labels were dropped for a name clash. Row for row equal to
    `present_labels` without its ``__name__`` pair."""
    if isinstance(labels, pa.ChunkedArray):
        labels = labels.combine_chunks() if labels.num_chunks else pa.array([], labels.type)
    labels = pa.concat_arrays([labels])
    rows = len(labels)
    out_type = pa.map_(pa.string(), pa.string())
    if rows == 0:
        return pa.array([], out_type), 0
    offsets = pc.fill_null(labels.offsets, 0)
    start = offsets[0].as_py()
    end = offsets[-1].as_py()
    # pc.list_parent_indices on a MapArray aborts the process in pyarrow 26: work on a
    # plain ListArray over the same offsets.
    parents = pc.list_parent_indices(pa.ListArray.from_arrays(labels.offsets, labels.keys))
    stored = labels.keys.slice(start, end - start).cast(pa.string())
    values = pc.fill_null(labels.items.slice(start, end - start).cast(pa.string()), "")
    presented = escape_label_array(stored)
    keep = pc.and_(
        pc.and_(pc.not_equal(values, ""), pc.not_equal(stored, NAME_LABEL)),
        pc.not_equal(presented, NAME_LABEL),
    )
    pairs = pa.table(
        {
            "row": parents,
            "name": presented,
            "inexact": pc.not_equal(stored, presented),
            "stored": stored.cast(pa.binary()),
            "value": values,
        }
    ).filter(keep)
    pairs = pairs.sort_by(
        [
            ("row", "ascending"),
            ("name", "ascending"),
            ("inexact", "ascending"),
            ("stored", "ascending"),
            ("value", "ascending"),
        ]
    )
    # Sorted by (row, name): a pair repeating the previous pair's row and name loses.
    row, name = pairs.column("row").combine_chunks(), pairs.column("name").combine_chunks()
    if pairs.num_rows:
        same_row = pc.equal(row.slice(1), row.slice(0, len(row) - 1))
        same_name = pc.equal(name.slice(1), name.slice(0, len(name) - 1))
        repeat = pa.concat_arrays([pa.array([False]), pc.and_(same_row, same_name)])
    else:
        repeat = pa.array([], pa.bool_())
    dropped = pc.sum(repeat).as_py() or 0
    kept = pairs.filter(pc.invert(repeat))
    # Names were sorted as strings (code points), which is also UTF-8 byte order.
    kept_rows = kept.column("row").to_numpy()
    lengths = np.bincount(kept_rows, minlength=rows) if len(kept_rows) else np.zeros(rows)
    new_offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    result = pa.MapArray.from_arrays(
        new_offsets, kept.column("name").combine_chunks(), kept.column("value").combine_chunks()
    )
    return result, int(dropped)
