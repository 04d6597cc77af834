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
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from protocol import keys
from protocol.frame import decode_header

Sha256Hex = Field(pattern=r"^[0-9a-f]{64}$")
U64 = Field(ge=0, le=keys.MAX_U64)
NonNegative = Field(ge=0)


class RecordError(ValueError):
    """A stored JSON record is malformed or inconsistent."""


class Record(BaseModel):
    """Base: frozen, validated, ignores unknown fields, compact JSON."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    def to_json(self) -> bytes:
        """Compact JSON with ``schema`` first, as PROTOCOL shows the records."""
        fields = self.model_dump(mode="json", by_alias=True)
        if "schema" in fields:
            fields = {"schema": fields.pop("schema"), **fields}
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | str) -> Self:
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<record>'}: {err['msg']}"
                for err in exc.errors()
            )
            raise RecordError(f"invalid {cls.__name__}: {problems}") from None


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


GcReason = Literal["orphan", "raw-retention"]


class GcMark(Record):
    """``gc/v1/marks/<sha>.json``: a GC run's intent to delete an orphan blob.

    ``state`` is an addition to PROTOCOL §3.5, needed to close a race: the GC moves the
    mark from ``marked`` to ``deleting`` with If-Match *before* its last veto check and
    the delete, and removes the mark afterwards. A collector that finds a mark writes its
    veto and then re-reads the mark: still ``marked`` means the GC's last veto check is
    yet to come and will see the veto; ``deleting`` or gone means the blob may be deleted
    under it, so it waits for the mark to go and re-creates the blob (If-None-Match).

    A ``deleting`` mark also records the reconciler lease it was written under:
    ``lease_epoch`` and that lease's ``lease_expires_at_unix_ns`` (store time) as it stood
    then. The deleter sends its signed DELETE only if the request expires before that
    instant (PROTOCOL §3.5 rule 6), so nobody resolves the mark before it plus the settle
    time (`reconciler.gc.delete`). Marks written before these fields existed lack them.
    """

    schema_: Literal["lightmetrics.gc_mark.v1"] = Field(
        default="lightmetrics.gc_mark.v1", alias="schema"
    )
    frame_sha256: str = Sha256Hex
    raw_blob_key: str
    marked_at_unix_ns: int = NonNegative
    gc_run_id: str = Field(min_length=1)
    state: Literal["marked", "deleting"] = "marked"
    reason: GcReason = "orphan"
    """Which proof replaces rule 2 of PROTOCOL §3.5: ``orphan`` (no catalog row references
    the blob) or ``raw-retention`` (only accepted rows of retired hours do, PROTOCOL §4.1).
    Informational: the deletion is proven afresh by a later audit either way."""
    deleting_since_unix_ns: int | None = None
    lease_epoch: int | None = Field(default=None, ge=1)
    lease_expires_at_unix_ns: int | None = Field(default=None, ge=0)


class GcVeto(Record):
    """``gc/v1/vetoes/<sha>.json``: a collector saw this blob in use after it was marked."""

    schema_: Literal["lightmetrics.gc_veto.v1"] = Field(
        default="lightmetrics.gc_veto.v1", alias="schema"
    )
    frame_sha256: str = Sha256Hex
    vetoed_at_unix_ns: int = NonNegative
    collector_id: str = Field(min_length=1)


class GcLogEntry(Record):
    """``gc/v1/log/...``: one deletion and the proof it rested on."""

    schema_: Literal["lightmetrics.gc_log.v1"] = Field(
        default="lightmetrics.gc_log.v1", alias="schema"
    )
    frame_sha256: str = Sha256Hex
    raw_blob_key: str
    blob_last_modified_ns: int = NonNegative
    marked_at_unix_ns: int = NonNegative
    audit_started_at_unix_ns: int = NonNegative
    deleted_at_unix_ns: int = NonNegative
    gc_run_id: str = Field(min_length=1)
    reason: GcReason = "orphan"


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


class AuditRecord(Record):
    """``reconciler/v1/audits/<start>-<id>.json``: one full audit of accepted/ and quarantine/.

    Written when the audit starts (``status = running``), updated with ``cursors`` as it
    goes (so a crashed audit resumes after the last key it finished), and finally with
    ``status = completed``. GC trusts only completed audits (PROTOCOL §3.5 rule 5): every
    record that existed when the audit started is in the catalog (PROTOCOL §3.7).
    ``catalog = true`` marks audits of the index era (this version): only those listed
    ``raw-blobs/v1/`` and wrote ``orphans`` (the count of the orphan file,
    `keys.audit_orphans_key`), so only those qualify for GC deletions; ``cataloged`` counts
    the records the anti-join found missing and cataloged, ``blobs_listed`` the listing.
    """

    schema_: Literal["lightmetrics.audit.v1"] = Field(
        default="lightmetrics.audit.v1", alias="schema"
    )
    audit_id: str = Field(pattern=r"^[0-9a-f]{8,32}$")
    started_at_unix_ns: int = NonNegative
    completed_at_unix_ns: int | None = None
    status: Literal["running", "completed"] = "running"
    source: Literal["listing", "inventory"] = "listing"
    owner_epoch: int = Field(ge=0)
    cursors: dict[str, str] = Field(default_factory=dict)
    manifests_seen: int = Field(default=0, ge=0)
    quarantines_seen: int = Field(default=0, ge=0)
    repaired: dict[str, int] = Field(default_factory=dict)
    problems: int = Field(default=0, ge=0)
    catalog: bool = False
    cataloged: int = Field(default=0, ge=0)
    blobs_listed: int = Field(default=0, ge=0)
    orphans: int | None = Field(default=None, ge=0)
    catalog_created_from: str | None = Field(default=None, pattern=r"^\d{10}-\d{10}$")
    """The ``index/v1/catalog-created/`` entry name (``<epoch:010d>-<sequence:010d>``) from
    which every catalog file created after this audit started is named: recorded at the
    start, before anything is listed (PROTOCOL §3.5 rule 2). The GC reads the catalog
    files of the entries from here on; an audit without it (written before the entries
    existed) cannot serve as the GC's rule-5 audit."""
    pin_expires_at_unix_ns: int | None = Field(default=None, ge=0)
    """While ``running``: the store time until which the audit pins the catalog files it
    reads (compaction deletes none of them); renewed as the audit goes, lapsed after it
    (PROTOCOL §3.7, ``reconciler.audit_pin_s``). ``None``: no pin."""
    pinned_through_unix_ns: int | None = Field(default=None, ge=0)
    """The pinned files: every catalog file last modified at or before this store time
    (the end of the audit's catalog listing); ``None`` with a pin: every catalog file
    (the listing is still going)."""
    phantoms_checked: bool = False
    """The joins looked for ``phantom-row``s: cataloged keys the listing lacked (only a
    listing audit that walked everything in one run can)."""


