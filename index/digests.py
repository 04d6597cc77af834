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
    if column.type in (pa.binary(), pa.large_binary()):
        # A file DuckDB wrote (`index.catalog_merge`) stores the digests as plain BLOBs:
        # the same 16 bytes a row, refused below unless every value has exactly that size.
        try:
            column = column.cast(pa.binary(DIGEST_BYTES))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise ValueError("key_digest column has values that are not 16 bytes") from None
    if column.type != pa.binary(DIGEST_BYTES):
        raise ValueError(f"key_digest column must be fixed_size_binary(16), got {column.type}")
    buffer = column.buffers()[1]
    start = column.offset * DIGEST_BYTES
    data = np.frombuffer(buffer, dtype=np.uint8)[start : start + len(column) * DIGEST_BYTES]
    return data.view(_DIGEST_DTYPE).copy()


def sha_prefixes(shas: Sequence[str] | pa.Array | pa.ChunkedArray) -> npt.NDArray[np.uint64]:
    """The first 64 bits of each hex SHA-256 (nulls dropped), vectorized. Raises
    `ValueError` on a value that is not 64 characters or not lowercase hex there.

    An Arrow string column is read from its buffers (no Python string per row): the
    catalog scan calls this on every row of every catalog file."""
    if isinstance(shas, pa.ChunkedArray):
        parts = [sha_prefixes(chunk) for chunk in shas.chunks]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)
    if isinstance(shas, pa.Array):
        text = _hex_characters(shas.drop_null() if shas.null_count else shas)
    else:
        text = np.array(shas, dtype="S64").view(np.uint8).reshape(-1, 64)
        if any(len(sha) != 64 for sha in shas):
            raise ValueError("not a 64-character SHA-256")
    if len(text) == 0:
        return np.empty(0, dtype=np.uint64)
    nibbles = _HEX_VALUES[text[:, :16]]
    if (nibbles == 255).any():
        raise ValueError("not a lowercase hex SHA-256")
    weights = np.uint64(16) ** np.arange(15, -1, -1, dtype=np.uint64)
    prefixes: npt.NDArray[np.uint64] = (nibbles.astype(np.uint64) * weights).sum(
        axis=1, dtype=np.uint64
    )
    return prefixes


def _hex_characters(values: pa.Array) -> npt.NDArray[np.uint8]:
    """A null-free string array of 64-character values as an (n, 64) byte matrix."""
    if values.type not in (pa.string(), pa.large_string()):
        raise ValueError(f"SHA-256 column must be a string column, got {values.type}")
    if len(values) == 0:
        return np.empty((0, 64), dtype=np.uint8)
    _validity, offsets_buffer, data_buffer = values.buffers()
    offset_type = np.int32 if values.type == pa.string() else np.int64
    offsets = np.frombuffer(offsets_buffer, dtype=offset_type)[
        values.offset : values.offset + len(values) + 1
    ]
    if (np.diff(offsets) != 64).any():
        raise ValueError("not a 64-character SHA-256")
    data = np.frombuffer(data_buffer, dtype=np.uint8)[int(offsets[0]) : int(offsets[-1])]
    return data.reshape(-1, 64)


