"""Assembling ``GET /v1/query`` from settings (`collector.server.Worker` calls it).

``[query]`` (`config.settings.QuerySettings`): ``designated`` follows the index log
(`collector.query.sources.LogFollower`), ``own_batches`` keeps this collector's own
accepted batches (`OwnBatches`, hooked into `BatchAcceptor`); with neither there is no
window and answers are the committed part only.

The settle margin of `collector.query.coverage` is the longest a batch stamped with an
``accepted_at`` can still be landing — ``ingest.request_budget_s`` plus the store's
connect and read timeouts — plus ``store.max_clock_skew_s``. The log lookback of the
follower is `config.settings.Settings.log_lookback_floor_s`: a segment's name carries its
cut time, and it lands at most ``ingest.index_put_budget_s`` later, on a clock off by at
most the skew limit (PROTOCOL §3.7).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.fs as pafs

from config import Settings
from protocol.clock import Clock
from rollup.table.storage import StoreAccess
from store.base import ObjectStore

from ..auth import Authenticator
from ..metrics import CollectorMetrics
from ..startup_checks import StartupError
from .committed import SnapshotSource
from .coverage import Coverage
from .endpoint import QueryEndpoint
from .history_cache import HistoryCache
from .sources import LogFollower, OwnBatches
from .window import LiveWindow


def history_cache(settings: Settings) -> HistoryCache | None:
    """``query.history_cache_dir``'s cache, for this store; `StartupError` naming the
    directory when it cannot be used."""
    directory = settings.query.history_cache_dir
    if directory is None:
        return None
    store = f"{settings.store.url} {settings.store.endpoint_url or ''}"
    try:
        return HistoryCache(directory, store_name=store)
    except OSError as exc:
        raise StartupError(f"query.history_cache_dir {directory}: {exc}") from None


@dataclass
class QueryParts:
    endpoint: QueryEndpoint
    own: OwnBatches | None = None
    follower: LogFollower | None = None


def build_query(
    settings: Settings,
    *,
    store: ObjectStore,
    clock: Clock,
    metrics: CollectorMetrics,
    authenticator: Authenticator,
) -> QueryParts:
    q = settings.query
    margin = settings.settle_margin_s()
    window = (
        LiveWindow(
            window_s=q.window_s, max_points=q.max_window_points, max_bytes=q.max_window_bytes
        )
        if q.designated or q.own_batches
        else None
    )
    own = (
        OwnBatches(window, clock=clock, max_raw_bytes=settings.ingest.max_raw_bytes)
        if window is not None and q.own_batches
        else None
    )
    follower = (
        LogFollower(
            store,
            window,
            clock=clock,
            poll_interval_s=q.poll_interval_s,
            lookback_s=settings.log_lookback_floor_s(),
            max_pending=q.max_pending_batches,
            max_raw_bytes=settings.ingest.max_raw_bytes,
            max_frame_bytes=settings.ingest.max_frame_bytes,
        )
        if window is not None and q.designated
        else None
    )

    def filesystem() -> tuple[pafs.FileSystem, str]:
        return StoreAccess.of(settings.store).filesystem()

    endpoint = QueryEndpoint(
        authenticator=authenticator,
        settings=q,
        snapshots=SnapshotSource(
            store,
            refresh_interval_s=q.refresh_interval_s,
            max_travel_versions=q.max_travel_versions,
        ),
        coverage=Coverage(
            store,
            settle_margin_s=margin,
            refresh_interval_s=q.refresh_interval_s,
            history_wait_s=q.history_wait_s,
            history_cache=history_cache(settings),
        ),
        filesystem=filesystem,
        metrics=metrics,
        now_ns=clock.now_ns,
        window=window,
        follower=follower,
    )
    return QueryParts(endpoint, own, follower)
