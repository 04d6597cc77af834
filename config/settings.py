"""The settings schema: one frozen model per TOML section, `Settings` holding them all.

Every process reads the same schema (sections it does not use are ignored); unknown keys
and unknown sections are errors. Defaults alone give a working single-host collector on
127.0.0.1:8080 over ``file://./lm-data``. Relative paths (the store directory,
``auth.tokens_file``, ``ingest.spool_dir``) are made absolute against the working
directory when the settings are validated. Durations are seconds (``_s``) unless the
name says milliseconds (``_ms``). Load with `config.load_settings`; building the models
directly (tests) validates the same way. The base of every section is in
`config.section`; the reconciler's ``[reconciler]``, ``[gc]`` and ``[retention]`` in
`config.reconciler_settings`; ``[query]`` in `config.query_settings`; ``[ingest]`` in
`config.ingest_settings`; the agent's ``[scrape]`` in `config.scrape_settings`.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from config.errors import CrossFieldError
from config.ingest_settings import CollectorId as CollectorId
from config.ingest_settings import IngestSettings as IngestSettings
from config.query_settings import QuerySettings as QuerySettings
from config.reconciler_settings import GcSettings as GcSettings
from config.reconciler_settings import ReconcilerSettings as ReconcilerSettings
from config.reconciler_settings import RetentionSettings as RetentionSettings
from config.scrape_settings import ScrapeSettings as ScrapeSettings
from config.scrape_settings import ScrapeTarget as ScrapeTarget
from config.section import AbsolutePath, MiB, Port, Seconds, Section
from config.store_url import StoreLocation, parse_store_url


class StoreSettings(Section):
    """``[store]``: the object store that is the acceptance authority. Credentials come
    from the standard AWS chain (env, shared files, instance role)."""

    url: str = "file://./lm-data"
    """``file://PATH``, ``memory://[NAME]`` or ``s3://BUCKET[/PREFIX]``; normalized
    (absolute path, no trailing slash)."""
    endpoint_url: str | None = None
    """S3-compatible server (MiniStack, MinIO); ``None`` = AWS."""
    region: str = Field(default="us-east-1", min_length=1)
    max_pool_connections: int = Field(default=64, ge=1)
    connect_timeout_s: Seconds = 5.0
    read_timeout_s: Seconds = 30.0
    gc_credentials_profile: str | None = Field(default=None, min_length=1)
    """AWS profile for the GC's deletes, so only the GC holds delete permission;
    ``None`` = the same credentials as everything else."""
    max_clock_skew_s: Seconds = 10.0
    """Largest tolerated difference between this host's clock and the store's (measured
    from the ``Date`` header of its answers; PROTOCOL.md §3.8). Beyond it the process logs
    it, and a collector answers 503 rather than stamp ``accepted_at`` with a wrong time.
    Object ages and lease expiries are judged in store time whatever this is."""

    @field_validator("url")
    @classmethod
    def _normalize_url(cls, url: str) -> str:
        return parse_store_url(url).url

    @field_validator("endpoint_url")
    @classmethod
    def _check_endpoint(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"^https?://[^/?#\s]+", url):
            raise ValueError("must be an http:// or https:// URL")
        return url

    @property
    def location(self) -> StoreLocation:
        """The parsed `url`: `FileLocation`, `MemoryLocation` or `S3Location`."""
        return parse_store_url(self.url)


class HttpSettings(Section):
    """``[http]``: the collector's listener and its admission limits."""

    host: str = Field(default="127.0.0.1", min_length=1)
    port: Port = 8080
    max_in_flight_requests: int = Field(default=256, ge=1)
    """More concurrent requests than this are answered 429."""
    max_in_flight_bytes: int = Field(default=64 * MiB, ge=1)
    """Bound on request bodies held in memory at once; beyond it, 429."""
    read_timeout_s: Seconds = 30.0
    """Longest a client may take to send one request, headers and body, from its first
    byte: slower request headers are answered 408 and the connection is closed; a
    slower body is answered 408."""
    keepalive_timeout_s: Seconds = 75.0
    """Idle keep-alive connections (no request started) are closed after this."""
    max_connections: int = Field(default=512, ge=1)
    """Open client connections per worker process; a connection beyond it is answered
    429 and closed at once. At least ``max_in_flight_requests`` (each request needs
    one), and below the process's open-file limit."""
    decode_threads: int = Field(default=2, ge=1, le=64)
    """Threads per worker that check frames (CRC, decompression, Arrow payload) off the
    event loop; more requests than this wait for one, within the in-flight caps. Each
    thread contends with the event loop for the GIL (a 64 KiB frame's check releases
    and retakes it ~20 times): at c32 on MiniStack the worker spent 4.2 ms of CPU per
    batch with 4 threads, 3.4 with 2, 3.05 with 1 (bench/RESULTS.md). More threads only
    help frames whose checks are long."""
    shutdown_grace_s: Seconds = 10.0
    """On SIGTERM: stop accepting, wait this long for in-flight requests, then cancel."""

    @model_validator(mode="after")
    def _connections_hold_the_requests(self) -> HttpSettings:
        if self.max_connections < self.max_in_flight_requests:
            raise CrossFieldError(
                "http.max_connections",
                f"must be >= http.max_in_flight_requests = {self.max_in_flight_requests} "
                f"(every request in flight holds a connection), got {self.max_connections}",
                related=("http.max_in_flight_requests",),
            )
        return self

    @property
    def binds_loopback_only(self) -> bool:
        """True when `host` is a loopback address or ``localhost``. The collector refuses
        to bind anything else without ``auth.tokens_file``."""
        if self.host.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:
            return False


