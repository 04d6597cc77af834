"""``GET /v1/conflicts`` (admin token): the quarantine records, a bounded page at a time
(PROTOCOL §2, §3.3).

The records are read from the store's ``quarantine/v1/identity-conflict/`` prefix (with
``agent_id``, under both of that agent's key forms, `keys.quarantine_agent_prefixes`),
not from the reconciler's catalog: a conflict is listed as soon as its record exists. A
request reads (GETs) at most ``limit`` records (1..10000, default 1000), in key order,
whatever its filters: the records ``since`` leaves out count against that budget, so a
page may hold fewer than ``limit`` conflicts, even none, and still go on. The answer is
``{"conflicts", "next", "truncated"}``: ``next`` is the key of the last record read when
more records follow (else ``null``), and passing it back as ``after`` (with the same
filters) lists the next page, resuming after that key (S3's StartAfter); ``truncated``
is ``next is not null``. A walk by ``next`` reads every record that exists throughout
it exactly once; one created during the walk is listed when the walk has not yet passed
its place. A key under the prefix that is not a quarantine key is logged and skipped,
never read (and never a ``next``, which the next request checks as a quarantine key).

Optional filters ``agent_id``, ``since`` (unix ns or RFC 3339 with a timezone). A bad or
unknown parameter, or one given twice, is 400 ``{"error": "invalid_query", "param",
"detail"}`` (`collector.params`): an ``agent_id`` that is not 1..128 bytes of UTF-8
without control characters (a lone surrogate included), a ``since`` that is neither
ASCII digits nor RFC 3339 with an offset, a ``limit`` that is not ASCII digits in range,
an ``after`` that is not a quarantine key under the prefixes listed (another agent's,
when ``agent_id`` is given). A store that fails is 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import structlog
from aiohttp import web

from protocol import keys, records
from protocol.batch_api import STORE_UNAVAILABLE
from protocol.frame import MAX_AGENT_ID_BYTES
from store.base import ObjectStore, list_prefixes
from store.errors import StoreConfigError, StoreError

from .auth import Authenticator
from .intake import authorize, error_response
from .params import QueryError, check_names, integer, invalid, one, quoted, text, unix_ns_or_rfc3339

log = structlog.get_logger("collector.http")

MAX_CONFLICTS_LIMIT = 10_000
DEFAULT_CONFLICTS_LIMIT = 1000
PARAMS = frozenset({"agent_id", "since", "limit", "after"})
READ_CONCURRENCY = 16
"""GETs of one page in flight at once: a page of 1,000 records at 20 ms a request took
1.54 s against 24.0 s one after another (`bench.conflicts_page`, bench/RESULTS.md)."""


class ConflictQuery(NamedTuple):
    """A checked ``GET /v1/conflicts`` request."""

    agent_id: str | None
    since_ns: int | None
    limit: int
    after: str | None
    """The quarantine key the page resumes after (a previous page's ``next``)."""


@dataclass(frozen=True)
class ConflictsPage:
    conflicts: list[dict[str, Any]]
    """The records read that pass ``since``, as JSON, each with its ``quarantine_key``."""
    next: str | None
    """The last key read when more records follow, else ``None``."""


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
            query = conflict_filters({name: request.query.getall(name) for name in request.query})
        except QueryError as exc:
            return web.json_response(exc.body(), status=exc.status)
        try:
            page = await read_conflicts_page(self.store, query)
        except (StoreError, StoreConfigError) as exc:
            log.warning("conflicts_listing_failed", error=str(exc))
            return error_response(503, STORE_UNAVAILABLE, {"Retry-After": str(self.retry_after_s)})
        return web.json_response(
            {"conflicts": page.conflicts, "next": page.next, "truncated": page.next is not None}
        )


def quarantine_prefixes(agent_id: str | None) -> list[str]:
    """What a query lists: every quarantine record, or one agent's under both key forms
    (PROTOCOL §3: a store written before the segment rule may hold a long agent's
    records under the hex form)."""
    if agent_id is None:
        return [keys.QUARANTINE_PREFIX]
    return keys.quarantine_agent_prefixes(agent_id)


def is_quarantine_key(key: str) -> bool:
    try:
        keys.parse_quarantine_key(key)
    except keys.KeyFormatError:
        return False
    return True


async def read_conflicts_page(store: ObjectStore, query: ConflictQuery) -> ConflictsPage:
    """One page of ``query``: at most ``query.limit`` GETs, after ``query.after``, up to
    `READ_CONCURRENCY` at once; the page is in key order whatever order they finish in.

    A record that does not parse is logged and skipped (it was read: it counts). After
    the last key of the page the listing goes on only to the next quarantine key, to
    tell whether there is a next page (no GET). Raises the store's errors."""
    page, more = await _page_keys(store, query)
    conflicts: list[dict[str, Any]] = []
    for key, body in zip(page, await _read_all(store, page), strict=True):
        try:
            conflict = records.IdentityConflict.from_json(body)
        except records.RecordError as exc:
            log.warning("quarantine_record_unreadable", key=key, error=str(exc))
            continue
        if query.since_ns is not None and conflict.observed_at_unix_ns < query.since_ns:
            continue
        conflicts.append({**conflict.model_dump(mode="json", by_alias=True), "quarantine_key": key})
    return ConflictsPage(conflicts, page[-1] if more else None)


async def _page_keys(store: ObjectStore, query: ConflictQuery) -> tuple[list[str], bool]:
    """The page's quarantine keys, and whether another one follows them."""
    page: list[str] = []
    listing = list_prefixes(store, quarantine_prefixes(query.agent_id), start_after=query.after)
    try:
        async for info in listing:
            if not is_quarantine_key(info.key):
                log.warning("quarantine_key_malformed", key=info.key)
                continue
            if len(page) == query.limit:
                return page, True
            page.append(info.key)
    finally:
        await listing.aclose()
    return page, False


async def _read_all(store: ObjectStore, page: list[str]) -> list[bytes]:
    """Every key's body, in ``page`` order, by `READ_CONCURRENCY` readers; the first
    failure cancels the rest and is raised."""
    bodies: list[bytes] = [b""] * len(page)
    turns = iter(range(len(page)))  # shared: each index is taken by one reader

    async def reader() -> None:
        for index in turns:
            bodies[index], _etag = await store.get(page[index])

    try:
        async with asyncio.TaskGroup() as readers:
            for _ in range(min(READ_CONCURRENCY, len(page))):
                readers.create_task(reader())
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return bodies


def conflict_filters(query: Mapping[str, Sequence[str]]) -> ConflictQuery:
    """The checked parameters of a request (name → every value); `QueryError` naming the
    parameter otherwise (`collector.params`)."""
    check_names(query, PARAMS)
    agent_id = one(query, "agent_id")
    if agent_id is not None:
        text("agent_id", agent_id, low=1, high=MAX_AGENT_ID_BYTES)
    since = one(query, "since")
    since_ns = unix_ns_or_rfc3339("since", since) if since is not None else None
    limit = one(query, "limit")
    page_size = (
        integer("limit", limit, low=1, high=MAX_CONFLICTS_LIMIT)
        if limit is not None
        else DEFAULT_CONFLICTS_LIMIT
    )
    after = one(query, "after")
    if after is not None:
        resume_key(after, quarantine_prefixes(agent_id))
    return ConflictQuery(agent_id, since_ns, page_size, after)


def resume_key(after: str, prefixes: Sequence[str]) -> str:
    """``after`` if it is a quarantine key under one of ``prefixes``: it is network input,
    and the listing starts from it."""
    if not is_quarantine_key(after):
        raise invalid("after", f"not a quarantine key (a page's next): {quoted(after)}")
    if not any(after.startswith(prefix) for prefix in prefixes):
        raise invalid("after", f"{quoted(after)} is not a key of the agent_id given")
    return after
