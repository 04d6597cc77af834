"""Rows of the index (PROTOCOL §3.7) and their one Parquet encoding.

Log segments and catalog files hold the same columns; a segment's rows are *claims* by a
collector (unverified), a catalog file's rows are facts the reconciler read from the store
itself. One `IndexRow` type serves both:

| column | type | accepted | quarantine | blob (log only) |
|---|---|---|---|---|
| ``kind`` | string | ``accepted`` | ``quarantine`` | ``blob`` |
| ``key`` | string | manifest key | quarantine key | raw-blob key |
| ``frame_sha256`` | string | the batch's hash | the *submitted* hash | the blob's hash |
| ``accepted_frame_sha256`` | string? | null | the accepted hash | null |
| ``raw_blob_key`` | string? | the manifest's | the submitted blob | null |
| ``agent_id``, ``boot_id`` | string? | identity | identity | null |
| ``seq_start``, ``seq_end`` | uint64? | identity | identity | null |
| ``record_count``, ``frame_bytes`` | int64? | from the manifest | null | null |
| ``time_unix_ns`` | int64 | accepted_at | observed_at | blob creation |
| ``key_digest`` | binary(16) | BLAKE2b-128 of ``key`` (`index.digests`) | | |

Files are Parquet with zstd; a reader takes the columns by name, so later versions may add
columns. Decoding validates every row (kinds, hashes, identity-bearing keys); a file that
does not decode raises `IndexFileError`, never returns fewer rows.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq

from protocol import keys
from protocol.records import AcceptedManifest, IdentityConflict

from .digests import DIGEST_BYTES, key_digest

RowKind = Literal["accepted", "quarantine", "blob"]
ROW_KINDS: tuple[RowKind, ...] = ("accepted", "quarantine", "blob")

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
    ]
)
FILE_SCHEMA = SCHEMA.append(pa.field("key_digest", pa.binary(DIGEST_BYTES)))
"""Files also carry ``key_digest`` (BLAKE2b-128 of ``key``, `index.digests`), so a full
audit joins 16 bytes a row without hashing the catalog side."""


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

    @property
    def hour(self) -> keys.UtcHour:
        """The partition of the row: the UTC hour of ``time_unix_ns``."""
        return keys.UtcHour.from_unix_ns(self.time_unix_ns)

    @property
    def referenced_shas(self) -> tuple[str, ...]:
        """The raw blobs this row keeps alive (PROTOCOL §3.5 rule 2)."""
        if self.kind == "quarantine" and self.accepted_frame_sha256 is not None:
            return (self.frame_sha256, self.accepted_frame_sha256)
        return (self.frame_sha256,)

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


def accepted_row(manifest: AcceptedManifest, *, key: str | None = None) -> IndexRow:
    """``key``: where the manifest is stored, when not at `manifest_key` (the long form of a
    store written before PROTOCOL §3's segment rule)."""
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
    )


def quarantine_row(conflict: IdentityConflict, *, key: str | None = None) -> IndexRow:
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
    )


def blob_row(sha: str, created_at_unix_ns: int) -> IndexRow:
    return IndexRow(
        kind="blob",
        key=keys.raw_blob_key(sha),
        frame_sha256=sha,
        time_unix_ns=created_at_unix_ns,
    )


def encode(rows: Sequence[IndexRow]) -> bytes:
    """One Parquet file (zstd) holding ``rows`` in the given order."""
    columns: dict[str, list[object]] = {
        name: [getattr(row, name) for row in rows] for name in SCHEMA.names
    }
    columns["key_digest"] = [key_digest(row.key) for row in rows]
    table = pa.Table.from_pydict(columns, schema=FILE_SCHEMA)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def decode(body: bytes, *, source: str) -> list[IndexRow]:
    """Every row of one index file, validated; `IndexFileError` naming ``source`` else."""
    try:
        table = pq.read_table(io.BytesIO(body), columns=SCHEMA.names)
    except (pa.ArrowException, OSError, KeyError, ValueError) as exc:
        raise IndexFileError(f"{source}: not an index file: {exc}") from None
    data = (
        table.cast(SCHEMA, safe=True).to_pydict() if table.schema != SCHEMA else table.to_pydict()
    )
    rows = [
        IndexRow(**{name: data[name][i] for name in SCHEMA.names}) for i in range(table.num_rows)
    ]
    for row in rows:
        check_row(row, source=source)
    return rows


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
        if row.kind == "blob":
            if keys.parse_raw_blob_key(row.key) != row.frame_sha256:
                return "blob key does not name frame_sha256"
            return None
        if row.raw_blob_key != keys.raw_blob_key(row.frame_sha256):
            return "raw_blob_key is not the key of frame_sha256"
        if row.kind == "quarantine":
            keys.check_sha256(row.accepted_frame_sha256 or "")
        row.identity  # noqa: B018  (validates agent, boot, seq)
    except (keys.KeyFormatError, ValueError) as exc:
        return str(exc)
    return None


def newest_per_key(rows: Iterable[IndexRow]) -> dict[str, IndexRow]:
    """The rows by key, one per key (the union of files counts a key once)."""
    by_key: dict[str, IndexRow] = {}
    for row in rows:
        by_key.setdefault(row.key, row)
    return by_key
