"""The GC log (PROTOCOL §3.5): one Parquet file per GC run that deleted anything.

``gc/v1/log/date=YYYY-MM-DD/hour=HH/<run-start-ns:020d>-<epoch>.parquet``
(`keys.gc_log_key`), one row per blob the run deleted or found gone under a ``deleting``
mark it settled (`records.GcLogEntry`: the hash and key, the blob's LastModified, when
it was marked, the start of the audit the proof rested on, when it was deleted, the run
that marked it, the reason). `RunLog` collects a run's rows together with the marks
they free; `RunLog.write` creates the file (If-None-Match, bounded retries) and only
then may the run remove those marks: a crash loses no record of a deletion (a mark left
``deleting`` is settled by a later run, which finds the blob gone and logs it then). A
run that deleted nothing writes no file, so the log grows with deletions, not with runs.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from protocol import keys, records
from protocol.clock import Clock
from store.base import ObjectStore
from store.errors import ConditionConflict, NotFound, PreconditionFailed, Unavailable
from store.retry import Backoff

GC_LOG_SCHEMA = pa.schema(
    [
        ("frame_sha256", pa.string()),
        ("raw_blob_key", pa.string()),
        ("blob_last_modified_ns", pa.int64()),
        ("marked_at_unix_ns", pa.int64()),
        ("audit_started_at_unix_ns", pa.int64()),
        ("deleted_at_unix_ns", pa.int64()),
        ("gc_run_id", pa.string()),
        ("reason", pa.string()),
    ]
)
WRITE_BACKOFF = Backoff(attempts=5, base_s=0.05, cap_s=1.0)
MAX_NAME_COLLISIONS = 100


class GcLogError(ValueError):
    """A GC log file that does not decode."""


def encode_gc_log(entries: list[records.GcLogEntry]) -> bytes:
    rows = [entry.model_dump(exclude={"schema_"}) for entry in entries]
    table = pa.Table.from_pylist(rows, schema=GC_LOG_SCHEMA)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def decode_gc_log(body: bytes, *, key: str = "<gc log>") -> list[records.GcLogEntry]:
    try:
        rows = pq.read_table(io.BytesIO(body)).select(GC_LOG_SCHEMA.names).to_pylist()
        return [records.GcLogEntry.model_validate(row) for row in rows]
    except (pa.ArrowException, OSError, KeyError, ValueError) as exc:
        raise GcLogError(f"{key}: unreadable GC log file: {exc}") from None


async def read_gc_log(store: ObjectStore) -> list[records.GcLogEntry]:
    """Every deletion the GC logged (readers: status, the chaos checks, tests)."""
    entries: list[records.GcLogEntry] = []
    async for info in store.list(keys.GC_LOG_PREFIX):
        body, _etag = await store.get(info.key)
        entries += decode_gc_log(body, key=info.key)
    return entries


@dataclass
class RunLog:
    """One run's deletions, and the marks (key, ETag) to remove once they are logged."""

    entries: list[records.GcLogEntry] = field(default_factory=list)
    marks: list[tuple[str, str | None]] = field(default_factory=list)
    """(key, ETag to remove it If unchanged; None: our own ``deleting`` mark, removed as
    it is — nobody else changes a mark in that state)."""
    unreadable_marks: set[str] = field(default_factory=set)
    """Of ``marks``, those that did not parse (their problem is resolved with them)."""

    def add(
        self,
        entry: records.GcLogEntry,
        mark_key: str,
        mark_etag: str | None,
        *,
        unreadable: bool = False,
    ) -> None:
        self.entries.append(entry)
        self.marks.append((mark_key, mark_etag))
        if unreadable:
            self.unreadable_marks.add(mark_key)

    async def write(
        self,
        store: ObjectStore,
        *,
        run_started_at_unix_ns: int,
        epoch: int,
        clock: Clock,
        rng: random.Random,
    ) -> str | None:
        """Create the run's log file (None when there is nothing to log); its key. A 412
        on a name holding our body is an earlier attempt of ours that landed; on another
        body (a run of the same epoch that started in the same nanosecond) the next
        nanosecond is tried. Raises the store's error when bounded retries did not settle
        it: the marks must then stay."""
        if not self.entries:
            return None
        started = run_started_at_unix_ns
        body = encode_gc_log(self.entries)
        delays = WRITE_BACKOFF.delays(rng)
        while True:
            key = keys.gc_log_key(started, epoch)
            try:
                await store.put(key, body, if_none_match=True)
                return key
            except PreconditionFailed:
                try:
                    stored, _etag = await store.get(key)
                except NotFound:
                    stored = b""
                if stored == body:
                    return key
                started += 1
                if started - run_started_at_unix_ns > MAX_NAME_COLLISIONS:
                    raise

            except (Unavailable, ConditionConflict):
                delay = next(delays, None)
                if delay is None:
                    raise
                await clock.sleep(delay)