class CatalogCreated(Record):
    """``index/v1/catalog-created/<epoch:010d>-<sequence:010d>``: one catalog file was
    created (PROTOCOL §3.7), written by the catalog writer right after the file."""

    schema_: Literal["lightmetrics.catalog_created.v1"] = Field(
        default="lightmetrics.catalog_created.v1", alias="schema"
    )
    catalog_key: str = Field(min_length=1)
    rows: int = NonNegative


class ProblemRecord(Record):
    """``reconciler/v1/problems/<kind>/<sha256 of subject>.json``: something needs a human."""

    schema_: Literal["lightmetrics.problem.v1"] = Field(
        default="lightmetrics.problem.v1", alias="schema"
    )
    kind: str
    subject_key: str
    detail: str
    first_seen_unix_ns: int = NonNegative
    last_seen_unix_ns: int = NonNegative


class RetractionRecord(Record):
    """``reconciler/v1/retractions/<sha256 of key>.json``: an operator retracted the catalog
    row of ``key``, a record the store does not hold (a ``phantom-row``, PROTOCOL §3.7)."""

    schema_: Literal["lightmetrics.retraction.v1"] = Field(
        default="lightmetrics.retraction.v1", alias="schema"
    )
    key: str = Field(min_length=1)
    by: str = Field(min_length=1, max_length=256)
    reason: str = Field(min_length=1, max_length=4096)
    retracted_at_unix_ns: int = NonNegative