class AuthSettings(Section):
    """``[auth]``: bearer tokens. Without a tokens file, requests are not authenticated
    (allowed only on loopback). The file is read by `config.load_tokens`, not here, so a
    host that does not serve HTTP needs no tokens file."""

    tokens_file: AbsolutePath | None = None


HeaderName = Annotated[str, Field(pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")]


class ReceiverSettings(Section):
    """``[receivers]``: Prometheus remote_write (``POST /api/v1/write``) and OTLP/HTTP
    metrics (``POST /v1/metrics``) on the collector's port (`collector.receivers`)."""

    enabled: bool = True
    agent_id_header: HeaderName = "X-Lightmetrics-Agent-Id"
    """Request header naming the agent_id a request is stored under (authorized like any
    agent_id); without it, the agent_id is the principal's name."""
    max_points_per_request: int = Field(default=200_000, ge=1, le=2**32 - 1)
    """A request carrying more points (after mapping) is refused with 413."""


class RollupSettings(Section):
    """``[rollup]``: the Spark job and its dataset commit."""

    spark_master: str = Field(default="local[*,4]", min_length=1)
    """Spark master of ``lm-rollup run`` (ignored under spark-submit). ``local[*,4]``: all
    cores, and a failed task is tried up to 4 times, as on a cluster (plain ``local[*]``
    never retries, so one store hiccup past the client's retries would fail the run).
    Retrying is safe: a task's files are uniquely named, so a failed attempt leaves only
    orphans for ``lm-rollup vacuum``."""
    owner_lease_ttl_s: Seconds = 300.0
    reader_lease_ttl_s: Seconds = 120.0
    """A reader lease (``rollup/v1/readers/``) pins a snapshot against vacuum for this
    long past its last renewal; a reader renews it every third of it."""
    reader_lease_min_files: int = Field(default=32, ge=0)
    """``lm-rollup query`` (and `rollup.read.reader.scan`) pins its snapshot with a reader
    lease when it reads more data files than this (``--lease``/``--no-lease`` decide
    instead); ``lm-rollup sql`` always does."""
    reader_lease_max_hold_s: Seconds = 6 * 3600.0
    """A reader stops renewing its lease after this long, so a hung reader cannot hold
    vacuum back for ever (its read then gets the retry-once of a vanished file)."""
    max_commit_retries: int = Field(default=5, ge=0)
    parquet_row_group_size: int = Field(default=1_000_000, ge=1)
    """Rows per Parquet row group."""
    compression: Literal["zstd", "snappy", "gzip", "lz4", "none"] = "zstd"
    retention_s: float = Field(default=7 * 24 * 3600.0, ge=0)
    """``lm-rollup vacuum`` keeps every snapshot (and its files) that was current within
    this long, so version travel reaches back this far."""
    vacuum_min_age_s: float = Field(default=3600.0, ge=0)
    """``lm-rollup vacuum`` never deletes an unreachable object younger than this: a
    commit in flight may be about to reference it."""
    retention_points_days: float | None = Field(default=None, gt=0)
    """Keep ``points`` rows for this many days (by the hour of ``ts``); older hours leave
    the snapshot at the next run (vacuum deletes their files later). None: keep forever."""
    retention_rollup_1m_days: float | None = Field(default=None, gt=0)
    """As ``retention_points_days``, for ``rollup_1m`` (by the hour of ``window_start``)."""
    compact_target_bytes: int = Field(default=128 * 1024 * 1024, ge=1024)
    """``lm-rollup compact`` writes files of about this size (a smaller hour: one file)."""
    compact_after_run: bool = False
    """``lm-rollup run`` compacts (as ``lm-rollup compact``) after each run that committed."""
    compact_min_files: int = Field(default=2, ge=2)
    """``lm-rollup compact`` without ``--hour`` rewrites a table's hour when it has at least
    this many files, or rows that deletes still mask."""
    series_day_settle_s: Seconds = 3600.0
    """A run writes a UTC day's ``series_day`` rows (PROTOCOL §4) once store time is past its
    end plus this; later rows of the day add files to it (docs/rollup.md)."""


def _lowercase(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


class LoggingSettings(Section):
    """``[logging]``: see `config.configure_logging`."""

    format: Literal["json", "console", "auto"] = "auto"
    """``auto``: console when the log stream is a terminal, else JSON lines."""
    level: Annotated[
        Literal["debug", "info", "warning", "error", "critical"], BeforeValidator(_lowercase)
    ] = "info"


class MetricsSettings(Section):
    """``[metrics]``: Prometheus exposition. The collector serves ``/metrics`` on its HTTP
    port; the other daemons on ``host:port`` here."""

    enabled: bool = True
    host: str = Field(default="127.0.0.1", min_length=1)
    port: Port = 9108


class Settings(BaseModel):
    """Every section; each process reads the ones it uses."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    store: StoreSettings = Field(default_factory=StoreSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    receivers: ReceiverSettings = Field(default_factory=ReceiverSettings)
    reconciler: ReconcilerSettings = Field(default_factory=ReconcilerSettings)
    gc: GcSettings = Field(default_factory=GcSettings)
    rollup: RollupSettings = Field(default_factory=RollupSettings)
    query: QuerySettings = Field(default_factory=QuerySettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    scrape: ScrapeSettings = Field(default_factory=ScrapeSettings)

    @model_validator(mode="after")
    def _grace_outlasts_requests(self) -> Settings:
        # PROTOCOL.md §3.5 rule 3: an audit that starts after mark + grace must see any
        # manifest a collector was about to create when the mark appeared. A request's
        # last store call can start just before its budget ends and then take a connect
        # plus a read timeout, so the grace has to outlast all three.
        # These are the *collectors'* settings: a reconciler configured by its own file
        # must carry the collectors' [ingest] request_budget_s and [store] timeouts.
        longest = (
            self.ingest.request_budget_s + self.store.connect_timeout_s + self.store.read_timeout_s
        )
        if self.gc.mark_grace_s <= longest:
            raise CrossFieldError(
                "gc.mark_grace_s",
                f"must be > ingest.request_budget_s + store.connect_timeout_s + "
                f"store.read_timeout_s = {longest:g} (the longest a collector request can "
                f"take to land; when collectors have their own settings file, copy those "
                f"three values from it), got {self.gc.mark_grace_s:g}",
                related=(
                    "ingest.request_budget_s",
                    "store.connect_timeout_s",
                    "store.read_timeout_s",
                ),
            )
        return self

    @model_validator(mode="after")
    def _lookbacks_cover_late_segments(self) -> Settings:
        # PROTOCOL §3.7: a segment cut at T (the writer's clock) lands by T + the put
        # budget and may be off the reader's clock by the skew limit; a reader listing
        # from its position minus a shorter lookback would never see it.
        landing = self.store.connect_timeout_s + self.store.read_timeout_s
        if self.ingest.index_put_budget_s <= landing:
            raise CrossFieldError(
                "ingest.index_put_budget_s",
                f"must be > store.connect_timeout_s + store.read_timeout_s = {landing:g} (an "
                f"attempt sent must land within it), got {self.ingest.index_put_budget_s:g}",
                related=("store.connect_timeout_s", "store.read_timeout_s"),
            )
        floor = self.log_lookback_floor_s()
        if self.reconciler.lookback_s < floor:
            raise CrossFieldError(
                "reconciler.lookback_s",
                f"must be >= store.max_clock_skew_s + ingest.index_put_budget_s = {floor:g} "
                f"(a segment may land that long after its cut), got "
                f"{self.reconciler.lookback_s:g}",
                related=("store.max_clock_skew_s", "ingest.index_put_budget_s"),
            )
        return self

    def log_lookback_floor_s(self) -> float:
        """The shortest lookback a reader of the index log may use (PROTOCOL §3.7): the
        skew limit plus the segment create's budget. The live follower uses exactly this;
        ``reconciler.lookback_s`` is checked against it."""
        return self.store.max_clock_skew_s + self.ingest.index_put_budget_s

    @model_validator(mode="after")
    def _segments_outlive_their_readers(self) -> Settings:
        # PROTOCOL §3.7: blob rows nominate orphans until the retry horizon (plus a day of
        # slack), the steady pass re-lists its lookback, and the designated query collector
        # follows the log over its window: no segment may go before all three are done.
        needed = max(
            self.gc.retry_horizon_s + 24 * 3600.0,
            self.reconciler.lookback_s,
            self.query.window_s,
        )
        if self.reconciler.segment_retention_s < needed:
            raise CrossFieldError(
                "reconciler.segment_retention_s",
                f"must be >= max(gc.retry_horizon_s + 1 day, reconciler.lookback_s, "
                f"query.window_s) = {needed:g}, got {self.reconciler.segment_retention_s:g}",
                related=("gc.retry_horizon_s", "reconciler.lookback_s", "query.window_s"),
            )
        return self

    def settle_margin_s(self) -> float:
        """The longest a batch stamped ``accepted_at = t`` can still be landing after
        ``t`` (PROTOCOL §2, §3.8): a collector's request budget, a connect and a read
        timeout, and the clock skew allowed. An accepted hour is *sealed* once a completed
        listing audit started this long after it ended."""
        return (
            self.ingest.request_budget_s
            + self.store.connect_timeout_s
            + self.store.read_timeout_s
            + self.store.max_clock_skew_s
        )

    def spool_send_window_s(self) -> float:
        """How long after its bundle's write a spool landing may still send a manifest
        create (PROTOCOL §3.10, spool mode): ``gc.mark_grace_s`` less the settle margin."""
        return self.gc.mark_grace_s - self.settle_margin_s()

    def gc_lease_problem(self) -> str | None:
        """Why the GC could never delete under these settings, or None (PROTOCOL §3.5 rule
        6: a signed DELETE is sent only while the recorded lease outlives its deadline —
        the signature's date, up to the clock skew ahead, plus its expiry — plus the
        longest network delay, ``store.connect_timeout_s`` (`reconciler.gc.delete`);
        renewed every third of its TTL, at least two thirds of the lease are left when the
        check runs). Checked by the reconciler, not at load: a collector's file need not
        fit the reconciler's lease."""
        needed = (
            self.gc.delete_expiry_s + self.store.max_clock_skew_s + self.store.connect_timeout_s
        )
        if not self.gc.enabled or needed <= self.reconciler.lease_ttl_s * 2 / 3:
            return None
        return (
            f"gc.delete_expiry_s + store.max_clock_skew_s + store.connect_timeout_s = "
            f"{needed:g} must be <= 2/3 of reconciler.lease_ttl_s = "
            f"{self.reconciler.lease_ttl_s * 2 / 3:g}: the lease must outlive a signed delete, "
            "the skew and the network delay whenever it is sent (raise the lease TTL or lower "
            "the expiry, the skew limit or the connect timeout)"
        )
