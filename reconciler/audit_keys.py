"""The catalog side of the audit's record join, one entry per cataloged key (PROTOCOL §3.7).

`CatalogKeys` collects, for every row of every catalog file, the key's 128-bit digest
(`index.digests`), a 64-bit hash of its normalized ETag (`etag_hashes`), the 64-bit
prefixes of its ``frame_sha256`` and ``accepted_frame_sha256``, its ``time_unix_ns`` and
the file's rank (epoch, sequence: write order). `finish` sorts once and keeps, per key,
the *newest* row's values (the row that counts) and whether the key's rows disagree
(``conflict``: cataloged in two hours or with two different hashes). The audit then asks
`lookup` for each listed chunk and marks what the listing showed (`mark_seen`); what it
never showed is the input of the phantom-row check (`unseen_before`).

Memory: ~56 bytes a catalog row while loading, then ~42 bytes a key (10M keys: ~420 MB),
in NumPy arrays; the next issue moves this join out of core (DuckDB).

What a false match costs (64-bit hashes): two different ETags or hashes of one key taken
for equal (chance ~2^-64 per key) means a changed record is not re-read by this audit.
A row without an ETag (written before the column existed, by a read of the reconciler
itself) takes the listed ETag: it matches (`etag_differs`).
"""

from __future__ import annotations

from collections.abc import Sequence

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


def _halves(digests: npt.NDArray[np.void]) -> tuple[U64, U64]:
    pairs = np.ascontiguousarray(digests).view(np.uint64).reshape(-1, 2)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def _digests(high: U64, low: U64) -> npt.NDArray[np.void]:
    pairs = np.ascontiguousarray(np.column_stack((high, low)).astype(np.uint64))
    return pairs.view(np.dtype(f"V{DIGEST_BYTES}")).reshape(-1)


class CatalogKeys:
    """Every cataloged key with its newest row's ETag hash, hashes and time (see module)."""

    def __init__(self) -> None:
        self._parts: list[tuple[U64, U64, U64, U64, U64, I64, I64]] = []
        self.high = np.empty(0, dtype=np.uint64)
        self.low = np.empty(0, dtype=np.uint64)
        self.etag = np.empty(0, dtype=np.uint64)
        self.sha = np.empty(0, dtype=np.uint64)
        self.accepted_sha = np.empty(0, dtype=np.uint64)
        self.time = np.empty(0, dtype=np.int64)
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
        rank: int,
    ) -> None:
        """One catalog file's rows (``rank``: the file's write order, newest highest)."""
        if len(digests):
            high, low = _halves(digests)
            ranks = np.full(len(digests), rank, dtype=np.int64)
            self._parts.append(
                (high, low, etags, shas, accepted_shas, times.astype(np.int64), ranks)
            )

    def finish(self) -> None:
        """Sort everything added into one entry per key (call once, after the last add)."""
        if not self._parts:
            return
        high, low, etag, sha, accepted, time, rank = (
            np.concatenate([part[i] for part in self._parts]) for i in range(7)
        )
        self._parts.clear()
        order = np.lexsort((rank, low, high))
        high, low, etag, sha, accepted, time = (
            a[order] for a in (high, low, etag, sha, accepted, time)
        )
        del order, rank
        last = np.ones(len(high), dtype=bool)  # the newest row of each key comes last
        last[:-1] = (high[1:] != high[:-1]) | (low[1:] != low[:-1])
        ends = np.flatnonzero(last)
        group = np.repeat(np.arange(len(ends)), np.diff(np.concatenate(([-1], ends))))
        newest = ends[group]
        differs = (time // HOUR_NS != time[newest] // HOUR_NS) | (sha != sha[newest])
        self.conflict = np.bincount(group, weights=differs, minlength=len(ends)) > 0
        self.high, self.low = high[ends], low[ends]
        self.etag, self.sha, self.accepted_sha, self.time = (
            etag[ends],
            sha[ends],
            accepted[ends],
            time[ends],
        )
        self.seen = np.zeros(len(ends), dtype=bool)

    def __len__(self) -> int:
        return len(self.high)

    @property
    def nbytes(self) -> int:
        arrays = (self.high, self.low, self.etag, self.sha, self.accepted_sha, self.time)
        return sum(int(a.nbytes) for a in arrays) + int(self.conflict.nbytes + self.seen.nbytes)

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
        older than ``limit_ns``."""
        wanted = ~self.seen & (self.time < limit_ns)
        return _digests(self.high[wanted], self.low[wanted])
