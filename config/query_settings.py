"""``[query]``: the live query endpoint ``GET /v1/query`` (`collector.query`) and the
Prometheus read path (PROTOCOL §5, `collector.promql`); ``[query.promql]``: its engine."""

from __future__ import annotations

from pydantic import Field, model_validator

from config.section import AbsolutePath, MiB, Seconds, Section

DAY_S = 86_400.0


class PromqlSettings(Section):
    """``[query.promql]``: the Prometheus server that evaluates PromQL for this
    collector, reading everything through its remote read (PROTOCOL §5). Neither key:
    ``/api/v1/query`` and ``/api/v1/query_range`` answer 503; the names endpoints and
    remote read work without an engine."""

    prometheus: AbsolutePath | None = None
    """The engine's binary (Prometheus 2.x >= 2.42), supervised by the collector: a fresh
    loopback port and TSDB directory per start, restarted with backoff (1 s to 60 s)."""
    url: str | None = None
    """An operator-run engine (a sidecar): its base URL, e.g. ``http://127.0.0.1:9091``."""
    credentials_dir: AbsolutePath | None = None
    """Where the supervised engine's configuration, credentials (mode 0600, directory
    0700) and TSDB directory go; default a private temporary directory per start."""
    basic_auth_password_file: AbsolutePath | None = None
    """With ``url``: the file holding the password of the engine's basic auth user
    ``lightmetrics`` (as written by ``lm-collector promql-config``)."""
    lookback_delta_s: Seconds = 300.0
    """The engine's ``--query.lookback-delta`` (Prometheus' default, 5 m)."""
    remote_timeout_s: Seconds = 60.0
    """The engine's ``remote_timeout`` for a read of this collector."""
    query_timeout_s: Seconds = 90.0
    """The engine's ``--query.timeout``: more than ``remote_timeout_s``."""
    forward_timeout_s: Seconds = 120.0
    """The collector's timeout for a forwarded request: more than ``query_timeout_s``;
    a caller's ``timeout`` parameter is capped by it."""
    memory_limit_bytes: int | None = Field(default=None, ge=0)
    """The supervised engine's Go soft memory limit (``GOMEMLIMIT``): near it Go's garbage
    collector runs sooner instead of letting the heap grow to about twice what is live
    (``GOGC=100``). Default (unset): ``query.max_read_bytes_in_flight`` (the remote-read
    answers the engine can be decoding at once: the collector never has more in flight
    for it) plus 256 MiB for its evaluation. 0: no limit. Soft: a larger live heap is
    not refused (Go caps its garbage collection at about half the CPU time)."""

    @model_validator(mode="after")
    def _one_engine_and_nested_timeouts(self) -> PromqlSettings:
        if self.prometheus is not None and self.url is not None:
            raise ValueError("give query.promql.prometheus (supervised) or url (sidecar), not both")
        if not self.remote_timeout_s < self.query_timeout_s < self.forward_timeout_s:
            raise ValueError(
                "timeouts must nest: remote_timeout_s < query_timeout_s < forward_timeout_s, got "
                f"{self.remote_timeout_s:g}, {self.query_timeout_s:g}, {self.forward_timeout_s:g}"
            )
        return self


