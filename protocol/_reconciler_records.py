"""The reconciler's records (PROTOCOL §3.7): audits, catalog-created entries, problems,
retractions and the index checkpoint. Part of `protocol.records` (``records.AuditRecord``,
...)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from protocol._record_base import NonNegative, Record


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
    bundles_listed: int = Field(default=0, ge=0)
    """Bundles the listing showed (PROTOCOL §3.10; of ``blobs_listed``, which counts every
    raw object), with their listed bytes (``bundle_bytes``) and ``bundle_dead_bytes``:
    per bundle, its listed size less the bytes of the distinct ranges catalog rows name
    in it (no GET; its index and footer count as dead); ``bundle_pinned_bytes``: bundles
    raw retention retired some naming rows of but not all (kept whole). 0 in audits
    written before."""
    bundle_bytes: int = Field(default=0, ge=0)
    bundle_dead_bytes: int = Field(default=0, ge=0)
    bundle_pinned_bytes: int = Field(default=0, ge=0)
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
    reread_ranks: bool | None = None
    """Whether this audit reads back every listed key whose catalog rows are of more than
    one rank (PROTOCOL §3.7: the first audit after the rank columns came, since a merge of
    before may have made a stale row outrank a superseding one). ``None``: an audit of a
    version before ranks; a new audit rereads unless a completed one says ``False`` or
    ``True`` (its reread, or an earlier one, is done)."""
    phantoms_checked: bool = False
    """The joins looked for ``phantom-row``s: cataloged keys the listing lacked (only a
    listing audit that walked everything in one run can)."""
    engine: Literal["local", "spark"] = "local"
    """What ran the listing and the joins (``reconciler.audit_engine``)."""
    ran_from_unix_ns: int | None = Field(default=None, ge=0)
    """Store time the audit's first run began (``started_at_unix_ns`` is an Inventory
    report's time for an inventory audit): ``completed - ran_from`` is its duration,
    crashes and resumptions included."""
    keys_listed: dict[str, int] = Field(default_factory=dict)
    """Keys listed (or read from an Inventory report) per prefix: ``accepted``,
    ``quarantine``, ``raw-blobs``."""
    requests: dict[str, int] = Field(default_factory=dict)
    """Store requests of the audit's bulk reads, by kind, across its runs: ``LIST`` (the
    catalog's listing and every listing page, the executors' on Spark) and ``GET`` (the
    catalog files and listing parts copied, local engine). The reads of the few records
    the joins name are not counted here."""
    spilled_bytes: int = Field(default=0, ge=0)
    """The most the audit's spill directory held at a progress save (the local engine's
    catalog and listing copies and DuckDB's spill files): the local disk it needs."""


CATALOG_WRITER_PATTERN = r"^(steady|compaction|retraction|audit-[0-9a-f]{8,32})$"
"""Who wrote a catalog file (`CatalogCreated.writer`): the steady pass, compaction, a
retraction, or the audit of that id (`CatalogCreated.audit_writer`)."""


class CatalogCreated(Record):
    """``index/v1/catalog-created/<epoch:010d>-<sequence:010d>``: one catalog file was
    created (PROTOCOL §3.5 rule 2, §3.7), written by the catalog writer right after the
    file. ``hour`` and ``writer`` are ``None`` in entries written before they existed."""

    schema_: Literal["lightmetrics.catalog_created.v1"] = Field(
        default="lightmetrics.catalog_created.v1", alias="schema"
    )
    catalog_key: str = Field(min_length=1)
    rows: int = NonNegative
    hour: str | None = Field(default=None, pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}$")
    """The file's UTC hour, ``YYYY-MM-DDTHH`` (`keys.UtcHour.iso`, as a work marker's)."""
    writer: str | None = Field(default=None, pattern=CATALOG_WRITER_PATTERN)
    """Who wrote the file: ``steady``, ``audit-<audit id>``, ``compaction`` or
    ``retraction``. Re-marking after a stopped audit (`reconciler.audit.remark`) marks
    only that audit's files, and those of entries without a writer."""

    @staticmethod
    def audit_writer(audit_id: str) -> str:
        """The ``writer`` of the catalog files the audit ``audit_id`` writes."""
        return f"audit-{audit_id}"


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
