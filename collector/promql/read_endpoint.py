"""``POST /api/v1/read``: Prometheus remote read on the query collector (PROTOCOL §5).

Order: authenticate (401; the engine's internal token first, `read_outcomes.
InternalPrincipals`) → read permission (403) → media type and encoding (400) → the body, read no
further than snappy's bound for ``query.max_read_request_bytes`` (400) → its declared decoded
length, then protobuf and per-query checks (`read_request`, on a thread; 400) → the parts: the
latest snapshot and the live window's batches its ledger lacks (`collector.query`'s machinery;
503 while a designated window is being rebuilt or the store fails) → per query, in order: select
(`select.select_series`, on a thread; more than ``query.max_read_samples`` is 400 naming it,
counted as rows are read, before anything is encoded, never cut short) → reserve the answer's
estimated bytes from ``query.max_read_bytes_in_flight`` (`ByteBudget`, a read holding nothing
waits; a request growing a reservation it holds does not wait: 503, so two requests never wait
on each other; the engine's internal principal has a selection pool and a budget of its own) →
encode (`encode`, on a thread; a ``STREAMED_XOR_CHUNKS`` series over
``query.max_read_frame_bytes`` is 400 before the first frame) → answer. At most `SELECTING`
reads per pool select and build answers at once (selected samples, ~16-40 bytes each, and the
answer being built are held there only: bounded however many reads are in flight); the others
wait, never refused. A stream is sent outside the pool.

- ``SAMPLES``: ``application/x-protobuf``, ``Content-Encoding: snappy``, query results in order;
- ``STREAMED_XOR_CHUNKS``: ``application/x-streamed-protobuf;
  proto=prometheus.ChunkedReadResponse``, a series a frame; an error after the first byte aborts.

Errors are Prometheus-shaped JSON (`prom_json`; Prometheus quotes a failed answer's body: it names
the problem and the limit). A client that goes away stops the read (a watcher sees the connection
close; the selection stops before its next row group or frame). Heavy work runs on threads.

Refusals, failures and the known gaps of reads served (a dropped batch the snapshot lacks, a
follower behind the log, own batches only) go to `read_outcomes.ReadOutcomes` with the principal
(a forwarded PromQL request turns them into 422/503)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import structlog
from aiohttp import web

from config.settings import QuerySettings
from config.tokens import Principal
from index.rows import IndexFileError
from rollup.table.manifest import RollupManifestError, Snapshot
from store.errors import StoreConfigError, StoreError

from ..auth import Authenticator
from ..metrics import CollectorMetrics
from ..query.committed import SnapshotSource
from ..query.coverage import Coverage
from ..query.file_cache import FileCache, reads_cache
from ..query.points_scan import ScanWork
from ..query.sources import LogFollower
from ..query.window import LiveWindow, live_part, missing_dropped
from . import encode, prom_json
from .read_outcomes import ByteBudget, InternalPrincipals, ReadOutcomes
from .read_request import SAMPLES, ParsedRead, ReadRefused, parse_body, read_body
from .select import ReadQuery, Selection, SeriesCache, TooManySamples, select_series

log = structlog.get_logger("collector.promql.read")
PATH = "/api/v1/read"
WATCH_INTERVAL_S = 0.05
RETRY_AFTER_S = 1
YIELD_EVERY_S = 0.02
SELECTING = 2


class ClientGone(Exception):
    """The client closed the connection: the read stops."""


class ReadEndpoint:
    def __init__(
        self,
        *,
        authenticator: Authenticator,
        settings: QuerySettings,
        snapshots: SnapshotSource,
        filesystem: Callable[[], tuple[pafs.FileSystem, str]],
        metrics: CollectorMetrics,
        now_ns: Callable[[], int],
        window: LiveWindow | None = None,
        follower: LogFollower | None = None,
        coverage: Coverage | None = None,
        outcomes: ReadOutcomes | None = None,
        internal: InternalPrincipals | None = None,
        file_cache: FileCache | None = None,
    ) -> None:
        self.authenticator = authenticator
        self.settings = settings
        self.snapshots = snapshots
        self._filesystem_factory = filesystem
        self._filesystem: tuple[pafs.FileSystem, str] | None = None
        self.metrics = metrics
        self.now_ns = now_ns
        self.window = window
        self.follower = follower
        self.coverage = coverage
        self.outcomes = outcomes or ReadOutcomes()
        self.internal = internal or InternalPrincipals()
        self.budget = ByteBudget(settings.max_read_bytes_in_flight)
        self.internal_budget = ByteBudget(settings.max_read_bytes_in_flight)
        self.selecting = asyncio.Semaphore(SELECTING)
        self.internal_selecting = asyncio.Semaphore(SELECTING)
        cache = file_cache  # shared with /v1/query and names (no `or`: an empty one is falsy)
        self.file_cache = cache if cache is not None else reads_cache(settings.cache_bytes, metrics)
        self.series_cache = SeriesCache()  # presented label sets, shared by reads
        self.running = 0  # reads being served now
        self.last_work: ScanWork | None = None
        """What the latest selection read (row groups, frames), also when it stopped."""
        self.unit_hook: Callable[[threading.Event], None] | None = None
        """Tests: called on the selection's thread before each unit of work."""

    @classmethod
    def beside(cls, query: Any, **extra: Any) -> ReadEndpoint:
        """A read endpoint over the parts of ``/v1/query``'s endpoint (`collector.query.
        endpoint.QueryEndpoint`): the same snapshot source, window and follower."""
        return cls(
            authenticator=query.authenticator,
            settings=query.settings,
            snapshots=query.snapshots,
            filesystem=query.arrow,  # one filesystem for all, not one each
            metrics=query.metrics,
            now_ns=query.now_ns,
            window=query.window,
            follower=query.follower,
            coverage=query.coverage,
            **{"file_cache": getattr(query, "file_cache", None), **extra},
        )

    def _arrow(self) -> tuple[pafs.FileSystem, str]:
        if self._filesystem is None:
            self._filesystem = self._filesystem_factory()
        return self._filesystem

    # --- the request ---------------------------------------------------------------------

    async def post_read(self, request: web.Request) -> web.StreamResponse:
        principal: Principal | web.Response | None = self.internal.authenticate(
            request.headers.get("Authorization")
        )
        if principal is None:
            principal = prom_json.authorize_read(self.authenticator, request)
        if isinstance(principal, web.Response):
            self._count(str(principal.status), "-")
            return principal
        self.running += 1
        try:
            response, kind = await self._serve(request, principal)
        except ReadRefused as exc:
            self.outcomes.record(principal.name, exc.kind, exc.status, str(exc))
            log.info("remote_read_refused", status=exc.status, error=str(exc))
            self._count(str(exc.status), "-")
            retry = {"Retry-After": str(RETRY_AFTER_S)} if exc.status >= 500 else None
            return prom_json.error(exc.status, str(exc), headers=retry)
        except Exception as exc:  # a bug: still a failed read for the forwarding to see
            self.outcomes.record(principal.name, "load", 500, f"internal error: {exc!r}")
            raise
        finally:
            self.running -= 1
        self._count("ok" if response.status == 200 else str(response.status), kind)
        return response

    def _count(self, status: str, kind: str) -> None:
        self.metrics.remote_reads.labels(status=status, type=kind).inc()

    async def _serve(
        self, request: web.Request, principal: Principal
    ) -> tuple[web.StreamResponse, str]:
        body = await read_body(request, self.settings.max_read_request_bytes)
        parsed: ParsedRead = await asyncio.to_thread(
            parse_body, body, max_decoded=self.settings.max_read_request_bytes
        )
        del body
        internal = self.internal.is_internal(principal)
        try:
            snapshot, frames = await self._parts(principal)
        except (StoreError, StoreConfigError, RollupManifestError, IndexFileError, OSError) as exc:
            raise ReadRefused(503, f"the store could not be read: {exc}", kind="load") from None
        gone = threading.Event()
        watcher = asyncio.create_task(self._watch(request, gone))
        budget = self.internal_budget if internal else self.budget
        selecting = self.internal_selecting if internal else self.selecting
        held = 0
        await selecting.acquire()  # held until the answer is built (a stream: until sent)
        building = True
        try:
            answers: list[Any] = []
            for index, query in enumerate(parsed.queries):
                selection = await self._select(index, query, snapshot, frames, gone)
                columns = selection.columns
                if parsed.response_type == SAMPLES:
                    need = encode.samples_answer_bytes(
                        columns.sample_count, len(columns.label_sets)
                    )
                    stream = None
                else:
                    stream = await asyncio.to_thread(encode.ChunkStream.of, columns)
                    try:
                        encode.check_frames(stream, self.settings.max_read_frame_bytes)
                    except encode.FrameTooLarge as exc:
                        raise ReadRefused(
                            400, f"query {index}: {exc}", limit="max_read_frame_bytes"
                        ) from None
                    need = stream.nbytes + stream.largest_frame_bytes
                held += await self._reserve(budget, need, held)
                if gone.is_set():
                    raise ClientGone()
                if stream is None:
                    answers.append(await asyncio.to_thread(encode.samples_result, columns))
                else:
                    answers.append(stream)
                del selection, columns  # not held while the answer is compressed and sent
            if parsed.response_type == SAMPLES:
                payload = await asyncio.to_thread(encode.read_response, answers)
                headers = {
                    "Content-Type": encode.SAMPLES_CONTENT_TYPE,
                    "Content-Encoding": "snappy",
                }
                return web.Response(body=payload, headers=headers), parsed.response_type
            selecting.release()  # built: its frames are sent outside the pool
            building = False
            streamed = await self._stream(request, answers, gone, principal.name)
            return streamed, parsed.response_type
        except ClientGone:
            log.info("remote_read_client_gone")
            return web.Response(status=499), parsed.response_type
        finally:
            if building:
                selecting.release()
            watcher.cancel()
            if held:
                budget.release(held)

    async def _reserve(self, budget: ByteBudget, need: int, held: int) -> int:
        if not held:
            return await budget.acquire(need)
        granted = budget.try_acquire(need)
        if granted is None:
            raise ReadRefused(
                503,
                f"the read's next query needs {need} more bytes than query.max_read_bytes_in_flight"
                " has free now; retry",
                limit="max_read_bytes_in_flight",
                kind="load",
            )
        return granted

    async def _select(
        self,
        index: int,
        query: ReadQuery,
        snapshot: Snapshot | None,
        frames: list[Any],
        gone: threading.Event,
    ) -> Selection:
        hook = self.unit_hook

        def check() -> None:
            if gone.is_set():
                raise ClientGone()
            if hook is not None:
                hook(gone)

        filesystem, root = self._arrow()
        work = self.last_work = ScanWork()
        try:
            selection = await asyncio.to_thread(
                select_series,
                query,
                snapshot,
                frames,
                filesystem,
                root,
                max_samples=self.settings.max_read_samples,
                check=check,
                work=work,
                cache=self.series_cache,
                file_cache=self.file_cache,
            )
        except TooManySamples as exc:
            raise ReadRefused(
                400,
                f"query {index} selects more than query.max_read_samples"
                f" ({exc.limit}) samples; narrow its matchers or time range",
                limit="max_read_samples",
            ) from None
        except (OSError, StoreError, pa.ArrowException) as exc:
            # A file the snapshot lists that cannot be read (gone, damaged): store trouble.
            raise ReadRefused(
                503, f"a snapshot file could not be read: {exc}", kind="load"
            ) from None
        self.metrics.query_dropped_labels.inc(selection.dropped_labels)
        self.metrics.query_name_collisions.inc(selection.name_collisions)
        return selection

    async def _stream(
        self, request: web.Request, streams: list[Any], gone: threading.Event, principal: str
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": encode.STREAM_CONTENT_TYPE})
        await response.prepare(request)
        max_frame = self.settings.max_read_frame_bytes
        try:
            yielded = time.monotonic()
            for index, stream in enumerate(streams):
                for frame in stream.frames(index, max_frame):
                    if gone.is_set():
                        raise ClientGone()
                    await response.write(frame)  # waits only while the client lags
                    if time.monotonic() - yielded > YIELD_EVERY_S:  # many small frames
                        await asyncio.sleep(0)
                        yielded = time.monotonic()
            await response.write_eof()
        except (ClientGone, ConnectionError) as exc:
            log.info("remote_read_stream_stopped", error=str(exc) or type(exc).__name__)
            self._abort(request)
            self._count("aborted", "STREAMED_XOR_CHUNKS")
        except Exception as exc:
            # After the first byte a status can no longer say it: cut the connection so
            # the client sees a failed read, never a clean end with series missing. (No
            # traceback rendering here: it would hold the loop.)
            log.error("remote_read_stream_failed", error=repr(exc))
            self.outcomes.record(principal, "load", 200, f"stream aborted: {exc!r}")
            self._abort(request)
            self._count("aborted", "STREAMED_XOR_CHUNKS")
        return response

    @staticmethod
    def _abort(request: web.Request) -> None:
        if (transport := request.transport) is not None:
            transport.abort()

    async def _watch(self, request: web.Request, gone: threading.Event) -> None:
        """Set ``gone`` once the client's connection closes (polled: aiohttp does not
        cancel a handler when its client leaves)."""
        try:
            while not gone.is_set():
                transport = request.transport
                if transport is None or transport.is_closing():
                    gone.set()
                    return
                await asyncio.sleep(WATCH_INTERVAL_S)
        except asyncio.CancelledError:
            return

    # --- the parts a read merges ----------------------------------------------------------

    async def _parts(self, principal: Principal) -> tuple[Snapshot | None, list[Any]]:
        """The latest snapshot and the frames of the window's batches its ledger lacks
        (excluded by ``manifest_id``, as ``/v1/query`` does); records known gaps."""
        if self.follower is not None and not self.follower.ready:
            raise ReadRefused(503, "the live window is being rebuilt; retry", kind="load")
        snapshot = await self.snapshots.latest()
        window = self.window
        if window is None:
            self.outcomes.record(
                principal.name, "partial", 200, "this collector serves committed data only"
            )
            return snapshot, []
        window.expire(self.now_ns())
        held = window.batches()
        dropped = window.dropped()
        candidates = {b.manifest_id for b in held} | {d.manifest_id for d in dropped}
        committed = await self.snapshots.included(snapshot, window.hours(), candidates)
        frames = [b.frame for b in live_part(held, committed, snapshot)]
        await self._gaps(principal, snapshot, window, committed)
        return snapshot, frames

    async def _gaps(
        self,
        principal: Principal,
        snapshot: Snapshot | None,
        window: LiveWindow,
        committed: set[str],
    ) -> None:
        gaps: list[str] = []
        if self.follower is not None and self.follower.behind:
            gaps.append("the designated collector is behind the index log")
        if self.follower is None:
            gaps.append("this collector follows only the batches it accepted itself")
        dropped = window.dropped()
        if (dropped or window.forgotten_through_ns is not None) and self.coverage is not None:
            sealed = await self.coverage.sealed_through_ns(snapshot)
            missing = missing_dropped(
                dropped,
                window.forgotten_through_ns,
                committed,
                sealed_through_ns=sealed,
                range_ns=(-(2**63), 2**63 - 1),
            )
            if missing:
                gaps.append(
                    f"{missing} batches the live window dropped are not in the snapshot yet"
                )
        for gap in gaps:
            self.outcomes.record(principal.name, "partial", 200, gap)
