"""``GET /v1/conflicts`` (admin token): the quarantine records (PROTOCOL §2, §3.3).

Optional filters ``agent_id``, ``since`` (unix ns or RFC 3339 with a timezone) and
``limit`` (1..10000, default 1000; ``truncated`` says when more matched).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import structlog
from aiohttp import web

from protocol import keys, records
from store.base import ObjectStore, list_prefixes
from store.errors import StoreConfigError, StoreError

from .auth import Authenticator
from .intake import error_response, unauthenticated

log = structlog.get_logger("collector.http")

MAX_CONFLICTS_LIMIT = 10_000


class ConflictsEndpoint:
    def __init__(
        self, *, authenticator: Authenticator, store: ObjectStore, retry_after_s: int
    ) -> None:
        self.authenticator = authenticator
        self.store = store
        self.retry_after_s = retry_after_s

    async def get_conflicts(self, request: web.Request) -> web.Response:
        principal = self.authenticator.authenticate(request.headers.get("Authorization"))
        if principal is None:
            return unauthenticated()
        if not principal.admin:
            return error_response(
                403, "forbidden", detail=f"principal {principal.name!r} is not an admin"
            )
        try:
            agent_id, since_ns, limit = _conflict_filters(request.query)
        except ValueError as exc:
            return error_response(400, "invalid_query", detail=str(exc))
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


def _conflict_filters(query: Any) -> tuple[str | None, int | None, int]:
    agent_id = query.get("agent_id")
    if agent_id is not None and not 1 <= len(agent_id.encode("utf-8")) <= 128:
        raise ValueError("agent_id must be 1..128 UTF-8 bytes")
    since_ns: int | None = None
    since = query.get("since")
    if since is not None:
        if since.isdigit():
            since_ns = int(since)
        else:
            try:
                moment = datetime.fromisoformat(since.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(
                    f"since must be unix nanoseconds or RFC 3339, got {since!r}"
                ) from None
            if moment.tzinfo is None:
                raise ValueError(f"since needs a timezone (e.g. Z), got {since!r}")
            since_ns = int(moment.timestamp() * 1_000_000_000)
    limit_text = query.get("limit", "1000")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_CONFLICTS_LIMIT:
        raise ValueError(f"limit must be 1..{MAX_CONFLICTS_LIMIT}, got {limit_text!r}")
    return agent_id, since_ns, int(limit_text)
