"""Rows of the index (PROTOCOL §3.7) and their one Parquet encoding.

Log segments and catalog files hold the same columns; a segment's rows are *claims* by a
collector (unverified), a catalog file's rows are facts the reconciler read from the store
itself. One `IndexRow` type serves both:

| column | type | accepted | quarantine | blob (log only) |
|---|---|---|---|---|
| ``kind`` | string | ``accepted`` | ``quarantine`` | ``blob`` |

(A fourth kind, ``retracted``, is catalog only: the copy of an ``accepted`` or
``quarantine`` row that a retraction writes after it, with that row's columns.)

| ``key`` | string | manifest key | quarantine key | raw object key (frame blob or bundle) |
| ``frame_sha256`` | string | the batch's hash | the *submitted* hash | the object's hash |
| ``accepted_frame_sha256`` | string? | null | the accepted hash | null |
| ``raw_blob_key`` | string? | the manifest's | the submitted blob | null |
| ``agent_id``, ``boot_id`` | string? | identity | identity | null |
| ``seq_start``, ``seq_end`` | uint64? | identity | identity | null |
| ``record_count``, ``frame_bytes`` | int64? | from the manifest | null | null |
| ``time_unix_ns`` | int64 | accepted_at | observed_at | blob creation |
| ``etag`` | string? | the ETag the store returned for the record's create or read | same | null |
| ``own_create`` | bool? | this collector's own create was answered 200 | same | null |
| ``min_ts_ns``, ``max_ts_ns`` | int64? | the batch's point times (from the frame) | null | null |
| ``raw_offset``, ``raw_length`` | int64? | a bundled frame's range in ``raw_blob_key`` (PROTOCOL §3.10); null for a frame blob | null | null |
| ``source`` | string? | catalog only: the log segment's key, ``audit`` or ``read-back`` | | |
| ``key_digest`` | binary(16) | BLAKE2b-128 of ``key`` (`index.digests`) | | |
| ``first_epoch``, ``first_sequence``, ``first_position`` | int64? | catalog only: the row's rank (`index.catalog_rank`) | | |

Every field of an ``accepted``/``quarantine`` row is the stored record's value (the body
the collector created or read), never recomputed (PROTOCOL §3.7). Files written before
``etag``/``own_create``/``min_ts_ns``/``max_ts_ns``/``source``/``raw_offset``/``raw_length``
existed read those as null (no range: a frame blob, as every record then named):
a log row without ``own_create`` is read back by the steady pass, a catalog row without
``etag`` takes the listed ETag at the next audit.

Files are Parquet with zstd; a reader takes the columns by name, so later versions may add
columns. Decoding validates every row (kinds, hashes, identity-bearing keys); a file that
does not decode raises `IndexFileError`, never returns fewer rows.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq

from protocol import frame, keys
from protocol.records import AcceptedManifest, IdentityConflict

from .catalog_rank import RANK_FIELDS
from .digests import DIGEST_BYTES, key_digest

RowKind = Literal["accepted", "quarantine", "blob", "retracted"]
ROW_KINDS: tuple[RowKind, ...] = ("accepted", "quarantine", "blob", "retracted")
LOG_ROW_KINDS: tuple[RowKind, ...] = ("accepted", "quarantine", "blob")
"""A collector's log holds these; ``retracted`` rows are the lease holder's, catalog only
(PROTOCOL §3.7 retraction: a copy of a key's row, written after it, so the key counts as
absent everywhere until a record the store returns supersedes it)."""

SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("key", pa.string()),
        ("frame_sha256", pa.string()),
        ("accepted_frame_sha256", pa.string()),
        ("raw_blob_key", pa.string()),
        ("agent_id", pa.string()),
        ("boot_id", pa.string()),
        ("seq_start", pa.uint64()),
        ("seq_end", pa.uint64()),
        ("record_count", pa.int64()),
        ("frame_bytes", pa.int64()),
        ("time_unix_ns", pa.int64()),
        ("etag", pa.string()),
        ("own_create", pa.bool_()),
        ("min_ts_ns", pa.int64()),
        ("max_ts_ns", pa.int64()),
        ("source", pa.string()),
        ("raw_offset", pa.int64()),
        ("raw_length", pa.int64()),
    ]
)
RANGE_COLUMNS = frozenset({"raw_offset", "raw_length"})
"""A bundled frame's range (PROTOCOL §3.10): null for a frame blob, absent before."""
OPTIONAL_COLUMNS = (
    frozenset({"etag", "own_create", "min_ts_ns", "max_ts_ns", "source"}) | RANGE_COLUMNS
)
"""Columns later versions added: a file without them reads them as null."""
FILE_SCHEMA = pa.schema([*SCHEMA, pa.field("key_digest", pa.binary(DIGEST_BYTES)), *RANK_FIELDS])
"""Files also carry ``key_digest`` (BLAKE2b-128 of ``key``, `index.digests`), so a full
audit joins 16 bytes a row without hashing the catalog side, and a catalog row's rank
(`index.catalog_rank.RANK_COLUMNS`: where it was first written; null in the file it was
first written in, and in every file written before the columns existed)."""


