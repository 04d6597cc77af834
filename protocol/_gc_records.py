"""The GC's records (PROTOCOL §3.5): marks, vetoes, log entries, run records and raw
retention's progress. Part of `protocol.records` (``records.GcMark``, ...)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from protocol._record_base import NonNegative, Record, Sha256Hex

GcReason = Literal["orphan", "raw-retention"]


class GcMark(Record):
    """``gc/v1/marks/<sha>.json``: a GC run's intent to delete an orphan raw object: a
    frame blob, or a bundle (PROTOCOL §3.10), whose hash ``frame_sha256`` is and whose key
    ``raw_blob_key`` is (the GC acts on that key, and on a mark only when the key names
    that hash).

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
    """``gc/v1/vetoes/<sha>.json``: a collector saw this raw object in use after it was
    marked. ``frame_sha256`` is the object's hash (a bundle's for a bundle, PROTOCOL
    §3.10: never the hash of a frame inside it)."""

    schema_: Literal["lightmetrics.gc_veto.v1"] = Field(
        default="lightmetrics.gc_veto.v1", alias="schema"
    )
    frame_sha256: str = Sha256Hex
    vetoed_at_unix_ns: int = NonNegative
    collector_id: str = Field(min_length=1)
    raw_blob_key: str | None = None
    """The vetoed raw object's key (PROTOCOL §3.10: "Marks and vetoes record the object's
    key"); vetoes written before bundles lack it: the frame blob of ``frame_sha256``.
    Informational: the GC checks a veto by its key's hash, as its mark."""


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
    stalled: str | None = None
    """Why the run's rule-2 catalog read proved nothing, so it deleted nothing (a reason of
    `reconciler.gc.catalog_since.STALL_REASONS`); None when it did not stall."""


class RawRetention(Record):
    """``gc/v1/raw-retention.json``: raw retention's progress (PROTOCOL §4.1).

    Every accepted hour before ``retired_before`` is *retired*: it ended more than
    ``retention.raw_days`` before it was retired, a completed listing audit sealed it
    (its catalog holds every batch accepted in it), and the rollup ledger included every
    one of its batches (same count and setsum). A retired hour's accepted rows no longer
    keep their raw blobs alive; quarantine rows still do. It only ever moves forward
    (`reconciler.gc.raw_retention`), and the audit re-checks each retired hour against the
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
