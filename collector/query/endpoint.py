"""``GET /v1/query`` (read token): committed snapshot + accepted batches not yet in it.

Order: authenticate (401) → read permission (403) → concurrency cap (429) → parameters
(400 `collector.query.api`) → window ready (503 while a designated collector rebuilds
it) → the answer. Nothing is read for a caller that may not read.

The answer (PROTOCOL §2)::

    {"complete": bool, "snapshot_version": int | null, "sealed_through_ns": int,
     "live_through_ns": int,
     "sources": {"snapshot_rows", "live_rows", "live_batches", "window_batches",
                 "dropped_missing", "late_batches",
                 "following": "designated" | "own_batches" | "none"},
     "columns": [...], "rows": [[...], ...]}

- committed part: the latest snapshot (or ``version`` / ``as_of``) read with the query's
  filters (`collector.query.committed`);
- live part (latest snapshot only; a time-travel answer is the committed part alone):
  the window's batches whose ``manifest_id`` the snapshot's ledger lacks — excluded by
  id, never by hour, so a batch accepted in a new hour while a snapshot lands is counted
  once (`collector.query.rows`);
- ``sealed_through_ns`` (`collector.query.coverage`): every batch *accepted* before it is
  in the snapshot. ``complete`` is true only when ``to <= sealed_through_ns``, the window
  dropped nothing the range may need that the snapshot lacks, and a designated
  collector is not behind the log. ``complete`` is about acceptance time, the range
  about point time: **an old range can still grow after a complete answer**, from a
  batch accepted later that carries old points (an agent replaying its spool after an
  outage). ``sources.late_batches`` (`collector.query.late`) counts the batches in the
  answer that were accepted at or after ``sealed_through_ns`` and whose points' span
  overlaps the range (never fewer than there are).
- ``live_through_ns``: designated, the store time through which the log has been
  followed (every segment cut before it was listed; a batch accepted earlier may still
  appear later, PROTOCOL §3.7); own batches, now; neither, ``sealed_through_ns`` (nothing live is held).

Errors: 400 ``invalid_query`` / ``too_many_rows`` (over ``max_result_rows``) /
``travel_too_far`` (over ``max_travel_versions``), 404 ``version_not_found``, 429
``overloaded``, 503 ``window_not_ready`` / ``store_unavailable``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import structlog
from aiohttp import web

from config.settings import QuerySettings
from index.rows import IndexFileError
from protocol.batch_api import STORE_UNAVAILABLE
from rollup.read.chain_index import TravelTooFar
from rollup.table.commit import VersionNotFound
from rollup.table.manifest import RollupManifestError, Snapshot
from rollup.table.tombstones import drop_from_points, drop_from_rollup
from store.errors import StoreConfigError, StoreError

from ..auth import Authenticator
from ..intake import authorize, error_response
from ..metrics import CollectorMetrics
from ..process_memory import fix_mmap_threshold
from .api import LiveQuery, QueryError, parse_query
from .committed import SnapshotSource, read_committed
from .coverage import Coverage
from .file_cache import reads_cache
from .late import LateBatches, in_live_part
from .rows import (
    TooManyRows,
    json_rows,
    live_points,
    merge_points,
    merge_rollup,
    rollup_of_points,
)
from .sources import LogFollower
from .window import LiveWindow, live_part, missing_dropped

log = structlog.get_logger("collector.query")
LIVE_POINTS_FACTOR = 10
"""Points read to build a rollup-shaped answer, at most this many per answer row allowed."""


@dataclass(frozen=True, slots=True)
class Rows:
    table: pa.Table
    snapshot_rows: int
    live_rows: int
    live_batches: int


class QueryEndpoint:
    def __init__(
        self,
        *,
        authenticator: Authenticator,
        settings: QuerySettings,
        snapshots: SnapshotSource,
        coverage: Coverage,
        filesystem: Callable[[], tuple[pafs.FileSystem, str]],
        metrics: CollectorMetrics,
        now_ns: Callable[[], int],
        window: LiveWindow | None = None,
        follower: LogFollower | None = None,
        late: LateBatches | None = None,
        retry_after_s: int = 1,
    ) -> None:
        self.authenticator = authenticator
        self.settings = settings
        self.snapshots = snapshots
        self.coverage = coverage
        self._filesystem_factory = filesystem
        self._filesystem: tuple[pafs.FileSystem, str] | None = None
        self.metrics = metrics
        self.now_ns = now_ns
        self.window = window
        self.follower = follower
        self.late = late or LateBatches(snapshots, wait_s=settings.history_wait_s)
        self.retry_after_s = retry_after_s
        self._running = 0
        fix_mmap_threshold()  # freed columns leave the process (`process_memory`)
        self.file_cache = reads_cache(settings.cache_bytes, metrics)
        """Snapshot files and footers within ``query.cache_bytes``, for the read path
        beside this endpoint (remote read, names: their ``beside``)."""

    @property
    def following(self) -> str:
        if self.follower is not None:
            return "designated"
        return "own_batches" if self.window is not None else "none"

    async def close(self, _app: web.Application | None = None) -> None:
        """The process is stopping: stop reading history (`Coverage.close`,
        `LateBatches.close`)."""
        await self.coverage.close()
        await self.late.close()

    async def get_query(self, request: web.Request) -> web.Response:
        response = await self._get_query(request)
        status = "ok" if response.status == 200 else str(response.status)
        self.metrics.queries.labels(status=status).inc()
        return response

    async def _get_query(self, request: web.Request) -> web.Response:
        if isinstance(refused := authorize(self.authenticator, request, "read"), web.Response):
            return refused
        if self._running >= self.settings.max_concurrent_queries:
            headers = {"Retry-After": str(self.retry_after_s)}
            return error_response(429, "overloaded", headers)
        self._running += 1
        try:
            query = parse_query(
                {k: request.query.getall(k) for k in request.query}, now_ns=self.now_ns()
            )
            if self.follower is not None and not self.follower.ready:
                raise QueryError(503, "window_not_ready", "the live window is being rebuilt")
            return web.json_response(await self.answer(query))
        except QueryError as exc:
            retry = {"Retry-After": str(self.retry_after_s)} if exc.status == 503 else None
            return web.json_response(exc.body(), status=exc.status, headers=retry)
        except VersionNotFound as exc:
            return error_response(404, "version_not_found", detail=str(exc))
        except TravelTooFar as exc:
            param = "version" if "version" in request.query else "as_of"
            return error_response(
                400, "travel_too_far", param=param, detail=str(exc), limit=exc.limit
            )
        except (StoreError, StoreConfigError, RollupManifestError, IndexFileError, OSError) as exc:
            log.warning("query_store_unavailable", error=str(exc))
            headers = {"Retry-After": str(self.retry_after_s)}
            return error_response(503, STORE_UNAVAILABLE, headers, detail=str(exc))
        finally:
            self._running -= 1

    async def answer(self, query: LiveQuery) -> dict[str, Any]:
        snapshot = await self.snapshots.for_query(query)
        sealed = await self.coverage.sealed_through_ns(snapshot)
        travel = query.version is not None or query.as_of is not None
        window = None if travel else self.window
        frames, window_batches, missing, late = [], 0, 0, 0
        if window is not None:
            window.expire(self.now_ns())
            window.forget_committed(sealed)
            held = window.batches()
            dropped = window.dropped()
            candidates = {b.manifest_id for b in held} | {d.manifest_id for d in dropped}
            committed_ids = await self.snapshots.included(snapshot, window.hours(), candidates)
            live = live_part(held, committed_ids, snapshot)
            frames = [b.frame for b in live]
            late = in_live_part(live, sealed_through_ns=sealed, range_ns=query.points_range_ns)
            window_batches = len(held)
            missing = missing_dropped(
                dropped,
                window.forgotten_through_ns,
                committed_ids,
                sealed_through_ns=sealed,
                range_ns=query.points_range_ns,
            )
        late += await self.late.committed(
            snapshot, sealed_through_ns=sealed, range_ns=query.points_range_ns
        )
        rows = await asyncio.to_thread(self._rows, query, snapshot, frames)
        behind = self.follower is not None and self.follower.behind and not travel
        complete = query.to_ns <= sealed and missing == 0 and not behind
        return {
            "complete": complete,
            "snapshot_version": snapshot.version if snapshot is not None else None,
            "sealed_through_ns": sealed,
            "live_through_ns": self._live_through(sealed, travel),
            "sources": {
                "snapshot_rows": rows.snapshot_rows,
                "live_rows": rows.live_rows,
                "live_batches": rows.live_batches,
                "window_batches": window_batches,
                "dropped_missing": missing,
                "late_batches": late,
                "following": "none" if travel else self.following,
            },
            "columns": rows.table.column_names,
            "rows": json_rows(rows.table),
        }

    def _live_through(self, sealed: int, travel: bool) -> int:
        if travel or self.window is None:
            return sealed
        if self.follower is not None:
            return self.follower.followed_through_ns
        return self.now_ns()

    def arrow(self) -> tuple[pafs.FileSystem, str]:
        """The store's Arrow filesystem and root, made once and shared with the endpoints
        built beside this one (remote read, names: their ``beside``)."""
        if self._filesystem is None:
            self._filesystem = self._filesystem_factory()
        return self._filesystem

    def _rows(self, query: LiveQuery, snapshot: Snapshot | None, frames: list[Any]) -> Rows:
        """Blocking: reads Parquet and builds rows (runs on a thread)."""
        limit = self.settings.max_result_rows
        filesystem, root = self.arrow()
        try:
            # Live points feed minutes in the rollup shape: bounded by the window itself.
            live_limit = limit if query.table == "points" else LIVE_POINTS_FACTOR * limit
            live, live_batches = live_points(frames, query, live_limit)
            # The snapshot's deletes mask live rows as they mask rows of a later run.
            deletes = snapshot.tombstones if snapshot is not None else ()
            live_for_points, live_for_rollup = drop_from_points(deletes, live, live)
            if query.table == "points":
                committed = read_committed(
                    snapshot, "points", query, filesystem, root, max_rows=limit
                )
                table = merge_points(committed, live_for_points)
            elif query.agent is not None:  # rollup_1m has no agent column: aggregate points
                committed = read_committed(
                    snapshot,
                    "points",
                    query,
                    filesystem,
                    root,
                    max_rows=LIVE_POINTS_FACTOR * limit,
                    range_ns=query.points_range_ns,
                )
                merged = merge_points(committed, live_for_points)
                merged = drop_from_rollup(deletes, merged)
                table = rollup_of_points(merged)
            else:
                committed = read_committed(
                    snapshot, "rollup_1m", query, filesystem, root, max_rows=limit
                )

                def committed_points(series: list[str]) -> pa.Table:
                    return read_committed(
                        snapshot,
                        "points",
                        query,
                        filesystem,
                        root,
                        max_rows=LIVE_POINTS_FACTOR * limit,
                        range_ns=query.points_range_ns,
                        series=series,
                        masked=False,  # the samples rollup_1m was built from
                    )

                table = merge_rollup(committed, live_for_rollup, committed_points)
        except TooManyRows as exc:
            raise QueryError(
                400, "too_many_rows", f"{exc}; narrow the query", limit=limit
            ) from None
        if table.num_rows > limit:
            raise QueryError(
                400, "too_many_rows", f"{table.num_rows} rows; narrow the query", limit=limit
            )
        return Rows(table, committed.num_rows, live.num_rows, live_batches)