FRAME_LENGTHS = (frame.HEADER_LEN + frame.CRC_LEN, frame.U32_MAX)
"""A frame's length in a well-formed row's range (PROTOCOL §1): at least a header and its
CRC, at most the largest ``ingest.max_frame_bytes`` a setting allows (`index.row_checks`
says why not the configured one)."""


class IndexFileError(ValueError):
    """An index file (segment or catalog) that cannot be read as PROTOCOL §3.7 says."""


@dataclass(frozen=True, slots=True)
class IndexRow:
    kind: RowKind
    key: str
    frame_sha256: str
    time_unix_ns: int
    accepted_frame_sha256: str | None = None
    raw_blob_key: str | None = None
    agent_id: str | None = None
    boot_id: str | None = None
    seq_start: int | None = None
    seq_end: int | None = None
    record_count: int | None = None
    frame_bytes: int | None = None
    etag: str | None = None
    own_create: bool | None = None
    min_ts_ns: int | None = None
    max_ts_ns: int | None = None
    source: str | None = None
    raw_offset: int | None = None
    raw_length: int | None = None

    @property
    def hour(self) -> keys.UtcHour:
        """The partition of the row: the UTC hour of ``time_unix_ns``."""
        return keys.UtcHour.from_unix_ns(self.time_unix_ns)

    @property
    def referenced_raw_keys(self) -> tuple[str, ...]:
        """The raw objects this row keeps alive, by key (PROTOCOL §3.5 rule 2, §3.10): its
        ``raw_blob_key`` (a bundle for a bundled frame), and a quarantine row's accepted
        side, always the frame blob of ``accepted_frame_sha256``."""
        own = self.raw_blob_key or keys.raw_blob_key(self.frame_sha256)
        if self.kind == "quarantine" and self.accepted_frame_sha256 is not None:
            return (own, keys.raw_blob_key(self.accepted_frame_sha256))
        return (own,)

    @property
    def manifest_id(self) -> str:
        """The ledger's ``manifest_id`` of an ``accepted`` row."""
        return self.identity.manifest_id

    @property
    def identity(self) -> keys.BatchIdentity:
        if self.agent_id is None or self.boot_id is None or self.seq_start is None:
            raise IndexFileError(f"{self.kind} row {self.key!r} has no identity")
        return keys.BatchIdentity(
            self.agent_id, uuid.UUID(self.boot_id), self.seq_start, self.seq_end or 0
        )


