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
the feature record and version entries in ``_feature_records.py``, the base in
``_record_base.py``; all are ``records.*`` (imported as themselves below).
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any, ClassVar, Literal, Self

from pydantic import Field, ValidationInfo, field_validator, model_validator

from protocol import keys
from protocol._feature_records import FeatureRecord as FeatureRecord
from protocol._feature_records import VersionEntry as VersionEntry
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

READS_BUNDLES = "reads_bundles"
"""The validation-context flag of a reader that reads bundled records (PROTOCOL §3.10)."""


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
    raw_offset: int | None = Field(default=None, ge=0, le=keys.MAX_U64)
    raw_length: int | None = Field(default=None, ge=56, le=2**32 - 1)
    """PROTOCOL §3.10: a bundled batch's frame is bytes [raw_offset, +raw_length) of the
    bundle `raw_blob_key` names (`raw_length` = `frame_bytes`); both absent (records
    written before bundles, and every frame blob's record) means the whole frame blob of
    `frame_sha256`. A range is parsed only by a reader that says it reads bundles
    (`from_json(..., reads_bundles=True)`): any other refuses the record as today's code
    does, which is what §3.10's feature gate counts on. `max_frame_bytes` and the
    bundle's index are the reader's checks (`protocol.bundle.check_range`, `read_frame`)."""

    _omit_when_none: ClassVar[frozenset[str]] = frozenset({"raw_offset", "raw_length"})

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Self:
        if self.record_count != self.seq_end - self.seq_start + 1:
            raise ValueError(
                f"record_count {self.record_count} != seq_end - seq_start + 1 = "
                f"{self.seq_end - self.seq_start + 1}"
            )
        if self.raw_offset is None and self.raw_length is None:
            if self.raw_blob_key != keys.raw_blob_key(self.frame_sha256):
                raise ValueError(f"raw_blob_key {self.raw_blob_key!r} does not match frame_sha256")
            return self
        if self.raw_offset is None or self.raw_length is None:
            raise ValueError("raw_offset and raw_length are given together or not at all")
        if not (info.context or {}).get(READS_BUNDLES):
            raise ValueError(
                f"raw_blob_key {self.raw_blob_key!r} with a range names a bundle "
                "(PROTOCOL §3.10), which this reader does not read"
            )
        try:
            keys.parse_raw_bundle_key(self.raw_blob_key)
        except keys.KeyFormatError as exc:
            raise ValueError(f"a record with a range must name a bundle: {exc}") from None
        if self.raw_length != self.frame_bytes:
            raise ValueError(f"raw_length {self.raw_length} != frame_bytes {self.frame_bytes}")
        return self

    @classmethod
    def from_json(cls, data: bytes | str, *, reads_bundles: bool = False) -> Self:
        """Parse a stored manifest; with `reads_bundles`, a bundled one (a range) too."""
        if not reads_bundles:
            return super().from_json(data)
        return cls._from_json(data, context={READS_BUNDLES: True})

    @property
    def raw_range(self) -> tuple[int, int] | None:
        """(offset, length) of the frame in the bundle `raw_blob_key` names, or None: the
        record names the frame blob of its `frame_sha256`, whole."""
        if self.raw_offset is None or self.raw_length is None:
            return None
        return self.raw_offset, self.raw_length

    @classmethod
    def of_frame(
        cls,
        frame: bytes,
        *,
        accepted_at_unix_ns: int,
        collector_id: str,
        identity: keys.BatchIdentity | None = None,
        frame_sha256: str | None = None,
        bundle: tuple[str, int] | None = None,
    ) -> Self:
        """The manifest a collector creates when it accepts ``frame`` (PROTOCOL §3.1,
        §3.2): the identity from the frame's header unless given (a caller that decoded it
        already), its SHA-256 unless given (the collector hashed the body as it read it);
        with `bundle` = (bundle key, offset of the frame in it), the bundled form (§3.10).
        Raises `protocol.frame.FrameError` when the header must be read and is not valid."""
        if identity is None:
            header = decode_header(frame)
            identity = keys.BatchIdentity(
                header.agent_id, header.boot_id, header.seq_start, header.seq_end
            )
        sha = frame_sha256 if frame_sha256 is not None else hashlib.sha256(frame).hexdigest()
        fields: dict[str, Any] = {
            "agent_id": identity.agent_id,
            "boot_id": str(identity.boot_id),
            "seq_start": identity.seq_start,
            "seq_end": identity.seq_end,
            "record_count": identity.seq_end - identity.seq_start + 1,
            "frame_sha256": sha,
            "frame_bytes": len(frame),
            "raw_blob_key": keys.raw_blob_key(sha),
            "accepted_at_unix_ns": accepted_at_unix_ns,
            "collector_id": collector_id,
        }
        if bundle is None:
            return cls(**fields)
        fields.update(raw_blob_key=bundle[0], raw_offset=bundle[1], raw_length=len(frame))
        return cls._validate(fields, context={READS_BUNDLES: True})

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
