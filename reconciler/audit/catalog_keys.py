"""The catalog side of the audit's record join, one entry per cataloged key (PROTOCOL §3.7).

`CatalogKeys` collects, for every row of every catalog file, the key's 128-bit digest
(`index.digests`), a 64-bit hash of its normalized ETag (`etag_hashes`), the 64-bit
prefix of its ``frame_sha256``, a 64-bit hash of the compared fields (`fields_hashes`),
its hour and its file (whose name, epoch and sequence, is the write order). `finish`
sorts once and keeps, per key, the *newest* row's ETag hash, fields hash and hour (the
row that counts) and whether the key's rows disagree (``conflict``: cataloged in two
hours or with two different hashes). The audit then asks
`lookup` for each listed chunk and marks what the listing showed (`mark_seen`); what it
never showed is the input of the phantom-row check (`unseen_before`).

Memory: 48 bytes a catalog row while loading, then 38 bytes a key (10M keys: ~380 MB,
where the key digests alone were 160 MB), in NumPy arrays; the next issue moves this
join out of core (DuckDB).

What a false match costs (64-bit hashes): two different ETags, hashes or field sets of one
key taken for equal (chance ~2^-64 per key) means a changed record is not re-read, or a
difference not reported, by this audit.
A row without an ETag (written before the column existed, by a read of the reconciler
itself) takes the listed ETag: it matches (`etag_differs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from index.digests import DIGEST_BYTES

NO_ETAG = np.uint64(0)
NO_SHA = np.uint64(0)
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_HASHED_BYTES = 256
"""An ETag is hashed on its first 256 bytes and its length (real ETags are < 100)."""
HOUR_NS = 3600 * 1_000_000_000

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


def etag_hashes(values: pa.Array | pa.ChunkedArray | Sequence[str | None]) -> U64:
    """A 64-bit FNV-1a hash of each ETag after `store.etag_check.normalized_etag` (quotes
    and a ``W/`` prefix removed), column-wise; `NO_ETAG` (0) for a null."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], pa.string())
    if not isinstance(values, pa.Array):
        values = pa.array(list(values), pa.string())
    values = values.cast(pa.string())
    count = len(values)
    if count == 0:
        return np.empty(0, dtype=np.uint64)
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    unweak = pc.replace_substring_regex(values, pattern="^W/", replacement="", max_replacements=1)
    text = pc.fill_null(pc.utf8_trim(unweak, characters='"'), "")
    if not isinstance(text, pa.Array):
        text = text.combine_chunks()
    _validity, offsets_buffer, data_buffer = text.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[text.offset : text.offset + count + 1]
    if data_buffer is None:
        data = np.zeros(1, dtype=np.uint8)
    else:
        data = np.frombuffer(data_buffer, dtype=np.uint8)
    starts = offsets[:-1].astype(np.int64)
    lengths = np.diff(offsets).astype(np.int64)
    hashes = np.full(count, _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(int(min(lengths.max(initial=0), _HASHED_BYTES))):
            has = lengths > j
            hashes[has] = (hashes[has] ^ data[starts[has] + j].astype(np.uint64)) * _FNV_PRIME
        hashes = (hashes ^ lengths.astype(np.uint64)) * _FNV_PRIME
    hashes[hashes == NO_ETAG] = np.uint64(1)
    hashes[~valid] = NO_ETAG
    return hashes


def _mix(values: U64) -> U64:
    """splitmix64's finalizer, vectorized (wrapping uint64 arithmetic)."""
    with np.errstate(over="ignore"):
        z = values + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        mixed: U64 = z ^ (z >> np.uint64(31))
    return mixed


def fields_hashes(shas: U64, accepted_shas: U64, times: I64) -> U64:
    """A 64-bit hash of the fields the audit compares with the store's record: the
    ``frame_sha256`` and ``accepted_frame_sha256`` prefixes (`NO_SHA` when null) and
    ``time_unix_ns``. The other fields are functions of the key and of the frame its hash
    names, checked when the row was cataloged (a well-formed row)."""
    return _mix(shas ^ _mix(accepted_shas ^ _mix(times.astype(np.int64).view(np.uint64))))


def _halves(digests: npt.NDArray[np.void]) -> tuple[U64, U64]:
    pairs = np.ascontiguousarray(digests).view(np.uint64).reshape(-1, 2)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def _digests(high: U64, low: U64) -> npt.NDArray[np.void]:
    pairs = np.ascontiguousarray(np.column_stack((high, low)).astype(np.uint64))
    return pairs.view(np.dtype(f"V{DIGEST_BYTES}")).reshape(-1)


_COLUMNS: dict[str, type[np.generic]] = {
    "high": np.uint64,
    "low": np.uint64,
    "etag": np.uint64,
    "sha": np.uint64,
    "fields": np.uint64,
    "hour": np.int32,
    "file": np.int32,
}
_FIRST_CAPACITY = 1 << 16


class _Column:
    """A growable column: one large array (capacity x1.5 when full; the untouched tail
    costs no memory), so a scan of many small files leaves no heap of small arrays behind
    (large arrays are mapped and returned to the system when freed)."""

    def __init__(self, dtype: type[np.generic]) -> None:
        self.values: npt.NDArray[Any] = np.empty(0, dtype=dtype)
        self.size = 0

    def extend(self, more: npt.NDArray[Any]) -> None:
        needed = self.size + len(more)
        if needed > len(self.values):
            grown = np.empty(
                max(needed, _FIRST_CAPACITY, len(self.values) * 3 // 2), self.values.dtype
            )
            grown[: self.size] = self.values[: self.size]
            self.values = grown
        self.values[self.size : needed] = more
        self.size = needed

    def take(self) -> npt.NDArray[Any]:
        """The values (a view of the filled part); the column is emptied."""
        values, self.values, self.size = self.values[: self.size], np.empty(0), 0
        return values


class CatalogKeys:
    """Every cataloged key with its newest row's ETag hash, fields hash and hour, and
    whether its rows disagree (see module)."""

    def __init__(self) -> None:
        self._columns = {name: _Column(dtype) for name, dtype in _COLUMNS.items()}
        self._files: list[tuple[int, int]] = []  # (epoch, sequence) of each file added
        self.high = np.empty(0, dtype=np.uint64)
        self.low = np.empty(0, dtype=np.uint64)
        self.etag = np.empty(0, dtype=np.uint64)
        self.fields = np.empty(0, dtype=np.uint64)
        self.hour = np.empty(0, dtype=np.int32)
        self.conflict = np.empty(0, dtype=bool)
        self.seen = np.empty(0, dtype=bool)

    def add(
        self,
        digests: npt.NDArray[np.void],
        *,
        etags: U64,
        shas: U64,
        accepted_shas: U64,
        times: I64,
        epoch: int,
        sequence: int,
    ) -> None:
        """One catalog file's rows (``epoch``, ``sequence``: its name, the write order)."""
        if not len(digests):
            return
        high, low = _halves(digests)
        times = np.asarray(times, dtype=np.int64)
        columns: dict[str, npt.NDArray[Any]] = {
            "high": high,
            "low": low,
            "etag": etags,
            "sha": shas,
            "fields": fields_hashes(shas, accepted_shas, times),
            "hour": (times // HOUR_NS).astype(np.int32),
            "file": np.full(len(digests), len(self._files), dtype=np.int32),
        }
        for name, values in columns.items():
            self._columns[name].extend(values)
        self._files.append((epoch, sequence))

    def _take(self, name: str) -> npt.NDArray[Any]:
        return self._columns[name].take()

    def finish(self) -> None:
        """Sort everything added into one entry per key (call once, after the last add).
        One column is reordered (and freed) at a time, so the peak stays near the rows'
        columns plus one column and the sort order."""
        if not self._files:
            return
        ranks = np.empty(len(self._files), dtype=np.int32)  # file -> its rank by name
        ranks[sorted(range(len(self._files)), key=self._files.__getitem__)] = np.arange(
            len(self._files), dtype=np.int32
        )
        self._files.clear()
        rank = ranks[self._take("file")]
        high, low = self._take("high"), self._take("low")
        order = np.lexsort((rank, low, high))  # by key, then the newest row last
        del rank
        high = high[order]  # one column at a time: the old one is freed at once
        low = low[order]
        same = (high[1:] == high[:-1]) & (low[1:] == low[:-1])  # row i+1 is row i's key
        ends = np.append(np.flatnonzero(~same), len(high) - 1)  # each key's newest row
        unique = len(ends) == len(high)  # the usual case: no copies needed
        self.high, self.low = (high, low) if unique else (high[ends], low[ends])
        del high, low
        # A key's rows disagree when two neighbours of it differ: no per-row copy of its
        # newest values is needed.
        differs = np.zeros(len(same), dtype=bool)
        for name in ("hour", "sha"):
            values = self._take(name)[order]
            differs |= (values[1:] != values[:-1]) & same
            if name == "hour":
                self.hour = values if unique else values[ends]
            del values
        group = np.cumsum(~same)  # row i+1's key number
        self.conflict = np.zeros(len(ends), dtype=bool)
        self.conflict[group[differs]] = True
        del differs, group, same
        newest = order if unique else order[ends]
        del order, ends
        self.etag = self._take("etag")[newest]
        self.fields = self._take("fields")[newest]
        self.seen = np.zeros(len(self.high), dtype=bool)

    def __len__(self) -> int:
        return len(self.high)

    @property
    def nbytes(self) -> int:
        arrays = (self.high, self.low, self.etag, self.fields, self.hour, self.conflict, self.seen)
        return sum(int(a.nbytes) for a in arrays)

    def lookup(self, digests: npt.NDArray[np.void]) -> I64:
        """The entry of each digest, or -1 when the catalog does not hold it."""
        if len(digests) == 0:
            return np.empty(0, dtype=np.int64)
        query_high, query_low = _halves(digests)
        size = len(self.high)
        at = np.searchsorted(self.high, query_high, side="left").astype(np.int64)
        while True:  # equal first halves (rare) sit together, ordered by the second
            inside = np.flatnonzero(at < size)
            move = inside[
                (self.high[at[inside]] == query_high[inside])
                & (self.low[at[inside]] < query_low[inside])
            ]
            if len(move) == 0:
                break
            at[move] += 1
        inside = np.flatnonzero(at < size)
        hit = inside[
            (self.high[at[inside]] == query_high[inside])
            & (self.low[at[inside]] == query_low[inside])
        ]
        found = np.full(len(at), -1, dtype=np.int64)
        found[hit] = at[hit]
        return found

    def mark_seen(self, entries: I64) -> None:
        self.seen[entries[entries >= 0]] = True

    def etag_differs(self, entries: I64, listed: U64) -> npt.NDArray[np.bool_]:
        """Per entry (>= 0): the listing showed an ETag and the newest row holds another.
        A row without an ETag takes the listed one (it matches)."""
        held = self.etag[entries]
        differs: npt.NDArray[np.bool_] = (listed != NO_ETAG) & (held != NO_ETAG) & (held != listed)
        return differs

    def unseen_before(self, limit_ns: int) -> npt.NDArray[np.void]:
        """Digests of the keys the listing never showed whose newest row's record time is
        older than ``limit_ns``: its whole hour is (the hour is what is kept a key; a
        phantom may so wait up to an hour longer, never the other way)."""
        wanted = ~self.seen & ((self.hour.astype(np.int64) + 1) * HOUR_NS <= limit_ns)
        return _digests(self.high[wanted], self.low[wanted])
