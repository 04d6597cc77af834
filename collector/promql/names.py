"""The names endpoints (PROTOCOL §5 "Names"), answered by the collector itself: a
Prometheus engine cannot list names over remote read.

``GET|POST /api/v1/labels``, ``/api/v1/label/<name>/values`` and ``/api/v1/series``
(``match[]``, ``start``, ``end``, ``limit``: `collector.promql.names_params`) from the
committed snapshot's ``series``/``series_day`` rows of the range
(`rollup.read.series_index`: a day file a day, hour files at the edges) plus the live
window's presented label sets (`collector.promql.live_names`). Also
``/api/v1/status/buildinfo`` (the engine's version: Grafana picks features by it),
``/api/v1/metadata`` (``data: {}`` in v1) and ``/api/v1/query_exemplars`` (empty).

Order: read token (401/403) → parameters (400 ``bad_data``) → the answer. A listing may
name a series whose points a not-yet-compacted tombstone deletes, never omit a live one:
no tombstone is applied here. A collector that follows only its own batches, or whose
designated follower is behind, adds the ``partial:`` warning of PROTOCOL §5.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import structlog
from aiohttp import web

from config.settings import QuerySettings
from index.rows import IndexFileError
from rollup.read.series_index import SERIES_ROWS_SCHEMA, index_files
from rollup.table.data_file import DataFile
from rollup.table.manifest import RollupManifestError, Snapshot
from store.errors import StoreConfigError, StoreError

from ..auth import Authenticator
from ..params import QueryError
from ..query.api import ns_to_datetime
from ..query.committed import SnapshotSource
from ..query.file_cache import FileCache
from ..query.sources import LogFollower
from ..query.window import LiveWindow
from . import prom_json
from .live_names import LiveLabelSets
from .matchers import MatcherError, check_not_all_empty, compile_matchers, select_label_sets
from .names_params import NamesRequest, bad_data, parse_names

log = structlog.get_logger("collector.promql.names")
LABEL_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
MAX_FORM_BYTES = 1024 * 1024
PARTIAL_OWN = (
    "partial: this collector answers from the committed snapshot and its own accepted"
    " batches only; batches other collectors accepted since the last rollup are missing"
)
PARTIAL_NONE = (
    "partial: this collector follows no live batches; series seen only since the last"
    " rollup are missing"
)
PARTIAL_BEHIND = "partial: the designated collector is behind the index log"

BuildInfo = Callable[[], Awaitable[dict[str, Any] | None]]
READERS = 4
"""Index files a names listing reads at once on a cache miss."""


class NamesEndpoint:
    def __init__(
        self,
        *,
        authenticator: Authenticator,
        settings: QuerySettings,
        snapshots: SnapshotSource,
        filesystem: Callable[[], tuple[pafs.FileSystem, str]],
        now_ns: Callable[[], int],
        window: LiveWindow | None = None,
        follower: LogFollower | None = None,
        buildinfo: BuildInfo | None = None,
        file_cache: FileCache | None = None,
    ) -> None:
        self.authenticator = authenticator
        self.settings = settings
        self.snapshots = snapshots
        self._filesystem_factory = filesystem
        self._filesystem: tuple[pafs.FileSystem, str] | None = None
        self.now_ns = now_ns
        self.window = window
        self.follower = follower
        self.buildinfo_source = buildinfo
        self.live = LiveLabelSets()
        # `is not None`: an empty FileCache is falsy (len 0); ``or`` dropped the shared one.
        self.file_cache = file_cache if file_cache is not None else FileCache(0)

    @classmethod
    def beside(cls, query: Any, buildinfo: BuildInfo | None = None) -> NamesEndpoint:
        """Names over the parts of ``/v1/query``'s endpoint (`collector.query.endpoint.
        QueryEndpoint`): the same snapshot source, window and follower."""
        return cls(
            authenticator=query.authenticator,
            settings=query.settings,
            snapshots=query.snapshots,
            filesystem=query.arrow,  # one filesystem for all, not one each
            now_ns=query.now_ns,
            window=query.window,
            follower=query.follower,
            buildinfo=buildinfo,
            file_cache=getattr(query, "file_cache", None),
        )

    def add_routes(self, app: web.Application) -> None:
        for path, handler in (
            ("/api/v1/labels", self.labels),
            ("/api/v1/label/{name}/values", self.label_values),
            ("/api/v1/series", self.series),
        ):
            app.router.add_get(path, handler)
            app.router.add_post(path, handler)
        app.router.add_get("/api/v1/status/buildinfo", self.buildinfo)
        app.router.add_get("/api/v1/metadata", self.metadata)
        app.router.add_get("/api/v1/query_exemplars", self.exemplars)
        app.router.add_post("/api/v1/query_exemplars", self.exemplars)

    # --- handlers ------------------------------------------------------------------------

    async def labels(self, request: web.Request) -> web.Response:
        async def answer(sets: pa.Table) -> Any:
            column = sets.column("presented_labels")
            maps = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
            # A fresh array's children hold exactly its rows' entries.
            found = set(pc.unique(pa.concat_arrays([maps]).keys).to_pylist())
            if sets.num_rows:
                found.add("__name__")
            return sorted(found, key=str.encode)

        return await self._names(request, answer, need_match=False)

    async def label_values(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not name or name[0].isdigit() or not set(name) <= LABEL_NAME_CHARS:
            return prom_json.error(400, f"invalid label name: {name[:200]!r}")

        async def answer(sets: pa.Table) -> Any:
            if name == "__name__":
                values = sets.column("presented_name")
            else:
                values = pc.map_lookup(sets.column("presented_labels"), name, "first")
            found = pc.unique(pc.drop_null(values)).to_pylist()
            return sorted((v for v in found if v != ""), key=str.encode)

        return await self._names(request, answer, need_match=False)

    async def series(self, request: web.Request) -> web.Response:
        async def answer(sets: pa.Table) -> Any:
            rows = zip(
                sets.column("presented_name").to_pylist(),
                sets.column("presented_labels").to_pylist(),
                strict=True,
            )
            found = {(name, *sorted(labels or [])) for name, labels in rows}
            out = [{"__name__": item[0], **dict(item[1:])} for item in found]
            return sorted(
                out, key=lambda s: [(k.encode(), v.encode()) for k, v in sorted(s.items())]
            )

        return await self._names(request, answer, need_match=True)

    async def buildinfo(self, request: web.Request) -> web.Response:
        if isinstance(
            refused := prom_json.authorize_read(self.authenticator, request), web.Response
        ):
            return refused
        info = await self.buildinfo_source() if self.buildinfo_source is not None else None
        if info is None:
            return prom_json.error(503, "the PromQL engine is not running (query.promql)")
        return prom_json.success(info)

    async def metadata(self, request: web.Request) -> web.Response:
        if isinstance(
            refused := prom_json.authorize_read(self.authenticator, request), web.Response
        ):
            return refused
        return prom_json.success({})

    async def exemplars(self, request: web.Request) -> web.Response:
        if isinstance(
            refused := prom_json.authorize_read(self.authenticator, request), web.Response
        ):
            return refused
        return prom_json.success([])

    # --- the shared path -----------------------------------------------------------------

    async def _names(
        self,
        request: web.Request,
        answer: Callable[[pa.Table], Awaitable[Any]],
        *,
        need_match: bool,
    ) -> web.Response:
        if isinstance(
            refused := prom_json.authorize_read(self.authenticator, request), web.Response
        ):
            return refused
        try:
            names = parse_names(
                await _params(request),
                now_ns=self.now_ns(),
                default_range_s=self.settings.names_default_range_s,
                max_range_s=self.settings.names_max_range_s,
            )
            if need_match and not names.selectors:
                raise bad_data("no match[] parameter provided")
            sets = await self._label_sets(names)
        except QueryError as exc:
            return prom_json.error(exc.status, exc.detail)
        except (StoreError, StoreConfigError, RollupManifestError, IndexFileError, OSError) as exc:
            log.warning("names_store_unavailable", error=str(exc))
            return prom_json.error(503, f"the store is unavailable: {exc}")
        data = await answer(sets)
        warnings = self._partial()
        if names.limit and len(data) > names.limit:
            data = data[: names.limit]
            warnings.append("results truncated due to limit")
        return prom_json.success(data, warnings)

    async def _label_sets(self, names: NamesRequest) -> pa.Table:
        """The presented label sets with a point in the range that match any selector."""
        snapshot = await self.snapshots.latest()
        held = [] if self.window is None else list(self.window.batches())
        return await asyncio.to_thread(self._read_and_match, snapshot, held, names)

    def _read_and_match(
        self, snapshot: Snapshot | None, held: list[Any], names: NamesRequest
    ) -> pa.Table:
        columns = ["presented_name", "presented_labels"]
        compiled = []
        for selector in names.selectors:
            try:
                matchers = compile_matchers(selector)
                check_not_all_empty(matchers)
            except MatcherError as exc:
                raise bad_data(str(exc)) from None
            compiled.append(matchers)
        parts = []
        if snapshot is not None:
            parts.append(self._index_rows(snapshot, names, columns))
        live = self.live.in_range(held, names.start_ns, names.end_ns)
        parts.append(live.select(columns))
        sets = pa.concat_tables([part.cast(parts[-1].schema) for part in parts])
        if not compiled:
            return sets
        name, labels = sets.column("presented_name"), sets.column("presented_labels")
        keep = np.zeros(sets.num_rows, dtype=bool)
        for matchers in compiled:
            keep |= select_label_sets(name, labels, matchers)
        return sets.filter(pa.array(keep))

    def _index_rows(self, snapshot: Snapshot, names: NamesRequest, columns: list[str]) -> pa.Table:
        """The snapshot's index rows of the range, one per stored series (its first row
        in the files: a listing needs the presented names, not counts or times), cached
        by the index files they come from (immutable: the same files always give the
        same rows), so a repeated listing over an unchanged snapshot reads nothing. On a
        miss the files (`rollup.read.series_index.index_files`) are read `READERS` at a
        time, not kept (the rows made of them are)."""
        filesystem, root = self._arrow()
        # Prometheus' end is inclusive; the index's range is half-open.
        start, end = ns_to_datetime(names.start_ns), ns_to_datetime(names.end_ns + 1000)
        day_files, hour_files = index_files(snapshot, start, end)
        files = [*day_files, *hour_files]
        key = (tuple(f.path for f in files), tuple(columns))
        found = self.file_cache.get("series_rows", key)
        if found is not None:
            cached: pa.Table = found
            return cached
        needed = ["series", *columns]
        target = pa.schema([SERIES_ROWS_SCHEMA.field(name) for name in needed])

        def read(data_file: DataFile) -> pa.Table:
            table = self.file_cache.read_whole(filesystem, root, data_file, needed, keep=False)
            return table.select(needed).cast(target)

        with ThreadPoolExecutor(READERS, thread_name_prefix="names-read") as pool:
            parts = list(pool.map(read, files))
        rows = _first_per_series(pa.concat_tables(parts)) if parts else None
        del parts
        if rows is None:
            rows = pa.schema([SERIES_ROWS_SCHEMA.field(name) for name in columns]).empty_table()
        self.file_cache.put("series_rows", key, rows, rows.nbytes)
        return rows

    def _partial(self) -> list[str]:
        if self.follower is not None:
            return [PARTIAL_BEHIND] if self.follower.behind else []
        return [PARTIAL_OWN] if self.window is not None else [PARTIAL_NONE]

    def _arrow(self) -> tuple[pafs.FileSystem, str]:
        if self._filesystem is None:
            self._filesystem = self._filesystem_factory()
        return self._filesystem


def _first_per_series(rows: pa.Table) -> pa.Table:
    """Each stored ``series``' first row, without the ``series`` column."""
    numbered = pa.table(
        {"series": rows.column("series"), "_row": pa.array(np.arange(rows.num_rows))}
    )
    first = numbered.group_by("series", use_threads=False).aggregate([("_row", "min")])
    picked = first.column("_row_min")
    # One array before the take: pyarrow's take over many chunks of a map column is slow.
    columns = [name for name in rows.column_names if name != "series"]
    return pa.table({name: rows.column(name).combine_chunks().take(picked) for name in columns})


async def _params(request: web.Request) -> Mapping[str, Sequence[str]]:
    params: dict[str, list[str]] = {k: request.query.getall(k) for k in request.query}
    if request.method == "POST":
        if request.content_length is not None and request.content_length > MAX_FORM_BYTES:
            raise bad_data(f"form body over {MAX_FORM_BYTES} bytes")
        form = await request.post()
        for key in form:
            params.setdefault(key, []).extend(str(v) for v in form.getall(key))
    return params
