"""The conditional-write probe (PROTOCOL §3.6): is this store a valid acceptance authority?

Creates a unique key twice with If-None-Match and requires the second create to be refused
(412); the first create is the call every raw object is written with (one conditional
PutObject, `ObjectStore.put`) with the body size of the largest raw object the collector
writes (PROTOCOL §3.10: ``ingest.max_frame_bytes``, or with bundles the largest bundle),
so a store whose single-PUT limit is lower is refused before serving; also requires an If-Match with a wrong ETag to be refused. A store that accepts
either is not an acceptance authority: two collectors could both "create" one manifest.
Then `store.etag_check`: a store whose LIST misses a completed PUT is refused; one whose
ETags differ between PUT, HEAD and LIST is reported (the reconciler reads back every
record there).
Transient store errors are retried (bounded): every step is a create of a fresh unique key
or a read-only check, so repeating it cannot change what the probe concludes.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from config import Settings
from protocol import keys
from protocol.clock import Clock, SystemClock
from store.base import ObjectStore
from store.errors import (
    ConditionConflict,
    PreconditionFailed,
    StoreConfigError,
    StoreError,
    Unavailable,
)
from store.etag_check import check_etags
from store.retry import Backoff


class ProbeFailed(Exception):
    """The store ignores conditional writes; refuse to serve on it."""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    store_url: str
    probe_key: str
    ok: bool
    detail: str


async def probe_conditional_writes(
    store: ObjectStore,
    *,
    collector_id: str,
    clock: Clock,
    rng: random.Random | None = None,
    backoff: Backoff = Backoff(attempts=10, base_s=0.2, cap_s=3.0),  # noqa: B008 - frozen value
    body_bytes: int = 0,
) -> ProbeResult:
    """Run the probe; raise `ProbeFailed` if conditions are ignored, `StoreError` if the store
    did not answer within the backoff (10 tries, about 20 s: a collector restarted during a
    short outage waits it out rather than exit).

    Retried: `Unavailable` (5xx, timeouts, lost answers) and `ConditionConflict` (409: a
    conditional write in progress). Repeating is safe: every attempt creates a fresh key
    of its own, and a probe object an attempt left behind is harmless."""
    rng = rng or random.Random()
    delays = backoff.delays(rng)
    while True:
        try:
            return await _probe_once(store, collector_id, clock, body_bytes)
        except (Unavailable, ConditionConflict):
            delay = next(delays, None)
            if delay is None:
                raise
            await clock.sleep(delay)


async def _probe_once(
    store: ObjectStore, collector_id: str, clock: Clock, body_bytes: int
) -> ProbeResult:
    safe_id = "".join(c if c.isalnum() or c in "._-" else "_" for c in collector_id)[:64]
    key = keys.probe_key(f"{safe_id}-{clock.now_ns()}-{uuid.uuid4().hex}")
    body = f'{{"probe": "{collector_id}"}}'.encode()
    body += b" " * max(0, body_bytes - len(body))  # still JSON: trailing whitespace
    try:
        etag = await store.put(key, body, if_none_match=True)
    except StoreConfigError as exc:
        raise ProbeFailed(
            f"{store.url}: a conditional PutObject of {len(body)} bytes (the largest raw "
            f"object these settings write, PROTOCOL §3.10) was refused: {exc}"
        ) from None
    del body
    try:
        try:
            await store.put(key, b'{"probe": "second"}', if_none_match=True)
        except PreconditionFailed:
            pass
        else:
            raise ProbeFailed(
                f"{store.url}: a second If-None-Match create of {key!r} succeeded; this store "
                "ignores conditional writes and cannot be an acceptance authority "
                "(use S3 or an S3-compatible server with conditional writes, or file://)"
            )
        wrong = (
            '"0000000000000000-lightmetrics-probe"'
            if etag != '"0000000000000000-lightmetrics-probe"'
            else '"x"'
        )
        try:
            await store.put(key, b'{"probe": "third"}', if_match=wrong)
        except PreconditionFailed:
            pass
        else:
            raise ProbeFailed(
                f"{store.url}: an If-Match with a wrong ETag on {key!r} succeeded; "
                "this store ignores conditional writes"
            )
    finally:
        try:
            await store.delete(key)
        except StoreError:
            pass  # a leftover probe key is harmless
    etags = await check_etags(store, f"{keys.PROBE_PREFIX}{safe_id}-")
    if not etags.listed:
        raise ProbeFailed(
            f"{store.url}: {etags.detail}; a store whose LIST misses a completed PUT cannot "
            "be audited (PROTOCOL §3.6)"
        )
    detail = "If-None-Match and If-Match are enforced"
    if not etags.agree:
        detail += f"; {etags.detail}: the reconciler will read back every record"
    return ProbeResult(store.url, key, True, detail)


async def probe_for(store: ObjectStore, settings: Settings) -> ProbeResult:
    """The probe as a collector with ``settings`` runs it: its id, and a first create of
    the largest raw object it writes (``ingest.largest_raw_object_bytes``)."""
    return await probe_conditional_writes(
        store,
        collector_id=settings.ingest.collector_id,
        clock=SystemClock(),
        body_bytes=settings.ingest.largest_raw_object_bytes(),
    )
