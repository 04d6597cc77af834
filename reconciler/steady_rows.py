"""The steady pass's column-wise sorting of log rows (PROTOCOL §3.7, §3.9).

A chunk of log segments arrives as one Arrow table (`index.rows.FILE_SCHEMA`). `sort_chunk`
splits it, with no Python object per row, into:

- ``blobs``: well-formed ``blob`` rows (the orphan suspects' input);
- ``attested``: ``accepted``/``quarantine`` rows from a collector's own create answered 200
  (``own_create`` with an ``etag``): cataloged as they are, no request; a sample of them
  (``verify_sample_rate``) is also read back and compared field by field;
- ``read_back``: the keys of the other record rows (a duplicate, a re-send, an unknown
  outcome, a conflict, or a row written before ``own_create`` existed), deduplicated and
  minus those cataloged lately (`RecentKeys`) or attested in this chunk: each is read from
  the store once;
- ``malformed``: rows that break a rule of `index.row_checks` (never cataloged: the audit
  finds their records).

``key_digest`` is recomputed for every row that is cataloged: the audit joins on it, and a
collector's claim is not the store's word.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from index.digests import DIGEST_BYTES, digests_from_arrow
from index.row_checks import log_rows_well_formed
from index.rows import FILE_SCHEMA, IndexRow, rows_of, table_of
from reconciler.context import ReconcilerContext
from store.etag_check import normalized_etag

COMPARED_FIELDS = (  # what a sampled read-back compares with the claim (and the ETag)
    "kind",
    "frame_sha256",
    "accepted_frame_sha256",
    "raw_blob_key",
    "raw_offset",  # a bundled frame's range (PROTOCOL §3.10): differing ranges disagree
    "raw_length",
    "agent_id",
    "boot_id",
    "seq_start",
    "seq_end",
    "record_count",
    "frame_bytes",
    "time_unix_ns",
)

MAX_RECENT_KEYS = 20_000_000


def with_key_digests(table: pa.Table) -> pa.Table:
    """``table`` with ``key_digest`` computed from ``key`` (BLAKE2b-128)."""
    digests = b"".join(
        hashlib.blake2b(key.encode("utf-8"), digest_size=DIGEST_BYTES).digest()
        for key in table.column("key").to_pylist()
    )
    column = pa.Array.from_buffers(
        pa.binary(DIGEST_BYTES), table.num_rows, [None, pa.py_buffer(digests)]
    )
    index = table.schema.get_field_index("key_digest")
    return table.set_column(index, FILE_SCHEMA.field("key_digest"), column)


def digest_words(table: pa.Table) -> npt.NDArray[np.uint64]:
    """The first 64 bits of each row's ``key_digest``: what `RecentKeys` compares."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.uint64)
    raw = digests_from_arrow(table.column("key_digest"))
    return raw.view(np.uint8).reshape(-1, DIGEST_BYTES)[:, :8].copy().view(np.uint64).ravel()


