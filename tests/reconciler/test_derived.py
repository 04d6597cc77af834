"""`protocol.derived` names exactly the keys the collector writes (PROTOCOL §3.2)."""

from __future__ import annotations

import hashlib
import random
import uuid
from dataclasses import dataclass

from collector.accept import Accepted, BatchAcceptor, IdentityConflictFound
from collector.derived import DerivedWriter
from protocol import derived, keys
from protocol.clock import ManualClock
from protocol.records import AcceptedManifest, IdentityConflict, IndexEntry
from store.memory import MemoryStore
from tests.reconciler.conftest import derived_keys_in

BOOT = uuid.UUID("5f0c7a3e-1d2b-4c3a-9e8f-0123456789ab")


@dataclass(frozen=True)
class Header:
    agent_id: str = "agent-a"
    boot_id: uuid.UUID = BOOT
    seq_start: int = 10
    seq_end: int = 12
    record_count: int = 3


async def test_derived_entries_are_the_keys_the_collector_writes() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    writer = DerivedWriter(store=store, clock=clock, rng=random.Random(1))
    writer.start()
    acceptor = BatchAcceptor(
        store=store, collector_id="c-1", clock=clock, rng=random.Random(2), derived=writer
    )
    first, second = b"LMB1-frame-one" * 5, b"LMB1-frame-two" * 5
    accepted = await acceptor.accept(Header(), first, hashlib.sha256(first).hexdigest())
    conflict = await acceptor.accept(Header(), second, hashlib.sha256(second).hexdigest())
    await writer.stop(5.0)
    assert isinstance(accepted, Accepted) and isinstance(conflict, IdentityConflictFound)

    manifest = AcceptedManifest.from_json((await store.get(accepted.manifest.manifest_key))[0])
    quarantine = IdentityConflict.from_json((await store.get(conflict.quarantine_key))[0])
    expected = {
        *(e.key for e in derived.manifest_backfill(manifest)),
        *(e.key for e in derived.quarantine_entries(quarantine)),
        # The collector indexes the conflicting blob when it creates it (same hour here).
        derived.raw_blob_by_time_entry(quarantine.submitted_frame_sha256, clock.now_ns()).key,
    }
    assert await derived_keys_in(store) == expected
    assert {e.key for e in derived.quarantine_backfill(quarantine)} <= expected
    for entry in derived.manifest_backfill(manifest):
        stored = IndexEntry.from_json((await store.get(entry.key))[0])
        ours = IndexEntry.from_json(entry.body)
        assert (stored.kind, stored.source_key, stored.frame_sha256) == (
            ours.kind,
            ours.source_key,
            ours.frame_sha256,
        )


def test_by_time_entries_carry_their_hour() -> None:
    sha = "ab" * 32
    entry = derived.raw_blob_by_time_entry(sha, 1_760_000_000_000_000_000)
    assert entry.hour == keys.UtcHour.from_unix_ns(1_760_000_000_000_000_000)
    assert entry.key == keys.raw_blob_by_time_key(entry.hour, sha)
