"""``[query]``: the live query endpoint ``GET /v1/query`` (`collector.query`)."""

from __future__ import annotations

from pydantic import Field

from config.section import MiB, Seconds, Section


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
