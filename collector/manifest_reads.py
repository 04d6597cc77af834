"""Reading an accepted manifest inside an acceptance request (PROTOCOL §3.2): once, for a
re-send (`manifest_if_readable`), or until answered, after a 412 on its create
(`read_manifest`). A manifest that is there but not a manifest is never answered as
anything: it is logged (``accepted_manifest_unreadable``) and the request ends 503."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import structlog

from protocol import keys, records
from store.base import ObjectStore
from store.errors import ConditionConflict, NotFound, Unavailable

from .store_calls import BudgetedRequest, BudgetExhausted

log = structlog.get_logger("collector.accept")


@dataclass(frozen=True, slots=True)
class StoredManifest:
    """A manifest this request read: its record, where it is stored, and its ETag."""

    manifest: records.AcceptedManifest
    key: str
    etag: str


def _parsed(body: bytes, key: str, etag: str) -> StoredManifest:
    try:
        return StoredManifest(
            records.AcceptedManifest.from_json(body, reads_bundles=True), key, etag
        )
    except records.RecordError as exc:
        log.error("accepted_manifest_unreadable", key=key, error=str(exc))
        raise BudgetExhausted from None


async def manifest_if_readable(
    request: BudgetedRequest, store: ObjectStore, identity: keys.BatchIdentity
) -> StoredManifest | None:
    """One GET of the accepted manifest; None when absent or unanswered (the normal steps
    then decide the same way)."""
    key = keys.accepted_manifest_key(identity)
    try:
        body, etag = await request.call("get_manifest", key, lambda: store.get(key))
    except (NotFound, Unavailable, ConditionConflict):
        return None
    return _parsed(body, key, etag)


async def read_manifest(
    request: BudgetedRequest,
    store: ObjectStore,
    key: str,
    delays: Iterator[float],
    *,
    absent_ok: bool = False,
) -> tuple[bytes, StoredManifest] | None:
    """The manifest at ``key``; ``None`` when absent (after a pause unless ``absent_ok``:
    a 412 then 404 is worth a moment before asking again). Bounded by the request's
    budget; repeating is safe: a read."""
    while True:
        try:
            body, etag = await request.call("get_manifest", key, lambda: store.get(key))
        except NotFound:
            if not absent_ok:
                await request.pause(delays)
            return None
        except (Unavailable, ConditionConflict):
            await request.pause(delays)
            continue
        return body, _parsed(body, key, etag)
