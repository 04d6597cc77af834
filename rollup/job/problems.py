"""Problem records a rollup run writes for batches it cannot read (PROTOCOL §3.5 problem
records: created once, ``last_seen`` moved on each sighting)."""

from __future__ import annotations

from typing import Any

import structlog

from protocol import keys
from protocol.clock import Clock
from protocol.records import ProblemRecord, RecordError
from store.base import ObjectStore
from store.errors import PreconditionFailed, StoreError

log = structlog.get_logger(__name__)


async def record_problem(
    store: ObjectStore, clock: Clock, kind: str, subject: str, detail: str
) -> None:
    """Create the problem record, or move an existing one's ``last_seen`` (If-Match).
    Best effort: a store error is logged, and the next run finds the frame bad again."""
    key = keys.problem_key(kind, subject)
    now = clock.now_ns()
    record = ProblemRecord(
        kind=kind, subject_key=subject, detail=detail, first_seen_unix_ns=now, last_seen_unix_ns=now
    )
    try:
        try:
            await store.put(key, record.to_json(), if_none_match=True)
            return
        except PreconditionFailed:
            pass
        body, etag = await store.get(key)
        try:
            first_seen = ProblemRecord.from_json(body).first_seen_unix_ns
        except RecordError:
            first_seen = now
        updated = record.model_copy(update={"first_seen_unix_ns": first_seen})
        await store.put(key, updated.to_json(), if_match=etag)
    except StoreError as exc:
        log.warning("rollup_problem_record_failed", key=key, error=str(exc))


async def record_problems(store: ObjectStore, clock: Clock, problems: list[dict[str, Any]]) -> None:
    """One problem record per (kind, subject) of a run's ``problems`` (each logged),
    created or its ``last_seen`` moved on. A kind `protocol.keys.PROBLEM_KINDS` does not
    know yet (``overlapping-identity``) is logged and reported in the run's summary only."""
    seen: set[tuple[str, str]] = set()
    for problem in problems:
        kind, subject = problem["kind"], problem["subject_key"]
        log.warning("rollup_bad_frame", **problem)
        if (kind, subject) in seen or kind not in keys.PROBLEM_KINDS:
            continue
        seen.add((kind, subject))
        await record_problem(store, clock, kind, subject, problem["detail"])
