"""`bench.steady_lag`'s load: a synthetic index log written as collectors write it.

One process plays ``--writers`` collectors (its share of them: ``--first-writer``), each
with a real `index.log_writer.IndexLogWriter` (``flush_max_age_s`` 1: about one segment
per writer per second, as deployed) over a `FileSystemStore`. For every batch it writes,
at ``--rate`` batches per second in total, what a collector's acknowledgement path leaves:

- the raw blob (a few bytes; the reconciler only hashes blobs, never decodes them) and
  the accepted manifest, as files in the store's layout, each written to the store's own
  temp directory and renamed into place (atomic, like the store's own create) but **not
  fsync'd**: 10,000 fsync'd creates a second would measure the disk, not the reconciler.
  The manifest's ETag is what the store reports for it (`store.memory.body_etag`: the
  quoted MD5 of the body), so attested rows carry the real ETag;
- a ``blob`` row and an ``accepted`` row (``own_create`` true with that ETag, the batch's
  point times), appended to the writer's `IndexLogWriter`; ``--read-fraction`` of the
  batches get ``own_create`` false instead (a duplicate or re-send: read back by the
  reconciler), as ~1 % of batches do.

Segments are created through the store (If-None-Match, fsync'd, as a collector does);
each one's key and the time its create returned are appended to ``--ledger`` (the
benchmark measures the catalog lag from it). Batches are generated on a 10 ms tick from
the time each writer is owed; a writer that falls more than one second behind drops
the excess (counted: the achieved rate is reported, never faked). At the end every
writer flushes, and one JSON line of totals is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import sys
import time
import uuid
from pathlib import Path

import uvloop

from index.log_writer import IndexLogWriter
from index.rows import IndexRow, accepted_row, blob_row
from protocol import keys
from protocol.clock import SystemClock
from protocol.records import AcceptedManifest
from store.fs import FileSystemStore
from store.memory import body_etag

TICK_S = 0.01
AGENTS = 1000
POINTS = 100  # per batch: seq_end - seq_start + 1


class LedgerStore(FileSystemStore):
    """A `FileSystemStore` that notes every log segment it created: ``key written_ns``."""

    def __init__(self, root: Path, ledger: Path) -> None:
        super().__init__(root)
        self._ledger = ledger.open("a", buffering=1)

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        etag = await super().put(key, body, if_none_match=if_none_match, if_match=if_match)
        if key.startswith(keys.INDEX_LOG_PREFIX):
            self._ledger.write(f"{key} {time.time_ns()}\n")
        return etag

    async def put_file(
        self, key: str, path: str, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        etag = await super().put_file(key, path, if_none_match=if_none_match, if_match=if_match)
        if key.startswith(keys.INDEX_LOG_PREFIX):
            self._ledger.write(f"{key} {time.time_ns()}\n")
        return etag


class Batches:
    """Fresh batches: blob and manifest files written, their log rows returned."""

    def __init__(self, root: Path, seed: int, read_fraction: float) -> None:
        self._root = str(root)
        self._tmp = os.path.join(self._root, ".lm-store", "tmp")
        self._rng = random.Random(seed)
        self._boots = [uuid.UUID(int=self._rng.getrandbits(128), version=4) for _ in range(AGENTS)]
        self._next_seq = [0] * AGENTS
        self._read_fraction = read_fraction
        self._count = 0
        self._salt = os.urandom(8).hex()
        self.made = 0
        sample = AcceptedManifest(
            agent_id="a",
            boot_id=str(self._boots[0]),
            seq_start=0,
            seq_end=POINTS - 1,
            record_count=POINTS,
            frame_sha256="0" * 64,
            frame_bytes=64,
            raw_blob_key=keys.raw_blob_key("0" * 64),
            accepted_at_unix_ns=0,
            collector_id="c",
        )
        self._template: dict[str, object] = json.loads(sample.to_json())  # the field order
        for agent, boot in enumerate(self._boots):  # before the clock: a mkdir is ~0.3 ms
            identity = keys.BatchIdentity(f"lag-agent-{agent:04d}", boot, 0, POINTS - 1)
            key = keys.accepted_manifest_key(identity)
            os.makedirs(os.path.dirname(os.path.join(self._root, key)), exist_ok=True)

    def _write(self, key: str, body: bytes) -> None:
        self._count += 1
        temporary = os.path.join(self._tmp, f"lag-{os.getpid()}-{self._count}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        path = os.path.join(self._root, key)
        try:
            os.rename(temporary, path)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.rename(temporary, path)

    def make(self, index: int, collector_id: str) -> tuple[IndexRow, IndexRow]:
        agent = index % AGENTS
        seq = self._next_seq[agent]
        self._next_seq[agent] = seq + POINTS
        agent_id = f"lag-agent-{agent:04d}"
        now = time.time_ns()
        blob = f"bench.steady_lag blob {self._salt} {agent_id} {seq:020d}".encode()
        sha = hashlib.sha256(blob).hexdigest()
        blob_key = keys.raw_blob_key(sha)
        boot_id = str(self._boots[agent])
        fields = dict(self._template)
        fields.update(
            agent_id=agent_id,
            boot_id=boot_id,
            seq_start=seq,
            seq_end=seq + POINTS - 1,
            record_count=POINTS,
            frame_sha256=sha,
            frame_bytes=len(blob),
            raw_blob_key=blob_key,
            accepted_at_unix_ns=now,
            collector_id=collector_id,
        )
        body = json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()
        identity = keys.BatchIdentity(agent_id, self._boots[agent], seq, seq + POINTS - 1)
        key = keys.accepted_manifest_key(identity)
        self._write(blob_key, blob)
        self._write(key, body)
        own = self._rng.random() >= self._read_fraction
        self.made += 1
        accepted = IndexRow(
            kind="accepted",
            key=key,
            frame_sha256=sha,
            time_unix_ns=now,
            raw_blob_key=blob_key,
            agent_id=agent_id,
            boot_id=boot_id,
            seq_start=seq,
            seq_end=seq + POINTS - 1,
            record_count=POINTS,
            frame_bytes=len(blob),
            etag=body_etag(body),
            own_create=own,
            min_ts_ns=now - 10 * keys.NS_PER_S,
            max_ts_ns=now - keys.NS_PER_S,
        )
        if self.made == 1:  # the hand-built record and row are exactly the collector's
            manifest = AcceptedManifest.from_json(body)
            assert manifest.to_json() == body, "manifest body differs from the record's JSON"
            assert manifest.manifest_key == key
            expected = accepted_row(
                manifest,
                etag=body_etag(body),
                own_create=own,
                ts_range=(accepted.min_ts_ns or 0, accepted.max_ts_ns or 0),
            )
            assert expected == accepted, f"{expected} != {accepted}"
        return blob_row(sha, now), accepted


async def run(args: argparse.Namespace) -> dict[str, object]:
    store = LedgerStore(args.root, args.ledger)
    clock = SystemClock()
    batches = Batches(args.root, args.seed + args.first_writer, args.read_fraction)
    ids = [f"lag-writer-{args.first_writer + i:02d}" for i in range(args.writers)]
    writers = [
        IndexLogWriter(
            store=store,
            clock=clock,
            rng=random.Random(args.seed + i),
            writer_id=writer_id,
            flush_rows=5_000,
            flush_max_age_s=1.0,
            max_buffered_rows=100_000,
        )
        for i, writer_id in enumerate(ids)
    ]
    for writer in writers:
        writer.start()
    per_writer = args.rate / args.total_writers
    owed = [random.Random(i).random() for i in range(len(writers))]  # staggered flushes
    dropped = 0.0
    index = args.first_writer
    started = last = time.monotonic()
    while (now := time.monotonic()) - started < args.duration_s:
        elapsed, last = now - last, now
        for w, writer in enumerate(writers):
            owed[w] += per_writer * elapsed
            if owed[w] > per_writer:  # more than one second behind: drop, counted
                dropped += owed[w] - per_writer
                owed[w] = per_writer
            for _ in range(int(owed[w])):
                blob, accepted = batches.make(index, ids[w])
                index += 1
                writer.append(blob)
                writer.append(accepted)
            owed[w] -= int(owed[w])
        await asyncio.sleep(max(0.0, TICK_S - (time.monotonic() - now)))
    seconds = time.monotonic() - started
    for writer in writers:
        # flush first: it waits for a flush in flight, which stop() would cancel mid-PUT
        # (the segment may land with its rows counted nowhere)
        await writer.flush()
        await writer.stop(30.0)
    return {
        "done": True,
        "batches": batches.made,
        "seconds": seconds,
        "rate": batches.made / seconds,
        "dropped_batches": int(dropped),
        "segments": sum(w.stats.segments_written for w in writers),
        "rows_written": sum(w.stats.rows_written for w in writers),
        "rows_lost": sum(w.stats.dropped_full + w.stats.dropped_failed for w in writers),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.steady_lag_writer")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--ledger", type=Path, required=True)
    parser.add_argument("--rate", type=float, required=True, help="batches/s, all writers")
    parser.add_argument("--writers", type=int, required=True, help="writers in this process")
    parser.add_argument("--total-writers", type=int, required=True)
    parser.add_argument("--first-writer", type=int, default=0)
    parser.add_argument("--duration-s", type=float, required=True)
    parser.add_argument("--read-fraction", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=22)
    args = parser.parse_args(argv)
    totals = uvloop.run(run(args))
    print(json.dumps(totals), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
