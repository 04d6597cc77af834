"""``GET /v1/conflicts`` (admin token): the quarantine records (PROTOCOL §2, §3.3).

Optional filters ``agent_id``, ``since`` (unix ns or RFC 3339 with a timezone) and
``limit`` (1..10000, default 1000; ``truncated`` says when more matched). A bad or
unknown parameter, or one given twice, is 400 ``{"error": "invalid_query", "param",
"detail"}`` (`collector.params`): an ``agent_id`` that is not 1..128 bytes of UTF-8
without control characters (a lone surrogate included), a ``since`` that is neither
ASCII digits nor RFC 3339 with an offset, a ``limit`` that is not ASCII digits in range.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import structlog
from aiohttp import web

from protocol import keys, records
from protocol.frame import MAX_AGENT_ID_BYTES
from store.base import ObjectStore, list_prefixes
from store.errors import StoreConfigError, StoreError

from .auth import Authenticator
from .intake import authorize, error_response
from .params import QueryError, check_names, integer, one, text, unix_ns_or_rfc3339

log = structlog.get_logger("collector.http")

MAX_CONFLICTS_LIMIT = 10_000
PARAMS = frozenset({"agent_id", "since", "limit"})


class ConflictsEndpoint:
    def __init__(
        self, *, authenticator: Authenticator, store: ObjectStore, retry_after_s: int
    ) -> None:
        self.authenticator = authenticator
        self.store = store
        self.retry_after_s = retry_after_s

    async def get_conflicts(self, request: web.Request) -> web.Response:
        if isinstance(refused := authorize(self.authenticator, request, "admin"), web.Response):
            return refused
        try:
            agent_id, since_ns, limit = conflict_filters(
                {name: request.query.getall(name) for name in request.query}
            )
        except QueryError as exc:
            return web.json_response(exc.body(), status=exc.status)
        # Both agent forms (PROTOCOL §3): a store written before the segment rule may hold
        # a long agent's records under the hex form.
        prefixes = (
            keys.quarantine_agent_prefixes(agent_id)
            if agent_id is not None
            else [keys.QUARANTINE_PREFIX]
        )
        conflicts: list[dict[str, Any]] = []
        truncated = False
        try:
            async for info in list_prefixes(self.store, prefixes):
                body, _ = await self.store.get(info.key)
                try:
                    conflict = records.IdentityConflict.from_json(body)
                except records.RecordError as exc:
                    log.warning("quarantine_record_unreadable", key=info.key, error=str(exc))
                    continue
                if since_ns is not None and conflict.observed_at_unix_ns < since_ns:
                    continue
                if len(conflicts) == limit:
                    truncated = True
                    break
                conflicts.append(
                    {**conflict.model_dump(mode="json", by_alias=True), "quarantine_key": info.key}
                )
        except (StoreError, StoreConfigError) as exc:
            log.warning("conflicts_listing_failed", error=str(exc))
            return error_response(
                503, "store_unavailable", {"Retry-After": str(self.retry_after_s)}
            )
        return web.json_response({"conflicts": conflicts, "truncated": truncated})


def conflict_filters(query: Mapping[str, Sequence[str]]) -> tuple[str | None, int | None, int]:
    """``(agent_id, since_ns, limit)`` of a request's parameters (name → every value);
    `QueryError` naming the parameter otherwise (`collector.params`)."""
    check_names(query, PARAMS)
    agent_id = one(query, "agent_id")
    if agent_id is not None:
        text("agent_id", agent_id, low=1, high=MAX_AGENT_ID_BYTES)
    since = one(query, "since")
    since_ns = unix_ns_or_rfc3339("since", since) if since is not None else None
    limit = one(query, "limit")
    return (
        agent_id,
        since_ns,
        integer("limit", limit, low=1, high=MAX_CONFLICTS_LIMIT) if limit is not None else 1000,
    )
