"""Compact sets for the audit's joins: 128-bit key digests and 64-bit blob-hash prefixes.

The full audit joins millions of keys (PROTOCOL §3.7: the listing of ``accepted/v1/`` and
``quarantine/v1/`` against the catalog; the listing of ``raw-blobs/v1/`` against the
hashes the catalog references). Holding the keys as Python strings would take ~150 bytes
each; these sets hold sorted NumPy arrays instead — 16 bytes a key, 8 bytes a hash —
so 10M manifests fit in well under 1 GiB, and membership is a vectorized binary search.

What a false match costs, and why it is acceptable:
- `KeyDigestSet` (BLAKE2b-128 of the key): a listed record taken for cataloged is not
  read by this audit. The chance for one missing key among N cataloged is N / 2^128
  (below 10^-31 for N = 10M), far below the SHA-256 collision risk that content
  addressing already accepts.
- `ShaPrefixSet` (first 64 bits of a SHA-256): used where a match can only *keep* data:
  a blob whose prefix matches a referenced hash is treated as referenced (kept), and a
  referenced hash whose prefix matches a listed blob is treated as present (a
  missing-blob report could be missed, nothing deleted).

Catalog files carry ``key_digest`` (the digest of ``key``) so an audit reads 16 bytes a
row and hashes nothing on the catalog side.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

DIGEST_BYTES = 16
_DIGEST_DTYPE = np.dtype(f"V{DIGEST_BYTES}")
_HEX_VALUES = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_VALUES[_c] = _i


def key_digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode("utf-8"), digest_size=DIGEST_BYTES).digest()


def digests_of(record_keys: Sequence[str]) -> npt.NDArray[np.void]:
    """The digests of ``record_keys`` as one array (same order)."""
    raw = b"".join(key_digest(key) for key in record_keys)
    return np.frombuffer(raw, dtype=_DIGEST_DTYPE)


def digests_from_arrow(column: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.void]:
    """A ``fixed_size_binary(16)`` column as a digest array (no copy per row)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], pa.binary(16))
    if column.null_count:
        raise ValueError("key_digest column has nulls")
    if column.type != pa.binary(DIGEST_BYTES):
        raise ValueError(f"key_digest column must be fixed_size_binary(16), got {column.type}")
    buffer = column.buffers()[1]
    start = column.offset * DIGEST_BYTES
    data = np.frombuffer(buffer, dtype=np.uint8)[start : start + len(column) * DIGEST_BYTES]
    return data.view(_DIGEST_DTYPE).copy()


def sha_prefixes(shas: Sequence[str] | pa.Array | pa.ChunkedArray) -> npt.NDArray[np.uint64]:
    """The first 64 bits of each hex SHA-256, vectorized. Raises `ValueError` on bad hex."""
    if isinstance(shas, pa.ChunkedArray | pa.Array):
        values = shas.drop_null() if shas.null_count else shas
        text = values.to_numpy(zero_copy_only=False).astype("S64")
    else:
        text = np.array(shas, dtype="S64")
    if len(text) == 0:
        return np.empty(0, dtype=np.uint64)
    nibbles = _HEX_VALUES[text.view(np.uint8).reshape(-1, 64)[:, :16]]
    if (nibbles == 255).any():
        raise ValueError("not a lowercase hex SHA-256")
    weights = np.uint64(16) ** np.arange(15, -1, -1, dtype=np.uint64)
    prefixes: npt.NDArray[np.uint64] = (nibbles.astype(np.uint64) * weights).sum(
        axis=1, dtype=np.uint64
    )
    return prefixes


class _SortedSet:
    """A sorted, deduplicated array built from chunks; `contains` is a binary search."""

    def __init__(self, dtype: np.dtype[np.generic]) -> None:
        self._dtype = dtype
        self._chunks: list[npt.NDArray[np.generic]] = []
        self._sorted: npt.NDArray[np.generic] | None = None

    def add(self, values: npt.NDArray[np.generic]) -> None:
        if len(values):
            self._chunks.append(values.astype(self._dtype, copy=False))
            self._sorted = None

    def _values(self) -> npt.NDArray[np.generic]:
        if self._sorted is None:
            merged = np.concatenate(self._chunks) if self._chunks else np.empty(0, self._dtype)
            self._chunks = []
            self._sorted = np.unique(merged)
            self._chunks = [self._sorted]
        return self._sorted

    def __len__(self) -> int:
        return len(self._values())

    @property
    def nbytes(self) -> int:
        return int(self._values().nbytes)

    def contains(self, query: npt.NDArray[np.generic]) -> npt.NDArray[np.bool_]:
        values = self._values()
        if len(values) == 0 or len(query) == 0:
            return np.zeros(len(query), dtype=bool)
        query = query.astype(self._dtype, copy=False)
        at = np.searchsorted(values, query)
        at[at == len(values)] = len(values) - 1
        return np.asarray(values[at] == query, dtype=bool)

    def missing_from(self, other: _SortedSet) -> npt.NDArray[np.generic]:
        """Values of this set that ``other`` does not hold."""
        values = self._values()
        return values[~other.contains(values)]


class KeyDigestSet(_SortedSet):
    def __init__(self) -> None:
        super().__init__(_DIGEST_DTYPE)

    def add_keys(self, record_keys: Iterable[str]) -> None:
        self.add(digests_of(list(record_keys)))


class ShaPrefixSet(_SortedSet):
    def __init__(self) -> None:
        super().__init__(np.dtype(np.uint64))
