"""The reconciler's sections: ``[reconciler]`` (steady pass, audits, lease, compaction),
``[gc]`` (PROTOCOL §3.5) and ``[retention]`` (raw retention, off by default)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from config.section import Seconds, Section


class ReconcilerSettings(Section):
    """``[reconciler]``: repair loop, audits and the active/standby lease."""

    lease_ttl_s: Seconds = 30.0
    loop_interval_s: Seconds = 10.0
    lookback_s: Seconds = 300.0
    """How far behind its position the steady pass lists the index log again, for
    segments that appear late (PROTOCOL §3.7): at least the collectors' clock skew plus
    their flush age plus a PUT's latency and retries."""
    max_audit_interval_s: Seconds = 24 * 3600.0
    """A full (listing) audit completes at least this often (PROTOCOL §3.7): the backstop
    for log rows lost in a crash, and what the GC's deletions wait for."""
    catalog_grace_s: Seconds = 600.0
    """How long after compacting an hour's catalog files their inputs are deleted; longer
    than any reader's listing-to-read time (`reconciler.compaction`)."""
    audit_pin_s: Seconds = 3600.0
    """How long a running audit's pin on the catalog files it reads lasts unless renewed
    (it renews as it goes): compaction deletes none of them meanwhile; an audit whose pin
    lapsed starts again with a new start time (PROTOCOL §3.7)."""
    verify_rate_per_s: float = Field(default=200.0, gt=0)
    """Raw blobs per second read back and SHA-256-checked while a full audit runs (bounds
    store load). Verification walks ``raw-blobs/v1/`` with a cursor kept in the audit
    records, so a round over every blob spans audits (`reconciler.audit.blob_verify`)."""
    verify_bytes_per_s: float = Field(default=16 * 1024 * 1024, ge=1024, le=10 * 1024**3)
    """Bundle bytes per second read back and checked while a full audit runs (PROTOCOL
    §3.10): bundles are walked under ``raw-bundles/v1/`` with their own cursor, each read
    whole and checked (SHA-256, index, every frame), paced by size rather than by count
    (`reconciler.bundle_verify`). The default, 16 MiB/s, is two of the largest default
    bundles a second: well within one connection, and a round over 1 TiB of bundles takes
    about 18 hours of audit time. At least 1 KiB/s, at most 10 GiB/s."""
    concurrency: int = Field(default=16, ge=1)
    """Store requests in flight at once."""
    audit_memory_limit_mb: int = Field(default=1024, ge=64)
    """Memory for the reconciler's out-of-core work in DuckDB: catalog merges take a
    quarter of it, the audit's joins half (the audit's process needs the rest); beyond
    it DuckDB spills to a temporary directory (PROTOCOL §3.9)."""
    audit_spill_dir: str | None = None
    """Where a full audit keeps its working files (copies of the pinned catalog files, of
    its listing parts, DuckDB's tables and spill), in a directory ``lm-audit-*`` of its
    own, removed when the audit ends (one a killed audit left is removed by the next
    audit: `reconciler.audit.spill`); ``None`` = the system's temporary directory. Needs about
    the catalog's and the listing's size plus what DuckDB spills (~12 GB at 50M
    manifests, bench/RESULTS.md)."""
    audit_list_concurrency: int = Field(default=16, ge=1, le=1024)
    """Key ranges a full audit lists at once (PROTOCOL §3.9): each an independent LIST
    stream writing its own Parquet listing parts, so the listing's wall time is about
    the store's per-page latency times the pages of the largest range, divided by this
    (`reconciler.audit.listing`). Each stream holds at most one part (250k keys) in
    memory."""
    audit_engine: Literal["local", "spark"] = "local"
    """What runs a full audit's listing and joins (PROTOCOL §3.9): ``local``, this process
    (DuckDB, `reconciler.audit.engines.duckdb_joins`); ``spark``, a Spark application: executors
    list the ranges, the joins run in Spark SQL (`reconciler.audit.engines.spark_joins`), started
    with ``lm-reconciler audit --engine spark`` or through ``spark-submit``
    (`reconciler.audit.spark_entry`). ``lm-reconciler audit --engine`` overrides it. The
    daemon's scheduled audits follow it, in its audit child (the Spark driver, under the
    daemon's lease; the session from standard PySpark configuration:
    `reconciler.audit.engines.spark_run.audit_spark_session`). Either engine reads an S3
    Inventory report in place of the records' listing (``inventory_url``)."""
    segment_retention_s: Seconds = 3 * 24 * 3600.0
    """Consumed index log segments are deleted once older than this and a completed
    listing audit started after they were written (PROTOCOL §3.7). At least the GC's
    retry horizon plus a day, the lookback and the live query's window."""
    verify_sample_rate: float = Field(default=0.001, ge=0, le=1)
    """Fraction of the log rows of collectors' own creates (cataloged without a request,
    PROTOCOL §3.7) that the steady pass also reads back and compares field by field."""
    inventory_url: str | None = Field(default=None, pattern=r"^(s3|file)://.+")
    """S3 Inventory report of the store's bucket for full audits instead of listing it:
    ``s3://BUCKET/PATH`` (a ``manifest.json``, or the configuration folder whose newest
    report is used) or ``file://DIR``; ``None`` = list the bucket."""