class KeyDigestSet:
    """A set of 128-bit digests held as two sorted ``uint64`` arrays (the digest's two
    halves, ordered by the first, then the second): 16 bytes an entry, sorted with
    NumPy's integer sort and searched with `numpy.searchsorted` — a sort or search of raw
    16-byte values goes through a generic comparison and is 10-50x slower at 10M entries.

    ``add`` collects chunks; the first query after an ``add`` sorts and deduplicates
    everything once (meant for: add everything, then query)."""

    def __init__(self) -> None:
        self._high_chunks: list[npt.NDArray[np.uint64]] = []
        self._low_chunks: list[npt.NDArray[np.uint64]] = []
        self._high = np.empty(0, dtype=np.uint64)
        self._low = np.empty(0, dtype=np.uint64)

    def add(self, digests: npt.NDArray[np.void]) -> None:
        if len(digests):
            high, low = _halves(digests)
            self._high_chunks.append(high.copy())
            self._low_chunks.append(low.copy())

    def add_keys(self, record_keys: Iterable[str]) -> None:
        self.add(digests_of(list(record_keys)))

    def _sorted(self) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
        if self._high_chunks:
            # One half at a time, each list emptied as soon as it is merged: at 10M digests
            # this keeps the peak near 2.5x the final 160 MB instead of 4x.
            self._high = _merged([self._high, *self._high_chunks])
            self._high_chunks.clear()
            self._low = _merged([self._low, *self._low_chunks])
            self._low_chunks.clear()
            halves = [self._high, self._low]
            self._high = self._low = np.empty(0, dtype=np.uint64)
            self._high, self._low = _sort_pairs(halves)
        return self._high, self._low

    def __len__(self) -> int:
        return len(self._sorted()[0])

    @property
    def nbytes(self) -> int:
        high, low = self._sorted()
        return int(high.nbytes + low.nbytes)

    def contains(self, query: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
        high, low = self._sorted()
        if len(high) == 0 or len(query) == 0:
            return np.zeros(len(query), dtype=bool)
        query_high, query_low = _halves(query)
        at = np.minimum(np.searchsorted(high, query_high), len(high) - 1)
        same_high = high[at] == query_high
        found: npt.NDArray[np.bool_] = np.asarray(same_high & (low[at] == query_low), dtype=bool)
        # Digests that share their first half (rare: ~n^2 / 2^65 pairs) sit together,
        # ordered by the second half: look further along such a run.
        for i in np.flatnonzero(same_high & ~found):
            j = int(at[i]) + 1
            while j < len(high) and high[j] == query_high[i] and low[j] <= query_low[i]:
                if low[j] == query_low[i]:
                    found[i] = True
                    break
                j += 1
        return found


def _merged(parts: list[npt.NDArray[np.uint64]]) -> npt.NDArray[np.uint64]:
    merged: npt.NDArray[np.uint64] = np.concatenate(parts)
    parts.clear()
    return merged


def _halves(digests: npt.NDArray[np.void]) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """The two 64-bit halves of each 16-byte digest (native byte order: any fixed
    order of the halves' values serves membership)."""
    pairs = np.ascontiguousarray(digests).view(np.uint64).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def _sort_pairs(
    halves: list[npt.NDArray[np.uint64]],
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """The pairs of ``halves = [high, low]`` sorted by high, then low, without duplicate
    pairs. Takes the arrays out of the list, so each unsorted half is freed as soon as its
    sorted copy exists."""
    high, low = halves.pop(0), halves.pop(0)
    order = np.argsort(high)
    high = high[order]
    low = low[order]
    del order
    # Runs of equal first halves (duplicates of one key, or rare 64-bit collisions):
    # sort those positions by (high, low); they stay in place as a group.
    tied = np.zeros(len(high), dtype=bool)
    if len(high) > 1:
        equal = high[1:] == high[:-1]
        tied[1:] |= equal
        tied[:-1] |= equal
    at = np.flatnonzero(tied)
    if len(at):
        sub = np.lexsort((low[at], high[at]))
        high[at], low[at] = high[at][sub], low[at][sub]
    keep = np.ones(len(high), dtype=bool)
    if len(high) > 1:
        keep[1:] = (high[1:] != high[:-1]) | (low[1:] != low[:-1])
    if keep.all():
        return high, low
    return high[keep], low[keep]


class ShaPrefixSet:
    """A set of 64-bit hash prefixes: one sorted ``uint64`` array (8 bytes an entry).
    Like `KeyDigestSet`, the first query after an ``add`` sorts once."""

    def __init__(self) -> None:
        self._chunks: list[npt.NDArray[np.uint64]] = []
        self._values = np.empty(0, dtype=np.uint64)
        self._dirty = False

    def add(self, values: npt.NDArray[np.generic]) -> None:
        if len(values):
            self._chunks.append(values.astype(np.uint64))
            self._dirty = True

    def _sorted(self) -> npt.NDArray[np.uint64]:
        if self._dirty:
            merged = np.concatenate([self._values, *self._chunks])
            self._chunks, self._dirty = [], False
            merged.sort()
            keep = np.ones(len(merged), dtype=bool)
            keep[1:] = merged[1:] != merged[:-1]
            self._values = merged if keep.all() else merged[keep]
        return self._values

    def __len__(self) -> int:
        return len(self._sorted())

    @property
    def nbytes(self) -> int:
        return int(self._sorted().nbytes)

    def contains(self, query: npt.NDArray[np.generic]) -> npt.NDArray[np.bool_]:
        return np.asarray(self.find(query) >= 0, dtype=bool)

    @property
    def values(self) -> npt.NDArray[np.uint64]:
        """The set, sorted (positions as `find` reports them)."""
        return self._sorted()

    def find(self, query: npt.NDArray[np.generic]) -> npt.NDArray[np.int64]:
        """The position of each query value in `values`, -1 where it is absent."""
        values = self._sorted()
        if len(values) == 0 or len(query) == 0:
            return np.full(len(query), -1, dtype=np.int64)
        query = query.astype(np.uint64, copy=False)
        at = np.minimum(np.searchsorted(values, query), len(values) - 1).astype(np.int64)
        at[values[at] != query] = -1
        return at
