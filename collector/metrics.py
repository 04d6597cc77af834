"""Prometheus metrics of one collector process, on a registry of its own (no globals).

With ``--workers N`` every worker process has its own registry: scrape each worker on its
own metrics port (``[metrics] port`` + worker index), or read ``/metrics`` on the shared
port, which reports the worker that happened to answer (named in ``X-Lightmetrics-Worker``).
``/metrics`` on the HTTP port is always served; ``[metrics] enabled = false`` only turns
off the per-worker metrics listeners.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from store.time import StoreClock
from store.timed import STORE_LATENCY_BUCKETS, StoreLatency

LATENCY_BUCKETS = STORE_LATENCY_BUCKETS  # 1 ms to 30 s: acknowledgements span the same


class CollectorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "lm_collector_requests", "Batch POSTs by outcome", ["outcome"], registry=r
        )
        self.ack_latency = Histogram(
            "lm_collector_ack_latency_seconds",
            "Time from request start to the answer, for accepted batches",
            ["duplicate"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.store_ops = Counter(
            "lm_collector_store_operations",
            "Store operations by operation and result",
            ["op", "result"],
            registry=r,
        )
        self.store_ops_per_batch = Histogram(
            "lm_collector_store_operations_per_batch",
            "Store operations on the acknowledgement path per answered batch",
            ["outcome"],
            buckets=(1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 40),
            registry=r,
        )
        self.frames_per_raw_put = Histogram(
            "lm_collector_frames_per_raw_put",
            "Frames in each raw object the bundler writes (PROTOCOL §3.10: 1 is a plain frame "
            "blob, n a bundle of n); written only while bundles are in effect",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000),
            registry=r,
        )
        self.bundle_slot_wait = Histogram(
            "lm_collector_bundle_slot_wait_seconds",
            "Seconds a bundled frame waited from joining the open bundle until its raw "
            "object was being written (a write slot; PROTOCOL §3.10)",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
            registry=r,
        )
        self.bundle_dead_bytes = Counter(
            "lm_collector_bundle_dead_bytes",
            "Bytes of bundled frames that no manifest names (a duplicate, or the submitted "
            "frame of a conflict): kept until the bundle is deleted whole",
            registry=r,
        )
        self.in_flight_requests = Gauge(
            "lm_collector_in_flight_requests", "Batch POSTs in progress", registry=r
        )
        self.in_flight_bytes = Gauge(
            "lm_collector_in_flight_bytes",
            "Bytes charged to requests in progress: bodies, and payload checks while they run",
            registry=r,
        )
        self.open_connections = Gauge(
            "lm_collector_open_connections",
            "Client connections open on this worker (updated when /metrics is read)",
            registry=r,
        )
        self.connections_refused = Counter(
            "lm_collector_connections_refused",
            "Connections closed by the worker: over_connection_cap (429) or "
            "request_head_timeout (408, headers slower than http.read_timeout_s)",
            ["reason"],
            registry=r,
        )
        self.bytes_accepted = Counter(
            "lm_collector_accepted_bytes", "Frame bytes of newly accepted batches", registry=r
        )
        self.points_accepted = Counter(
            "lm_collector_accepted_points", "Points in newly accepted batches", registry=r
        )
        self.conflicts = Counter(
            "lm_collector_identity_conflicts", "Identity conflicts answered 409", registry=r
        )
        self.index_buffered = Gauge(
            "lm_collector_index_log_buffered_rows",
            "Index log rows waiting to be flushed",
            registry=r,
        )
        self.index_rows = Counter(
            "lm_collector_index_log_rows",
            "Index log rows by fate (written, dropped_full, dropped_failed; held_skewed: rows "
            "kept buffered at a flush because this host's clock is off the store's)",
            ["fate"],
            registry=r,
        )
        self.store_last_ok = Gauge(
            "lm_collector_store_last_success_unixtime",
            "When the object store last answered",
            registry=r,
        )

        self.store_clock_skew = Gauge(
            "lm_collector_store_clock_skew_seconds",
            "This host's clock minus the object store's, from the Date header of its answers "
            "(positive: ahead; 0 until measured, and always for file:// stores). Beyond "
            "[store] max_clock_skew_s batches are answered 503 and /readyz fails",
            registry=r,
        )
        self.store_latency = StoreLatency(r)
        """``lm_store_request_seconds{op, result}`` (`store.timed`: every daemon's store)."""
        self.queries = Counter(
            "lm_collector_queries",
            "GET /v1/query answers by status (ok, or the HTTP status)",
            ["status"],
            registry=r,
        )
        self.remote_reads = Counter(
            "lm_collector_remote_reads",
            "POST /api/v1/read answers by status (ok, or the HTTP status; aborted: a stream "
            "cut after its first byte) and response type",
            ["status", "type"],
            registry=r,
        )
        self.query_dropped_labels = Counter(
            "lm_query_dropped_labels",
            "Stored labels left out of a presented series because another stored label of "
            "the series presents the same name (PROTOCOL §5), per series read",
            registry=r,
        )
        self.query_name_collisions = Counter(
            "lm_query_name_collisions",
            "Samples left out of a read because another stored series presenting the same "
            "label set has a sample at the same millisecond (PROTOCOL §5)",
            registry=r,
        )
        self.query_cache = Counter(
            "lm_query_cache_lookups",
            "Snapshot file cache lookups of reads (query.cache_bytes) by kind (footer, "
            "row_group, file) and result (hit, miss)",
            ["kind", "result"],
            registry=r,
        )
        self.live_window = Gauge(
            "lm_collector_live_window",
            "What the live query window holds (what = batches | points | bytes)",
            ["what"],
            registry=r,
        )
        self.history_read_through = Gauge(
            "lm_collector_history_read_through_timestamp_seconds",
            "Sealed catalog hours before this time are read by this process (answers can be "
            "complete only up to it; 0 until the first are read after a start)",
            registry=r,
        )

    def watch_store_clock(self, clock: StoreClock) -> None:
        """Export ``clock``'s measured skew (read at each scrape)."""
        self.store_clock_skew.set_function(lambda: clock.skew_s or 0.0)

    def observe_query_cache(self, kind: str, hit: bool) -> None:
        self.query_cache.labels(kind=kind, result="hit" if hit else "miss").inc()

    def observe_store_op(self, op: str, result: str) -> None:
        self.store_ops.labels(op=op, result=result).inc()