class GcSettings(Section):
    """``[gc]``: deletion of orphan raw blobs (PROTOCOL.md §3.5)."""

    enabled: bool = True
    dry_run: bool = False
    """Mark, wait and audit as usual, log what would be deleted, delete nothing."""
    retry_horizon_s: Seconds = 2 * 24 * 3600.0
    """A blob younger than this is never a candidate: an agent may still retry it. A
    ``local_spool`` collector remembers the batches it landed for as long."""
    mark_grace_s: Seconds = 600.0
    """Wait between marking a blob and trusting an audit about it; must exceed the
    longest a collector request can take (checked against the ingest budget)."""
    max_delete_fraction: float = Field(default=0.1, gt=0, le=1)
    """A GC run that would delete more than this fraction of the blobs it saw stops and
    reports instead (a safety valve against a broken index or audit)."""
    concurrency: int = Field(default=8, ge=1)
    """Blobs a GC run works on at once (marking, reading marks, deleting): each blob's
    steps are a few small requests, independent of every other blob's, so a run over many
    (raw retention retires every rolled-up batch) is bound by latency, not the store."""
    inventory_proves: bool = False
    """Let a completed audit read from an S3 Inventory report (``[reconciler]
    inventory``) serve as the GC's rule-5 audit (PROTOCOL §3.5). Off: an Inventory only
    nominates, and the GC waits for a listing audit. **The risk**: a report is not a
    snapshot — objects written shortly before its ``creationTimestamp`` may be missing —
    so a record the report omits and no log row named is not cataloged, and the blob it
    references looks orphan. The GC therefore trusts a report only for blobs whose
    LastModified + ``retry_horizon_s`` + ``inventory_lag_s`` is before the report (every
    record naming such a blob was created at least ``inventory_lag_s`` before it), and
    still checks presence by a HEAD (rule 1) and proves each candidate (rule 7). Turn it
    on only if your Inventory's delivery lag is well within ``inventory_lag_s``."""
    inventory_lag_s: Seconds = 2 * 24 * 3600.0
    """How long before a report's ``creationTimestamp`` an object must exist to be surely
    in it (with ``inventory_proves``)."""
    delete_expiry_s: int = Field(default=5, ge=1, le=7 * 24 * 3600)
    """Lifetime of each pre-signed blob DELETE (``X-Amz-Expires``, PROTOCOL §3.5 rule 6).
    It is sent only while the reconciler lease outlives it (plus the clock skew), and the
    store refuses it once expired, so a stalled former leader cannot delete late. Long
    enough for the request to reach the store; with ``store.max_clock_skew_s`` and
    ``store.connect_timeout_s`` at most 2/3 of ``reconciler.lease_ttl_s``."""


class RetentionSettings(Section):
    """``[retention]``: raw retention (PROTOCOL §4.1). Table retention is
    ``[rollup] retention_points_days`` / ``retention_rollup_1m_days``."""

    raw_days: float | None = Field(default=None, gt=0)
    """Delete the raw blob of an accepted batch once its accepted hour ended more than
    this many days ago *and* the rollup's ledger includes every batch of that hour; the
    GC deletes it by its mark/grace/veto procedure (`reconciler.gc.raw_retention`). The
    manifest stays, so a re-send is still answered as a duplicate. None (default): keep
    raw blobs for ever. Off also means a reconciler never retires more hours; hours it
    retired before stay retired."""