def accepted_row(
    manifest: AcceptedManifest,
    *,
    key: str | None = None,
    etag: str | None = None,
    own_create: bool | None = None,
    ts_range: tuple[int, int] | None = None,
) -> IndexRow:
    """``key``: where the manifest is stored, when not at `manifest_key` (the long form of a
    store written before PROTOCOL §3's segment rule). ``etag``: what the store answered
    for the create or read of that key; ``own_create``: the create was ours (200);
    ``ts_range``: the batch's (min, max) point time in ns, from its frame."""
    low, high = ts_range if ts_range is not None else (None, None)
    return IndexRow(
        kind="accepted",
        key=key or manifest.manifest_key,
        frame_sha256=manifest.frame_sha256,
        time_unix_ns=manifest.accepted_at_unix_ns,
        raw_blob_key=manifest.raw_blob_key,
        agent_id=manifest.agent_id,
        boot_id=manifest.boot_id,
        seq_start=manifest.seq_start,
        seq_end=manifest.seq_end,
        record_count=manifest.record_count,
        frame_bytes=manifest.frame_bytes,
        etag=etag,
        own_create=own_create,
        min_ts_ns=low,
        max_ts_ns=high,
        raw_offset=manifest.raw_offset,
        raw_length=manifest.raw_length,
    )


def quarantine_row(
    conflict: IdentityConflict,
    *,
    key: str | None = None,
    etag: str | None = None,
    own_create: bool | None = None,
) -> IndexRow:
    return IndexRow(
        kind="quarantine",
        key=key or conflict.quarantine_key,
        frame_sha256=conflict.submitted_frame_sha256,
        accepted_frame_sha256=conflict.accepted_frame_sha256,
        time_unix_ns=conflict.observed_at_unix_ns,
        raw_blob_key=conflict.submitted_raw_blob_key,
        agent_id=conflict.agent_id,
        boot_id=conflict.boot_id,
        seq_start=conflict.seq_start,
        seq_end=conflict.seq_end,
        etag=etag,
        own_create=own_create,
    )


def blob_row(sha: str, created_at_unix_ns: int, *, bundle: bool = False) -> IndexRow:
    """The ``blob`` row of a raw object created (or maybe created) at that time: the frame
    blob of ``sha``, or with ``bundle`` the bundle whose bytes hash to ``sha`` (PROTOCOL
    §3.10: the row's hash is always its raw object's)."""
    return IndexRow(
        kind="blob",
        key=keys.raw_bundle_key(sha) if bundle else keys.raw_blob_key(sha),
        frame_sha256=sha,
        time_unix_ns=created_at_unix_ns,
    )


def encode(rows: Sequence[IndexRow]) -> bytes:
    """One Parquet file (zstd) holding ``rows`` in the given order."""
    return encode_table(table_of(rows))


def encode_table(table: pa.Table) -> bytes:
    """One Parquet file (zstd) of a `FILE_SCHEMA` table, its schema metadata kept."""
    if not table.schema.remove_metadata().equals(FILE_SCHEMA):
        raise ValueError(f"index table schema {table.schema} is not FILE_SCHEMA")
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def rows_of(table: pa.Table) -> list[IndexRow]:
    """A `FILE_SCHEMA` table's rows as objects: for the few rows that need one (a read
    back, a problem's text), never a whole hour."""
    data = table.select(SCHEMA.names).to_pydict()
    return [
        IndexRow(**{name: data[name][i] for name in SCHEMA.names}) for i in range(table.num_rows)
    ]


def table_of(rows: Sequence[IndexRow]) -> pa.Table:
    """Rows as a `FILE_SCHEMA` table (``key_digest`` computed)."""
    columns: dict[str, list[object]] = {
        name: [getattr(row, name) for row in rows] for name in SCHEMA.names
    }
    columns["key_digest"] = [key_digest(row.key) for row in rows]
    for field in RANK_FIELDS:
        columns[field.name] = [None] * len(rows)  # first written here (`index.catalog_rank`)
    return pa.Table.from_pydict(columns, schema=FILE_SCHEMA)


def read_table(body: bytes, *, source: str) -> pa.Table:
    """One index file as a table of exactly `FILE_SCHEMA` (columns added since it was
    written are null; ``key_digest`` computed when absent). Rows are not validated here:
    `index.row_checks` does that column-wise. `IndexFileError` naming ``source`` when the
    body is not an index file."""
    batches = list(iter_batches(body, source=source))
    if not batches:
        return FILE_SCHEMA.empty_table()
    return pa.Table.from_batches(batches, schema=FILE_SCHEMA)


