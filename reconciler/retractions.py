"""Retractions of phantom catalog rows (PROTOCOL §3.7): ``lm-reconciler retract KEY``.

A *phantom row* is a catalog row for a record the store does not hold (a collector's log
row for a manifest that was never created, or a record an operator deleted): the full
audit reports it as a ``phantom-row`` problem, and the GC deletes nothing while one is
open (PROTOCOL §3.5 rule 5). It closes when a later audit lists the key, or when an
operator *retracts* the row, having looked into it.

A retraction is a small record at ``reconciler/v1/retractions/<sha256 of key>.json``
(`protocol.records.RetractionRecord`: the key, who — ``--by`` or the OS user — why, and
when), created with If-None-Match; the command then removes the key's ``phantom-row``
problem. It needs no lease: it writes no catalog file. Retracting is refused while the
store holds the record (a HEAD finds it): that row is no phantom, and the audit
supersedes it if it differs.

The lease holder does the rest (PROTOCOL §3.7). Its next listing audit finds the key a
phantom candidate with a retraction and writes a ``retracted`` row — a copy of the row
that counts, in every hour where the key has a row
(`reconciler.audit.records_act.retraction_rows`), in the audit's own files — so the key
counts as absent everywhere: hour totals and the rollup planner count only accepted rows,
the live query likewise, and the audit's joins take it for not cataloged (no phantom; a
record listed later is read and cataloged again, superseding it). The steady pass reads
back every log row of a retracted key before it counts (`RetractedKeys`): only a record
the store returns supersedes the ``retracted`` row. The rollup then removes a batch it
had included (PROTOCOL §3.7; `rollup`). The GC's references are untouched: a retracted
row still keeps its blob, which is safe.
"""

from __future__ import annotations

import getpass
import os

from protocol import keys
from protocol.clock import Clock
from protocol.records import RecordError, RetractionRecord
from store.base import ObjectStore
from store.errors import NotFound, PreconditionFailed


class RetractRefused(RuntimeError):
    """The key cannot be retracted: the store holds the record."""


def operator_name() -> str:
    """Who runs the command: the OS user (``LOGNAME``/``USER``), else ``unknown``."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return os.environ.get("USER", "unknown")


def check_record_key(key: str) -> None:
    """`ValueError` unless ``key`` is a manifest or quarantine record key."""
    try:
        if key.startswith(keys.QUARANTINE_PREFIX):
            keys.parse_quarantine_key(key)
        else:
            keys.parse_accepted_manifest_key(key)
    except keys.KeyFormatError as exc:
        raise ValueError(f"not an accepted manifest or quarantine record key: {exc}") from None


async def retract(
    store: ObjectStore, clock: Clock, key: str, *, reason: str, by: str
) -> tuple[RetractionRecord, bool]:
    """Retract the catalog row of ``key`` and close its ``phantom-row`` problem. Returns
    the retraction and whether this call created it (``False``: it existed already, and
    the stored one is returned). Raises `RetractRefused`, `ValueError` (not a record key,
    an empty reason or name), store errors."""
    check_record_key(key)
    if not reason.strip() or not by.strip():
        raise ValueError("a retraction needs a reason (--reason) and a name (--by)")
    record = RetractionRecord(
        key=key,
        by=by.strip()[:256],
        reason=reason.strip()[:4096],
        retracted_at_unix_ns=clock.now_ns(),
    )
    try:
        await store.head(key)
    except NotFound:
        pass
    else:
        raise RetractRefused(
            f"the store holds {key!r}: its catalog row is no phantom (the next audit "
            f"supersedes it if it differs)"
        )
    created = True
    try:
        await store.put(keys.retraction_key(key), record.to_json(), if_none_match=True)
    except PreconditionFailed:
        body, _etag = await store.get(keys.retraction_key(key))
        record, created = RetractionRecord.from_json(body), False
    await store.delete(keys.problem_key("phantom-row", key))
    return record, created


async def retracted_keys(store: ObjectStore) -> set[str]:
    """The keys of every retraction (retractions are few: each is an operator's act)."""
    found: set[str] = set()
    async for info in store.list(keys.RECONCILER_RETRACTIONS_PREFIX):
        try:
            body, _etag = await store.get(info.key)
            found.add(RetractionRecord.from_json(body).key)
        except (NotFound, RecordError):
            continue
    return found


RETRACTIONS_REFRESH_S = 60.0


class RetractedKeys:
    """The retracted keys as the steady pass needs them (PROTOCOL §3.7: after a
    retraction, a log row of the key is read back before it counts), listed at most every
    `RETRACTIONS_REFRESH_S`: one LIST of a prefix of a few objects per interval, not per
    pass. A retraction made meanwhile is honoured from the next listing; a row of the key
    cataloged before that outranks the ``retracted`` row, and the next audit, finding the
    key a phantom again, writes another one."""

    def __init__(self, store: ObjectStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._keys: frozenset[str] = frozenset()
        self._listed_at: float | None = None

    async def current(self) -> frozenset[str]:
        now = self._clock.monotonic()
        if self._listed_at is None or now - self._listed_at >= RETRACTIONS_REFRESH_S:
            self._keys = frozenset(await retracted_keys(self._store))
            self._listed_at = now
        return self._keys
