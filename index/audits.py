"""Reading the audit records (``reconciler/v1/audits/<start>-<id>.json``, PROTOCOL §3.7):
which exist, each one, newest first, and the hours a completed listing audit seals. The
reconciler writes them (`reconciler.audit.records`); the reconciler, the GC and the live
query's coverage (`collector.query.coverage`) read them here."""

from __future__ import annotations

from collections.abc import AsyncIterator

from protocol import keys
from protocol.records import AuditRecord, RecordError
from store.base import ObjectStore
from store.errors import NotFound


async def audit_keys(store: ObjectStore) -> list[str]:
    """Every audit record key, oldest first (keys only: audits are few).

    Only the ``.json`` records directly under the prefix: each audit's folder of working
    files (`keys.audit_folder`, its listing parts) is skipped by starting a new listing
    after it, so finding the audits costs one short listing per folder, not the parts."""
    found: list[str] = []
    cursor: str | None = None
    while True:
        folder = None
        async for info in store.list(keys.RECONCILER_AUDITS_PREFIX, cursor):
            rest = info.key.removeprefix(keys.RECONCILER_AUDITS_PREFIX)
            if "/" in rest:
                folder = rest[: rest.index("/")]
                break
            if rest.endswith(".json"):
                found.append(info.key)
        if folder is None:
            return found
        # '0' follows '/': everything inside the folder sorts before this bound.
        cursor = f"{keys.RECONCILER_AUDITS_PREFIX}{folder}0"


async def read_audit(store: ObjectStore, key: str) -> AuditRecord | None:
    """The record at ``key``; ``None`` when absent or unreadable."""
    try:
        body, _etag = await store.get(key)
        return AuditRecord.from_json(body)
    except (NotFound, RecordError):
        return None


async def iter_audits_newest_first(store: ObjectStore) -> AsyncIterator[AuditRecord]:
    for key in reversed(await audit_keys(store)):
        record = await read_audit(store, key)
        if record is not None:
            yield record


def sealed_limit_ns(audit_started_ns: int | None, margin_ns: int) -> int:
    """Start of the first accepted hour a completed listing audit that started at
    ``audit_started_ns`` does not *seal*: an hour is sealed once such an audit started at
    least ``margin_ns`` (`config.Settings.settle_margin_s`) after it ended, so its catalog
    holds every batch accepted in it (PROTOCOL §3.7). 0 without such an audit."""
    if audit_started_ns is None:
        return 0
    return keys.UtcHour.from_unix_ns(max(0, audit_started_ns - margin_ns)).start_ns
