"""Every JSON record of PROTOCOL §3-§4 as a frozen model: the one place for their schemas.

Records are read back from the store by other processes (and by other versions of this
code), so parsing validates everything: `RecordError` names the record and the problem.
Unknown extra fields are ignored on read (additive v1 evolution); ``schema`` must match.

Contract notes (PROTOCOL is silent on these; decided here):
- Derived index entries (`accepted-by-time`, `accepted-by-blob`, `raw-blobs-by-time`,
  `quarantine-by-blob`) share one shape, `IndexEntry`, with ``kind`` naming the index,
  ``source_key`` the record (or blob) it indexes, ``frame_sha256``, and
  ``indexed_time_unix_ns``, the time that chose its hour.
- GC marks, vetoes and log entries and the rollup-dirty marker are defined here too.

The GC's records are in ``_gc_records.py``, the reconciler's in ``_reconciler_records.py``,
the base in ``_record_base.py``; all are ``records.*`` (imported as themselves below).
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from protocol import keys
from protocol._gc_records import GcLogEntry as GcLogEntry
from protocol._gc_records import GcMark as GcMark
from protocol._gc_records import GcReason as GcReason
from protocol._gc_records import GcRunRecord as GcRunRecord
from protocol._gc_records import GcVeto as GcVeto
from protocol._gc_records import RawRetention as RawRetention
from protocol._reconciler_records import AuditRecord as AuditRecord
from protocol._reconciler_records import CatalogCreated as CatalogCreated
from protocol._reconciler_records import IndexCheckpoint as IndexCheckpoint
from protocol._reconciler_records import ProblemRecord as ProblemRecord
from protocol._reconciler_records import RetractionRecord as RetractionRecord
from protocol._record_base import U64 as U64
from protocol._record_base import NonNegative as NonNegative
from protocol._record_base import Record as Record
from protocol._record_base import RecordError as RecordError
from protocol._record_base import Sha256Hex as Sha256Hex
from protocol.frame import decode_header


def _canonical_boot_id(value: Any) -> str:
    if isinstance(value, uuid.UUID):
        parsed = value
    elif isinstance(value, str):
        parsed = uuid.UUID(value)
        if str(parsed) != value:
            raise ValueError(
                f"boot_id must be the canonical lowercase hyphenated UUID, got {value!r}"
            )
    else:
        raise ValueError("boot_id must be a UUID string")
    if parsed.int == 0:
        raise ValueError("boot_id must not be all zero")
    return str(parsed)


class _IdentityFields(Record):
    agent_id: str = Field(min_length=1)
    boot_id: str
    seq_start: int = U64
    seq_end: int = U64

    _check_boot_id = field_validator("boot_id", mode="before")(_canonical_boot_id)

    @model_validator(mode="after")
    def _identity_is_valid(self) -> Self:
        try:
            self.identity  # noqa: B018 - constructing it validates agent_id length and seq order
        except keys.KeyFormatError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def identity(self) -> keys.BatchIdentity:
        return keys.BatchIdentity(
            self.agent_id, uuid.UUID(self.boot_id), self.seq_start, self.seq_end
        )


class AcceptedManifest(_IdentityFields):
    """PROTOCOL §3.1: the acceptance record; created once, never modified or deleted."""

    schema_: Literal["lightmetrics.accepted_batch.v1"] = Field(
        default="lightmetrics.accepted_batch.v1", alias="schema"
    )
    record_count: int = Field(ge=1, le=2**32 - 1)
    frame_sha256: str = Sha256Hex
    frame_bytes: int = Field(ge=56)
    raw_blob_key: str
    accepted_at_unix_ns: int = NonNegative
    collector_id: str = Field(min_length=1)
    wire_version: Literal[1] = 1
    frame_version: Literal[1] = 1

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.record_count != self.seq_end - self.seq_start + 1:
            raise ValueError(
                f"record_count {self.record_count} != seq_end - seq_start + 1 = "
                f"{self.seq_end - self.seq_start + 1}"
            )
        if self.raw_blob_key != keys.raw_blob_key(self.frame_sha256):
            raise ValueError(f"raw_blob_key {self.raw_blob_key!r} does not match frame_sha256")
        return self

    @classmethod
    def of_frame(
        cls,
        frame: bytes,
        *,
        accepted_at_unix_ns: int,
        collector_id: str,
        identity: keys.BatchIdentity | None = None,
        frame_sha256: str | None = None,
    ) -> Self:
        """The manifest a collector creates when it accepts ``frame`` (PROTOCOL §3.1,
        §3.2): the identity from the frame's header unless given (a caller that decoded it
        already), its SHA-256 unless given (the collector hashed the body as it read it).
        Raises `protocol.frame.FrameError` when the header must be read and is not valid."""
        if identity is None:
            header = decode_header(frame)
            identity = keys.BatchIdentity(
                header.agent_id, header.boot_id, header.seq_start, header.seq_end
            )
        sha = frame_sha256 if frame_sha256 is not None else hashlib.sha256(frame).hexdigest()
        return cls(
            agent_id=identity.agent_id,
            boot_id=str(identity.boot_id),
            seq_start=identity.seq_start,
            seq_end=identity.seq_end,
            record_count=identity.seq_end - identity.seq_start + 1,
            frame_sha256=sha,
            frame_bytes=len(frame),
            raw_blob_key=keys.raw_blob_key(sha),
            accepted_at_unix_ns=accepted_at_unix_ns,
            collector_id=collector_id,
        )

    @property
    def manifest_key(self) -> str:
        return keys.accepted_manifest_key(self.identity)

    @property
    def accepted_hour(self) -> keys.UtcHour:
        return keys.UtcHour.from_unix_ns(self.accepted_at_unix_ns)


class IdentityConflict(_IdentityFields):
    """PROTOCOL §3.3: the quarantine record of a second, different frame for an identity."""

    schema_: Literal["lightmetrics.identity_conflict.v1"] = Field(
        default="lightmetrics.identity_conflict.v1", alias="schema"
    )
    accepted_manifest_key: str
    accepted_raw_blob_key: str
    accepted_frame_sha256: str = Sha256Hex
    submitted_raw_blob_key: str
    submitted_frame_sha256: str = Sha256Hex
    observed_at_unix_ns: int = NonNegative
    collector_id: str = Field(min_length=1)
    accepted_blob_present: bool = True
    """PROTOCOL §3.2: False when the collector found the accepted blob already deleted
    (raw retention) after holding off its deletion; records written before the field
    lack it (true). Informational: the accepted manifest, not this record, says whether
    that blob should exist (the audit's ``missing-blob`` follows the manifest's row), and
    a record naming the hash still keeps a blob re-created under it (§3.5 rule 7)."""

    @property
    def quarantine_key(self) -> str:
        return keys.quarantine_key(self.identity, self.submitted_frame_sha256)


IndexKind = Literal[
    "accepted-by-time", "accepted-by-blob", "raw-blobs-by-time", "quarantine-by-blob"
]


class IndexEntry(Record):
    """A derived index entry; rebuildable from ``accepted/v1/`` and ``quarantine/v1/``."""

    schema_: Literal["lightmetrics.index_entry.v1"] = Field(
        default="lightmetrics.index_entry.v1", alias="schema"
    )
    kind: IndexKind
    source_key: str = Field(min_length=1)
    frame_sha256: str = Sha256Hex
    indexed_time_unix_ns: int = NonNegative


class RollupDirty(Record):
    """``work/v1/rollup-dirty/...``: an hour gained accepted batches the rollup must see."""

    schema_: Literal["lightmetrics.rollup_dirty.v1"] = Field(
        default="lightmetrics.rollup_dirty.v1", alias="schema"
    )
    hour: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}$")
    marked_at_unix_ns: int = NonNegative


class LeaseRecord(Record):
    """PROTOCOL §4 owner lease (also used for the reconciler's lease): exactly these fields."""

    owner: str = Field(min_length=1)
    epoch: int = Field(ge=1)
    expires_at_unix_ns: int = NonNegative


class RollupPointer(Record):
    """PROTOCOL §4: ``rollup/v1/_latest_manifest``, swapped with If-Match: the commit point."""

    schema_: Literal["lightmetrics.rollup_pointer.v1"] = Field(
        default="lightmetrics.rollup_pointer.v1", alias="schema"
    )
    version: int = Field(ge=1)
    manifest_key: str


class RollupReaderLease(Record):
    """``rollup/v1/readers/<id>.json`` (PROTOCOL §4.1): a long reader pins the snapshot at
    ``manifest_key`` (``version``) until ``expires_at_unix_ns``, in store time. Created
    with If-None-Match, renewed with If-Match, deleted when the read ends; vacuum keeps
    every file of a snapshot an unexpired lease pins, and deletes expired leases."""

    schema_: Literal["lightmetrics.rollup_reader.v1"] = Field(
        default="lightmetrics.rollup_reader.v1", alias="schema"
    )
    reader: str = Field(pattern=r"^[0-9A-Za-z_-][0-9A-Za-z._-]{0,127}$")
    version: int = Field(ge=1)
    manifest_key: str = Field(min_length=1)
    expires_at_unix_ns: int = NonNegative
    purpose: str = Field(default="", max_length=200)

    @model_validator(mode="after")
    def _manifest_key_is_a_snapshot(self) -> RollupReaderLease:
        if not self.manifest_key.startswith(keys.ROLLUP_MANIFESTS_PREFIX):
            raise ValueError(
                f"manifest_key must be under {keys.ROLLUP_MANIFESTS_PREFIX}, "
                f"got {self.manifest_key!r}"
            )
        return self


class RollupWorkMarker(Record):
    """``work/v1/rollup-dirty/catalog/<hour>/<name>.json``: the catalog file of the same
    name gained rows the rollup may not have (PROTOCOL §3.7, rollup work markers)."""

    schema_: Literal["lightmetrics.rollup_work.v1"] = Field(
        default="lightmetrics.rollup_work.v1", alias="schema"
    )
    catalog_key: str = Field(min_length=1)
    hour: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}$")
    rows: int = NonNegative
    written_at_unix_ns: int = NonNegative
