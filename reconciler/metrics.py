"""Prometheus metrics of one reconciler process, on a registry of its own (no globals).

``lm-reconciler run`` serves them on ``[metrics] host:port``. The GC (``reconciler.gc``)
reports through `ReconcilerMetrics.record_gc`; the clock skew against the store comes from
the reconciler's store clock (`watch_store_clock`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Info

from index.audits import sealed_limit_ns
from protocol import keys
from protocol.clock import Clock, SystemClock
from protocol.records import AuditRecord, RawRetention
from store.base import ObjectStore
from store.time import StoreClock, store_clock
from store.timed import StoreLatency, TimedStore


class ReconcilerMetrics:
    def __init__(
        self, registry: CollectorRegistry | None = None, *, clock: Clock | None = None
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._checkpoint_updated_ns: int | None = None
        r = self.registry
        self.active = Gauge(
            "lm_reconciler_active", "1 while this process holds the reconciler lease", registry=r
        )
        self.lease_epoch = Gauge(
            "lm_reconciler_lease_epoch", "Epoch of the lease this process holds", registry=r
        )
        self.checkpoint_age = Gauge(
            "lm_reconciler_checkpoint_age_seconds",
            "Seconds since the steady pass last saved its index checkpoint (-1: none yet)",
            registry=r,
        )
        self.checkpoint_age.set_function(self._checkpoint_age_s)
        self.steady_passes = Counter(
            "lm_reconciler_steady_passes",
            "Steady passes by result (complete, incomplete)",
            ["result"],
            registry=r,
        )
        self.log_lag = Gauge(
            "lm_reconciler_log_lag_seconds",
            "How long the oldest index log segment not yet consumed has waited (store time "
            "minus its cut time), from what the steady pass listed: fresh at each scrape, "
            "also while a pass runs (reconciler.log_lag)",
            registry=r,
        )
        self.log_segments = Counter(
            "lm_reconciler_log_segments_read",
            "Index log segments the steady pass read (each once)",
            registry=r,
        )
        self.records_read = Counter(
            "lm_reconciler_records_read",
            "Accepted manifests and quarantine records read to catalog them (steady pass "
            "and audit)",
            registry=r,
        )
        self.cataloged_rows = Counter(
            "lm_reconciler_cataloged_rows",
            "Verified rows written to new catalog files, by kind (accepted, quarantine); "
            "compaction's merged files not counted",
            ["kind"],
            registry=r,
        )
        self.catalog_files = Counter(
            "lm_reconciler_catalog_files",
            "Catalog files written (each with its rollup work marker), by origin "
            "(cataloged, compacted)",
            ["origin"],
            registry=r,
        )
        self.log_segments_deleted = Counter(
            "lm_reconciler_log_segments_deleted",
            "Consumed index log segments deleted past reconciler.segment_retention_s",
            registry=registry,
        )
        self.malformed_log_rows = Counter(
            "lm_reconciler_malformed_log_rows",
            "Index log rows that broke a rule (never cataloged; a problem names the segment)",
            registry=registry,
        )
        self.catalog_mismatches = Counter(
            "lm_reconciler_catalog_mismatches",
            "Log rows whose fields differed from the store's record (superseded; a collector bug)",
            registry=registry,
        )
        self.missing_records = Counter(
            "lm_reconciler_missing_records",
            "Records a log row named that do not exist (a collector's claim the store "
            "does not back)",
            registry=r,
        )
        self.problems = Counter(
            "lm_reconciler_problems",
            "Problems detected (each detection), by kind",
            ["kind"],
            registry=r,
        )
        self.problems_resolved = Counter(
            "lm_reconciler_problems_resolved",
            "Problem records removed because their subject checked out fine",
            ["kind"],
            registry=r,
        )
        self.store_failures = Counter(
            "lm_reconciler_store_failures",
            "Store calls that failed after their retries, by stage",
            ["stage"],
            registry=r,
        )
        self.audit_running = Gauge(
            "lm_reconciler_audit_running", "1 while a full audit runs", registry=r
        )
        self.audit_manifests = Gauge(
            "lm_reconciler_audit_manifests_seen",
            "Accepted manifests the current (or last) audit has examined",
            registry=r,
        )
        self.audit_quarantines = Gauge(
            "lm_reconciler_audit_quarantines_seen",
            "Quarantine records the current (or last) audit has examined",
            registry=r,
        )
        self.audit_groups_done = Gauge(
            "lm_reconciler_audit_groups_done",
            "Listing ranges (PROTOCOL §3.9) the current audit finished",
            registry=r,
        )
        self.audits = Counter(
            "lm_reconciler_audits",
            "Full audits by result (completed, incomplete)",
            ["result"],
            registry=r,
        )
        self.last_audit_completed = Gauge(
            "lm_reconciler_last_audit_completed_timestamp_seconds",
            "When the last full audit completed (Unix time)",
            registry=r,
        )
        self.gc_candidates = Counter(
            "lm_reconciler_gc_candidates", "Raw blobs the GC considered", registry=r
        )
        self.gc_marks = Counter("lm_reconciler_gc_marks", "GC marks created", registry=r)
        self.gc_vetoes = Counter(
            "lm_reconciler_gc_vetoes", "Marked blobs spared because of a veto", registry=r
        )
        self.gc_deletions = Counter(
            "lm_reconciler_gc_deletions", "Raw blobs deleted by the GC", registry=r
        )
        self.gc_stalled = Counter(
            "lm_reconciler_gc_stalled",
            "GC runs whose rule-2 catalog read proved nothing, so they deleted nothing, by "
            "reason (reconciler.gc.catalog_since.STALL_REASONS); compaction between audits "
            "must never cause one",
            ["reason"],
            registry=r,
        )
        self.store_clock_skew = Gauge(
            "lm_reconciler_store_clock_skew_seconds",
            "This host's clock minus the object store's, from the Date header of its answers "
            "(positive: ahead; 0 until measured). Beyond [store] max_clock_skew_s it is logged; "
            "ages and leases use store time regardless",
            registry=r,
        )
        self.sealed_through = Gauge(
            "lm_reconciler_sealed_through_timestamp_seconds",
            "Start of the first accepted hour the newest completed listing audit does not "
            "seal (PROTOCOL §3.7 sealed hours; read from the audit records at each pass)",
            registry=r,
        )
        self.rollup_committed = Gauge(
            "lm_reconciler_rollup_committed_timestamp_seconds",
            "When the rollup's latest snapshot was committed (its created_at; "
            "reconciler.rollup_progress)",
            registry=r,
        )
        self.rollup_included_through = Gauge(
            "lm_reconciler_rollup_included_through_timestamp_seconds",
            "End of the newest accepted hour the rollup's latest snapshot includes (its ledger)",
            registry=r,
        )
        self.rollup_version = Gauge(
            "lm_reconciler_rollup_snapshot_version",
            "The rollup's latest snapshot version",
            registry=r,
        )
        self.raw_retired_before = Gauge(
            "lm_reconciler_raw_retention_retired_before_timestamp_seconds",
            "Raw retention's state: accepted hours before this are retired (their blobs are "
            "the GC's to delete; 0: nothing retired)",
            registry=r,
        )
        self.raw_retired_batches = Gauge(
            "lm_reconciler_raw_retention_retired_batches",
            "Batches raw retention has retired in all (its state in the store)",
            registry=r,
        )
        self.store_latency = StoreLatency(r)
        """``lm_store_request_seconds{op, result}`` (`store.timed`: every daemon's store)."""
        self.audit_info = Info(
            "lm_reconciler_audit", "The newest full audit's engine and source", registry=r
        )
        self.audit_duration = Gauge(
            "lm_reconciler_last_audit_duration_seconds",
            "Store time from the newest completed audit's first run to its completion",
            registry=r,
        )
        self.audit_keys_listed = Gauge(
            "lm_reconciler_audit_keys_listed",
            "Keys the newest audit listed (or read from an Inventory), per prefix",
            ["prefix"],
            registry=r,
        )
        self.audit_requests = Gauge(
            "lm_reconciler_audit_requests",
            "Store requests the newest audit made, by kind (LIST, GET, HEAD, PUT, DELETE)",
            ["kind"],
            registry=r,
        )
        self.audit_spilled = Gauge(
            "lm_reconciler_audit_spilled_bytes",
            "The most the newest audit's joins held in their spill directory",
            registry=r,
        )
        self.stage_errors = Counter(
            "lm_reconciler_stage_errors",
            "Daemon stages (steady, audit, compaction, gc) that ended with an error",
            ["stage"],
            registry=r,
        )

    def observe_audit(self, record: AuditRecord) -> None:
        """The newest audit's cost (its record, as the schedule reads it each pass)."""
        self.audit_info.info({"engine": record.engine, "source": record.source})
        end = record.completed_at_unix_ns
        if end is not None and record.ran_from_unix_ns is not None:
            self.audit_duration.set(max(0, end - record.ran_from_unix_ns) / 1e9)
        for prefix, count in record.keys_listed.items():
            self.audit_keys_listed.labels(prefix).set(count)
        for kind, count in record.requests.items():
            self.audit_requests.labels(kind).set(count)
        self.audit_spilled.set(record.spilled_bytes)

    def observe_completed_audit(self, record: AuditRecord, settle_margin_s: float) -> None:
        """The newest completed audit of the index, as the schedule reads it each pass: the
        audit's age (also after a restart) and, for a listing audit, the sealed hours."""
        if record.completed_at_unix_ns is not None:
            self.last_audit_completed.set(record.completed_at_unix_ns / 1e9)
        if record.source == "listing":
            limit = sealed_limit_ns(record.started_at_unix_ns, int(settle_margin_s * 1e9))
            self.sealed_through.set(limit / 1e9)

    def observe_raw_retention(self, state: RawRetention | None) -> None:
        """Raw retention's state after a run (``None``: nothing retired yet)."""
        if state is not None:
            before = keys.UtcHour.parse_iso(state.retired_before).start_ns
            self.raw_retired_before.set(before / 1e9)
            self.raw_retired_batches.set(state.retired_batches)

    def record_gc(
        self, *, candidates: int = 0, marked: int = 0, vetoed: int = 0, deleted: int = 0
    ) -> None:
        """Count GC work; the GC calls this as it goes (increments, never totals)."""
        for counter, amount in (
            (self.gc_candidates, candidates),
            (self.gc_marks, marked),
            (self.gc_vetoes, vetoed),
            (self.gc_deletions, deleted),
        ):
            if amount < 0:
                raise ValueError(f"GC counts only grow, got {amount}")
            if amount:
                counter.inc(amount)

    def watch_store_clock(self, clock: StoreClock) -> None:
        """Export ``clock``'s measured skew (read at each scrape)."""
        self.store_clock_skew.set_function(lambda: clock.skew_s or 0.0)

    def note_checkpoint(self, updated_at_unix_ns: int) -> None:
        self._checkpoint_updated_ns = updated_at_unix_ns

    def _checkpoint_age_s(self) -> float:
        if self._checkpoint_updated_ns is None:
            return -1.0
        return max(0.0, (self._clock.now_ns() - self._checkpoint_updated_ns) / 1e9)


def with_store_latency(store: ObjectStore, clock: Clock) -> tuple[ObjectStore, ReconcilerMetrics]:
    """The daemon's metrics, and ``store`` with its requests timed into them
    (``lm_store_request_seconds``, `store.timed`). The metrics read ``clock`` as store time
    (`store.time.store_clock`), as `reconciler.daemon.Reconciler` does."""
    metrics = ReconcilerMetrics(clock=store_clock(store, clock))
    return TimedStore(store, observe=metrics.store_latency.observe), metrics