def iter_batches(body: bytes, *, source: str, batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """`read_table` a batch of at most ``batch_rows`` rows at a time (bounded memory for
    a file of a whole hour)."""
    try:
        parquet = pq.ParquetFile(io.BytesIO(body))
        present = set(parquet.schema_arrow.names)
        missing = [n for n in SCHEMA.names if n not in present and n not in OPTIONAL_COLUMNS]
        if missing:
            raise ValueError(f"missing columns {missing}")
        wanted = [n for n in FILE_SCHEMA.names if n in present]
        # One thread: a segment is small, and a thread pool hop costs more than it saves
        # (bench.steady: ~0.5 ms per segment).
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=wanted, use_threads=False):
            yield _normalized(batch, present)
    except (pa.ArrowException, OSError, KeyError, ValueError, TypeError) as exc:
        raise IndexFileError(f"{source}: not an index file: {exc}") from None


def _normalized(batch: pa.RecordBatch, present: set[str]) -> pa.RecordBatch:
    columns = []
    for field in FILE_SCHEMA:
        if field.name in present:
            columns.append(batch.column(field.name).cast(field.type, safe=True))
        elif field.name == "key_digest":
            digests = [key_digest(k) for k in batch.column("key").to_pylist()]
            columns.append(pa.array(digests, field.type))
        else:
            columns.append(pa.nulls(batch.num_rows, field.type))
    return pa.RecordBatch.from_arrays(columns, schema=FILE_SCHEMA)


def check_row(row: IndexRow, *, source: str) -> None:
    """Raise `IndexFileError` unless ``row`` is consistent (kind, hashes, identity)."""
    problem = _problem(row)
    if problem:
        raise IndexFileError(f"{source}: bad {row.kind!r} row {row.key!r}: {problem}")


def _problem(row: IndexRow) -> str | None:
    if row.kind not in ROW_KINDS:
        return "unknown kind"
    if row.key is None or row.frame_sha256 is None or row.time_unix_ns is None:
        return "key, frame_sha256 and time_unix_ns are required"
    try:
        keys.check_sha256(row.frame_sha256)
        if row.kind == "blob":  # a frame blob's or a bundle's (PROTOCOL §3.10)
            if keys.parse_raw_object_key(row.key)[1] != row.frame_sha256:
                return "blob key does not name frame_sha256"
            return None
        quarantine = row.kind == "quarantine" or (
            row.kind == "retracted" and row.key.startswith(keys.QUARANTINE_PREFIX)
        )
        if (problem := _raw_key_problem(row, quarantine=quarantine)) is not None:
            return problem
        if quarantine:
            keys.check_sha256(row.accepted_frame_sha256 or "")
        row.identity  # noqa: B018  (validates agent, boot, seq)
    except (keys.KeyFormatError, ValueError) as exc:
        return str(exc)
    return None


def _raw_key_problem(row: IndexRow, *, quarantine: bool) -> str | None:
    """`index.row_checks.raw_keys_ok` for one row (its words): the frame blob of
    ``frame_sha256`` with no range, or (accepted rows) a bundle with a frame's range."""
    if row.raw_offset is None and row.raw_length is None:
        if row.raw_blob_key != keys.raw_blob_key(row.frame_sha256):
            return "raw_blob_key is not the key of frame_sha256"
        return None
    if quarantine:
        return "a quarantine row names frame blobs only, with no range"
    if row.raw_offset is None or row.raw_length is None:
        return "raw_offset and raw_length are given together or not at all"
    keys.parse_raw_bundle_key(row.raw_blob_key or "")
    if row.raw_offset < 0 or row.raw_length != row.frame_bytes:
        return (
            f"range [{row.raw_offset}, +{row.raw_length}) is not a frame of {row.frame_bytes} bytes"
        )
    if not FRAME_LENGTHS[0] <= row.raw_length <= FRAME_LENGTHS[1]:
        return f"raw_length {row.raw_length} is not a frame's length"
    return None
