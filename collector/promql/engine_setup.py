"""The PromQL engine and the forward, assembled from ``[query.promql]`` by
`collector.app.CollectorApp` beside ``/v1/query`` (its `QuerySettings`).

`PromqlEngineParts.add_routes` registers ``/api/v1/query`` and ``/api/v1/query_range``
(503 without an engine) and ends the engine with the application (``on_cleanup``);
`PromqlEngineParts.listening` starts it once the collector's port is known, since the
engine reads from this collector's ``/api/v1/read``.

One collector process only (``--workers 1``, `one_process_reason`): the engine's read
token is made per process, and with ``SO_REUSEPORT`` its reads would land on any worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from aiohttp import web

from config import Settings
from config.query_settings import QuerySettings

from ..auth import Authenticator
from .engine import Engine, SupervisedEngine
from .engine_sidecar import SidecarEngine, default_read_url
from .forward import EngineReadReport, EngineReads, PromqlForward
from .read_outcomes import InternalPrincipals, ReadOutcomes


class EngineReadsFromOutcomes:
    """`EngineReads` over the remote read's record (`read_outcomes.ReadOutcomes`): the
    outcomes of the engine principal's reads while a forwarded request ran. A watch that
    outlived what the record kept counts as a failed read (assume the worst)."""

    def __init__(self, outcomes: ReadOutcomes, principal: str) -> None:
        self.outcomes = outcomes
        self.principal = principal

    def begin(self) -> int:
        return self.outcomes.begin()

    def report(self, mark: int) -> EngineReadReport:
        try:
            seen = self.outcomes.since(mark, self.principal)
        finally:
            self.outcomes.end(mark)
        failed = [o.message for o in seen.of_kind("load")]
        if not seen.complete:
            failed.append("more reads of the engine failed or were refused than were kept")
        return EngineReadReport(
            refused_for_limit=tuple(o.message for o in seen.of_kind("limit")),
            failed=tuple(failed),
            gaps=tuple(o.message for o in seen.of_kind("partial")),
        )


@dataclass
class PromqlEngineParts:
    forward: PromqlForward
    engine: Engine | None

    def add_routes(self, app: web.Application) -> None:
        self.forward.add_routes(app)
        if self.engine is not None:
            app.on_cleanup.append(self._stop)

    def attach_remote_read(
        self, authenticator: Authenticator, internal: InternalPrincipals, outcomes: ReadOutcomes
    ) -> None:
        """Make the engine's read token one of the remote read's internal principals (its
        own pool) and judge forwarded answers by that principal's read outcomes."""
        name = authenticator.engine_read.principal.name
        internal.add(name, authenticator.engine_read.token)
        self.forward.reads = EngineReadsFromOutcomes(outcomes, name)

    async def listening(self, host: str, port: int) -> None:
        if self.engine is not None:
            await self.engine.start(default_read_url(host, port))

    async def _stop(self, _app: web.Application) -> None:
        assert self.engine is not None
        await self.engine.stop()


def one_process_reason(settings: Settings) -> str | None:
    """Why this configuration allows one collector process (``--workers 1``), or None."""
    promql = settings.query.promql
    if promql.prometheus is None and promql.url is None:
        return None
    return (
        "a PromQL engine ([query.promql] prometheus or url) allows one collector process "
        "(--workers 1): its read token is made per process"
    )


def engine_problem(settings: Settings) -> str | None:
    """What keeps ``[query.promql]`` from working, found before binding, or None."""
    promql = settings.query.promql
    if promql.prometheus is not None and not os.access(promql.prometheus, os.X_OK):
        return f"query.promql.prometheus = {str(promql.prometheus)!r} is not an executable file"
    if promql.url is not None and promql.credentials_dir is None:
        return (
            "query.promql.url needs query.promql.credentials_dir: the directory shared with "
            "the engine where the collector writes its read token (lm-collector promql-config)"
        )
    return None


ENGINE_HEADROOM_BYTES = 256 * 1024 * 1024


def engine_memory_limit(settings: QuerySettings) -> int | None:
    """The supervised engine's ``GOMEMLIMIT`` (`config.query_settings.PromqlSettings.
    memory_limit_bytes`): given, or the answers in flight plus `ENGINE_HEADROOM_BYTES`;
    None for 0 (no limit)."""
    given = settings.promql.memory_limit_bytes
    if given is None:
        return settings.max_read_bytes_in_flight + ENGINE_HEADROOM_BYTES
    return given or None


def build_promql_engine(
    settings: QuerySettings, *, authenticator: Authenticator, reads: EngineReads | None = None
) -> PromqlEngineParts:
    """The engine ``[query.promql]`` names (none: the forward answers 503) and the forward."""
    promql = settings.promql
    engine: Engine | None = None
    if promql.prometheus is not None:
        engine = SupervisedEngine(
            binary=promql.prometheus,
            settings=promql,
            max_concurrency=settings.max_concurrent_promql,
            read_token=authenticator.engine_read,
            memory_limit_bytes=engine_memory_limit(settings),
        )
    elif promql.url is not None:
        engine = SidecarEngine(settings=promql, read_token=authenticator.engine_read)
    forward = PromqlForward(
        authenticator=authenticator, settings=settings, engine=engine, reads=reads
    )
    return PromqlEngineParts(forward, engine)