class RecentKeys:
    """Keys cataloged within the lookback (64-bit digest prefixes and row times, NumPy), so
    a read-derived row whose key was just cataloged is not read again. A false match
    (2^-64 per pair) only skips a read-back the audit repeats. Bounded."""

    def __init__(self, max_entries: int = MAX_RECENT_KEYS) -> None:
        self._max = max_entries
        self._digests = np.zeros(0, dtype=np.uint64)
        self._times = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._digests)

    def contains(self, digests: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        return np.isin(digests, self._digests)

    def add(self, digests: npt.NDArray[np.uint64], times: npt.NDArray[np.int64]) -> None:
        self._digests = np.concatenate([self._digests, digests])[-self._max :]
        self._times = np.concatenate([self._times, times])[-self._max :]

    def forget(self, digests: npt.NDArray[np.uint64]) -> None:
        keep = ~np.isin(self._digests, digests)
        self._digests, self._times = self._digests[keep], self._times[keep]

    def forget_before(self, horizon_ns: int) -> None:
        keep = self._times >= horizon_ns
        self._digests, self._times = self._digests[keep], self._times[keep]


@dataclass
class SortedChunk:
    blobs: pa.Table
    attested: pa.Table
    sample: pa.Table
    read_back: pa.Table
    """One row per key to read (the first log row naming it: its point times)."""
    malformed: pa.Table


def sort_chunk(
    table: pa.Table,
    recent: RecentKeys,
    *,
    sample_rate: float,
    rng: random.Random,
    attest: bool = True,
    retracted: frozenset[str] = frozenset(),
) -> SortedChunk:
    """Split a chunk (see the module docstring). ``attest=False`` (a store whose ETags
    cannot attest a record, PROTOCOL §3.6) reads back every record row; so are the rows
    of ``retracted`` keys (PROTOCOL §3.7: after a retraction, only a record the store
    returns supersedes the ``retracted`` row)."""
    mask = log_rows_well_formed(table)
    malformed = table.filter(pc.invert(mask))
    good = table.filter(mask)
    is_blob = pc.equal(good.column("kind"), "blob")
    blobs = good.filter(is_blob)
    records = with_key_digests(good.filter(pc.invert(is_blob)))
    own = pc.fill_null(
        pc.and_(records.column("own_create"), pc.is_valid(records.column("etag"))), False
    )
    if not attest:
        own = pc.and_(own, pa.scalar(False))
    retracted_values = pa.array(sorted(retracted), pa.string())
    is_retracted = pc.is_in(records.column("key"), value_set=retracted_values)
    own = pc.and_(own, pc.invert(is_retracted))
    attested = records.filter(own)
    others = records.filter(pc.invert(own))
    sample = _sample(attested, sample_rate, rng)
    # Read each other key once: not if attested in this chunk, nor cataloged lately.
    others = _first_per_key(others)
    words = digest_words(others)
    skip = recent.contains(words) | np.isin(words, digest_words(attested))
    if retracted:  # read back even if cataloged lately
        skip &= ~pc.is_in(others.column("key"), value_set=retracted_values).to_numpy(
            zero_copy_only=False
        )
    read_back = others.filter(pa.array(~skip))
    return SortedChunk(blobs, attested, sample, read_back, malformed)


def _first_per_key(table: pa.Table) -> pa.Table:
    if table.num_rows == 0:
        return table
    indexed = table.append_column("_i", pa.array(np.arange(table.num_rows)))
    first = indexed.group_by("key").aggregate([("_i", "min")]).column("_i_min")
    return table.take(np.sort(first.to_numpy()))


def _sample(table: pa.Table, rate: float, rng: random.Random) -> pa.Table:
    if rate <= 0 or table.num_rows == 0:
        return table.slice(0, 0)
    picks = np.random.default_rng(rng.getrandbits(64)).random(table.num_rows) < rate
    return table.filter(pa.array(picks))


def compare_sample(
    ctx: ReconcilerContext, sample: pa.Table, read: list[IndexRow]
) -> tuple[pa.Table, list[str]]:
    """Sampled attested rows against the store's records: the superseding rows (from
    the store) and the keys whose fields differed."""
    if sample.num_rows == 0:
        return FILE_SCHEMA.empty_table(), []
    stored = {row.key: row for row in read}
    superseding: list[IndexRow] = []
    for claim in rows_of(sample):
        truth = stored.get(claim.key)
        if truth is None:
            continue  # missing or failed: counted by the read; the claim stays
        differs = [f for f in COMPARED_FIELDS if getattr(claim, f) != getattr(truth, f)]
        if normalized_etag(claim.etag) != normalized_etag(truth.etag):
            differs.append("etag")
        if differs:
            ctx.log.error("catalog_mismatch", key=claim.key, source=claim.source, fields=differs)
            ctx.metrics.catalog_mismatches.inc()
            superseding.append(with_times(truth, claim, "read-back"))
    return table_of(superseding), [row.key for row in superseding]


def read_back_table(read: list[IndexRow], claims: pa.Table) -> pa.Table:
    """Rows read from the store, with ``source`` and the point times of the log row
    that named them (same hash: the same frame)."""
    if not read:
        return FILE_SCHEMA.empty_table()
    by_key = {
        row.key: row
        for row in rows_of(
            claims.filter(pc.is_in(claims.column("key"), value_set=pa.array([r.key for r in read])))
        )
    }
    return table_of([with_times(row, by_key.get(row.key), "read-back") for row in read])


def with_times(truth: IndexRow, claim: IndexRow | None, source: str) -> IndexRow:
    """The store's row, with the point times of a log row naming the same frame."""
    same = claim is not None and claim.frame_sha256 == truth.frame_sha256
    return replace(
        truth,
        source=source,
        min_ts_ns=claim.min_ts_ns if same and claim is not None else None,
        max_ts_ns=claim.max_ts_ns if same and claim is not None else None,
    )
