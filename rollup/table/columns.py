"""Column helpers the rollup's pure pyarrow + numpy code shares (aggregates, points rows,
the live window): columns as numpy int64, dictionary codes and ranks of strings, nullable
floats with their validity, and the runs of equal values in a sorted array."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def int64_column(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An int64 (or timestamp) column without nulls as numpy int64."""
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    return np.asarray(column.to_numpy(), dtype=np.int64)


def string_codes(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """Dictionary codes of a non-null string column, and the dictionary."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = pc.dictionary_encode(column)
    return np.asarray(encoded.indices.to_numpy(), dtype=np.int64), encoded.dictionary


def ranks(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per row, the rank (1-based, code point order) of its string among the column's
    distinct values; 0 for null (unknown)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = pc.dictionary_encode(column)
    if len(encoded.dictionary) == 0:
        return np.zeros(len(column), dtype=np.int64)
    ranks = np.concatenate(
        [[0], np.asarray(pc.rank(encoded.dictionary, sort_keys="ascending"), dtype=np.int64)]
    )
    shifted = pc.fill_null(pc.add(encoded.indices.cast(pa.int64()), 1), 0)
    return ranks[np.asarray(shifted.to_numpy(), dtype=np.int64)]


def nullable(column: pa.ChunkedArray, fill: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(values with nulls replaced by ``fill``, validity) as numpy."""
    valid = np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False), dtype=bool)
    values = pc.fill_null(column, pa.scalar(fill, column.type)).to_numpy()
    return np.asarray(values), valid


def runs(sorted_groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (inclusive) positions of each run of equal values."""
    change = np.flatnonzero(sorted_groups[1:] != sorted_groups[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change - 1, [len(sorted_groups) - 1]])
    return starts, ends