class QuerySettings(Section):
    """``[query]``: ``GET /v1/query`` (`collector.query.endpoint`): the latest committed
    rollup snapshot plus accepted batches not yet in it (PROTOCOL §2)."""

    designated: bool = False
    """Follow the whole authority through the index log (PROTOCOL §3.7) and keep its
    recent batches in memory: the designated query collector. One process only
    (``--workers 1``): the window is per process."""
    own_batches: bool = False
    """Keep the batches this collector accepts itself in the window (any collector).
    With neither this nor ``designated``, answers hold the committed snapshot only."""
    window_s: Seconds = 3600.0
    """How far back (by accepted time) the window keeps batches."""
    max_window_points: int = Field(default=2_000_000, ge=1)
    """Points the window holds at most; the oldest batches are evicted beyond it (an
    answer that needs an evicted batch says ``complete: false``)."""
    max_window_bytes: int = Field(default=512 * MiB, ge=1)
    """Memory the window's decoded points take at most, decodes in progress included
    (`collector.query.decode`); the oldest batches are evicted beyond it, as for
    ``max_window_points``. A dictionary-encoded frame can decode to many times its size
    (at most ``ingest.max_raw_bytes``: larger is refused at intake)."""
    max_pending_batches: int = Field(default=1000, ge=1)
    """Designated: batches named by the log and waiting for their blob; beyond it the
    collector stops following (answers say ``complete: false``) until it catches up."""
    poll_interval_s: Seconds = 2.0
    """Designated: how often the index log is listed for new segments."""
    refresh_interval_s: Seconds = 10.0
    """The rollup pointer is read again at most this often (the snapshot is cached per
    version)."""
    history_wait_s: Seconds = 1.0
    """An answer waits at most this long for catalog reads it needs and this process has
    not made yet, which run in the background (`collector.query.coverage`,
    `collector.query.late`): the sealed hours after a start on a long history, the new
    ``catalog-created`` entries after a quiet spell, the spans of unsealed hours. Then it
    is answered with what is read: ``sealed_through_ns`` stops at the first hour not read
    (``complete: false`` until then), and ``late_batches`` counts an unread hour whole."""
    history_cache_dir: AbsolutePath | None = None
    """Where this collector keeps the sealed catalog hours' totals it has read
    (`collector.query.history_cache`, ~250 bytes an hour), so that after a restart it
    reads again only the hours whose catalog changed: one LIST page per 1,000 catalog
    files instead of every hour's files (~11 s an hour at 1,000 batches/s).
    Unset: every start reads every sealed hour once. A path on the collector's own disk
    (an ``emptyDir`` volume under Kubernetes: it survives a container restart); the
    workers of one collector share it."""
    max_result_rows: int = Field(default=100_000, ge=1)
    """An answer with more rows is refused (400 ``too_many_rows``): narrow the query."""
    max_concurrent_queries: int = Field(default=4, ge=1)
    """More queries in flight at once (per process) are answered 429."""
    max_travel_versions: int = Field(default=1000, ge=1)
    """``version=``/``as_of=`` reach back at most this many versions from the latest
    (further: 400 ``travel_too_far``): one request never walks more snapshot manifests
    than this, and each version's manifest key is remembered, so a later request walks
    only what no earlier one did. The default covers the default vacuum retention
    (``rollup.retention_s``, 7 days) of hourly runs with compaction and deletes."""
    max_read_samples: int = Field(default=10_000_000, ge=1)
    """A remote read (``POST /api/v1/read``) selecting more samples is refused, 400
    naming this limit, never cut short (PROTOCOL §5)."""
    max_read_request_bytes: int = Field(default=4 * MiB, ge=1024)
    """A remote read request's decoded (snappy) length at most."""
    max_read_bytes_in_flight: int = Field(default=512 * MiB, ge=1 * MiB)
    """Estimated answer bytes of all remote reads in flight at once (about 18 bytes a
    sample for ``SAMPLES``, a frame for a stream); a read that cannot reserve waits."""
    max_read_frame_bytes: int = Field(default=16 * MiB, ge=64 * 1024, le=50 * 1000 * 1000)
    """One ``STREAMED_XOR_CHUNKS`` frame at most (one series with all its chunks); a
    series that would exceed it is refused with 400 before the first frame. Under the
    clients' 50 MB frame limit."""
    max_concurrent_promql: int = Field(default=8, ge=1)
    """Forwarded PromQL requests in flight at once; more are answered 429 (the engine's
    ``--query.max-concurrency`` is the same number)."""
    cache_bytes: int = Field(default=256 * MiB, ge=0)
    """Snapshot files and footers the read path keeps in memory."""
    names_default_range_s: Seconds = DAY_S
    """``/api/v1/labels``, ``label/<name>/values`` and ``series`` without ``start`` and
    ``end`` cover this much time back from now."""
    names_max_range_s: Seconds = 366 * DAY_S
    """A names request over a longer range is refused (400)."""
    promql: PromqlSettings = Field(default_factory=PromqlSettings)