class GcRunRecord(Record):
    """``reconciler/v1/gc-runs/<start>-<id>.json``: what one GC run considered and did."""

    schema_: Literal["lightmetrics.gc_run.v1"] = Field(
        default="lightmetrics.gc_run.v1", alias="schema"
    )
    run_id: str = Field(pattern=r"^[0-9a-f]{8,32}$")
    started_at_unix_ns: int = NonNegative
    completed_at_unix_ns: int | None = None
    dry_run: bool = False
    candidates: int = Field(default=0, ge=0)
    marked: int = Field(default=0, ge=0)
    vetoed: int = Field(default=0, ge=0)
    deleted: int = Field(default=0, ge=0)
    deleted_raw_retention: int = Field(default=0, ge=0)
    """Of ``deleted``, blobs deleted by raw retention (the rest were orphans)."""
    # Candidates or marks left for the next run because a store request failed.
    skipped_on_error: int = Field(default=0, ge=0)
    refused: str | None = None


class RawRetention(Record):
    """``gc/v1/raw-retention.json``: raw retention's progress (PROTOCOL §4.1).

    Every accepted hour before ``retired_before`` is *retired*: it ended more than
    ``retention.raw_days`` before it was retired, a completed listing audit sealed it
    (its catalog holds every batch accepted in it), and the rollup ledger included every
    one of its batches (same count and setsum). A retired hour's accepted rows no longer
    keep their raw blobs alive; quarantine rows still do. It only ever moves forward
    (`reconciler.raw_retention`), and the audit re-checks each retired hour against the
    ledger before it lets go of a blob."""

    schema_: Literal["lightmetrics.raw_retention.v1"] = Field(
        default="lightmetrics.raw_retention.v1", alias="schema"
    )
    retired_before: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}$")
    """An accepted hour ``YYYY-MM-DDTHH``: every hour before it is retired."""
    retired_batches: int = Field(default=0, ge=0)
    """Accepted batches in the retired hours (for reports)."""
    updated_at_unix_ns: int = NonNegative
    raw_days: float = Field(gt=0)
    """``retention.raw_days`` when it last moved."""


class IndexCheckpoint(Record):
    """``reconciler/v1/index-checkpoint.json`` (CAS-updated): how far the steady pass read
    the index log (PROTOCOL §3.7). ``log_through_ns`` is the first time of the newest
    consumed segment; ``log_seen`` the consumed segment keys whose first time lies within
    the lookback before it (the pass lists from ``log_through_ns - lookback`` and skips
    these)."""

    schema_: Literal["lightmetrics.reconciler_index_checkpoint.v1"] = Field(
        default="lightmetrics.reconciler_index_checkpoint.v1", alias="schema"
    )
    log_through_ns: int = NonNegative
    log_seen: list[str] = Field(default_factory=list)
    updated_at_unix_ns: int = NonNegative
    owner_epoch: int = Field(ge=0)
    totals: dict[str, int] = Field(default_factory=dict)
    """Cumulative counts of the steady passes (``segments``, ``accepted_rows``,
    ``records_read``, ``catalog_files``, ``markers``, ``checkpoints``): what
    ``lm-reconciler status`` turns into index requests per accepted batch."""
    etags_attest: bool | None = None
    """Whether the writer found the store's ETags able to attest a record (PROTOCOL §3.6);
    False: its steady pass reads back every record. None: written before the check."""


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
