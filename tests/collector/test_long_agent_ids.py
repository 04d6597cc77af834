"""agent_ids up to the 128 bytes PROTOCOL §1 allows, end to end on the real stores.

Accepted by the collector's protocol, indexed, repaired by a steady pass, audited, and
planned by the rollup (PROTOCOL §3's segment rule: ``agent=h-<sha256>`` where the hex
would make a segment longer than 255 bytes). On the filesystem store, before the rule,
83-124 bytes lost their accepted-by-time entry (and the audit crashed) and 125-128 bytes
could not be accepted at all.
"""

from __future__ import annotations

import hashlib
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from collector.accept import Accepted, BatchAcceptor, IdentityConflictFound
from index.log_writer import IndexLogWriter
from protocol import keys, records
from protocol.clock import ManualClock
from reconciler.audit.run import run_full_audit
from reconciler.steady import SteadyScanner
from rollup.job.plan import make_plan
from rollup.read.verify import verify
from store.base import ObjectStore
from store.errors import NotFound
from store.fs import FileSystemStore
from store.memory import MemoryStore
from store.retry import Backoff
from store.s3 import S3Store
from tests.reconciler.conftest import catalog_keys, context
from tests.s3_servers import RunningServer, fresh_bucket

BOOT = uuid.UUID("5f0c7a3e-1d2b-4c3a-9e8f-0123456789ab")
LENGTHS = (83, 124, 125, 128)


@dataclass(frozen=True)
class Header:
    agent_id: str
    boot_id: uuid.UUID = BOOT
    seq_start: int = 10
    seq_end: int = 12
    record_count: int = 3

    @property
    def identity(self) -> keys.BatchIdentity:
        return keys.BatchIdentity(self.agent_id, self.boot_id, self.seq_start, self.seq_end)


def agent_of(length: int) -> str:
    return f"agent-{length}-".ljust(length, "x")


def frame_of(header: Header, variant: str = "") -> bytes:
    return f"frame of {header.agent_id} {variant}".encode() * 2


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(time.time_ns())  # S3 servers stamp LastModified with the real time


async def _open(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> ObjectStore:
    if kind == "fs":
        return FileSystemStore(tmp_path / "store", clock=clock)
    if kind == "memory":
        return MemoryStore(clock=clock)
    server: RunningServer = request.getfixturevalue("ministack_server")
    return S3Store(bucket=fresh_bucket(server), prefix="long", endpoint_url=server.endpoint_url)


@pytest.fixture(params=[pytest.param("fs"), pytest.param("ministack", marks=pytest.mark.s3)])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[ObjectStore]:
    opened = await _open(request.param, request, tmp_path, clock)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture(params=[pytest.param("memory"), pytest.param("ministack", marks=pytest.mark.s3)])
async def unlimited_store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[ObjectStore]:
    """A store with no segment limit: what a store written before the rule may hold."""
    opened = await _open(request.param, request, tmp_path, clock)
    try:
        yield opened
    finally:
        await opened.close()


class Collector:
    def __init__(self, store: ObjectStore, clock: ManualClock) -> None:
        self.index_log = IndexLogWriter(
            store=store, clock=clock, rng=random.Random(1), writer_id="collector-long"
        )
        self.acceptor = BatchAcceptor(
            store=store,
            collector_id="collector-long",
            clock=clock,
            rng=random.Random(2),
            index_log=self.index_log,
            budget_s=10.0,
            backoff=Backoff(attempts=4, base_s=0.001, cap_s=0.01),
        )

    async def accept(self, header: Header, frame: bytes) -> Accepted | IdentityConflictFound:
        return await self.acceptor.accept(header, frame, hashlib.sha256(frame).hexdigest())

    async def flush(self) -> None:
        await self.index_log.flush()
        assert self.index_log.buffered == 0 and self.index_log.stats.dropped_failed == 0


async def exists(store: ObjectStore, key: str) -> bool:
    try:
        await store.head(key)
    except NotFound:
        return False
    return True


async def test_long_agent_ids_are_accepted_indexed_audited_and_planned(
    store: ObjectStore, clock: ManualClock
) -> None:
    collector = Collector(store, clock)
    headers = [Header(agent_of(length)) for length in LENGTHS]
    manifests = []
    for header in headers:
        first = await collector.accept(header, frame_of(header))
        assert isinstance(first, Accepted) and not first.duplicate
        again = await collector.accept(header, frame_of(header))
        assert isinstance(again, Accepted) and again.duplicate
        conflict = await collector.accept(header, frame_of(header, "other"))
        assert isinstance(conflict, IdentityConflictFound)
        assert await exists(store, conflict.quarantine_key)
        manifests.append(first.manifest)
    await collector.flush()  # indexed: every row is in the log

    # The steady pass follows every log row (h- keys included) to its record and catalogs it.
    ctx = await context(store, clock)
    steady = await SteadyScanner(ctx).run_pass()
    assert steady.complete and steady.failed == 0 and steady.problems == 0
    assert steady.rows_cataloged == 2 * len(LENGTHS)  # the manifests and the quarantines
    assert {m.manifest_key for m in manifests} <= await catalog_keys(store)

    audit = await run_full_audit(ctx)
    assert audit.status == "completed"
    assert (audit.manifests_seen, audit.quarantines_seen, audit.problems) == (4, 4, 0)

    plan = await make_plan(store, None)
    assert sorted(plan.manifest_ids()) == sorted(h.identity.manifest_id for h in headers)
    report = await verify(store)
    assert report.unparseable_keys == 0
    assert sum(hour.accepted.batches for hour in report.hours) == len(LENGTHS)


async def test_a_manifest_under_the_long_form_counts_as_already_accepted(
    unlimited_store: ObjectStore, clock: ManualClock
) -> None:
    """A store written before the rule holds a 128-byte agent's batch under the long form
    (with its accepted-by-time entry under the long name): the h- writer finds it, the
    audit takes it as well-formed, and the rollup plans the batch once."""
    store = unlimited_store
    header = Header(agent_of(128))
    identity = header.identity
    frame = frame_of(header)
    sha = hashlib.sha256(frame).hexdigest()
    legacy_key = keys.legacy_accepted_manifest_key(identity)
    assert legacy_key is not None and legacy_key != keys.accepted_manifest_key(identity)
    manifest = records.AcceptedManifest(
        agent_id=identity.agent_id,
        boot_id=str(BOOT),
        seq_start=header.seq_start,
        seq_end=header.seq_end,
        record_count=header.record_count,
        frame_sha256=sha,
        frame_bytes=len(frame),
        raw_blob_key=keys.raw_blob_key(sha),
        accepted_at_unix_ns=clock.now_ns(),
        collector_id="collector-before-the-rule",
    )
    await store.put(keys.raw_blob_key(sha), frame, if_none_match=True)
    await store.put(legacy_key, manifest.to_json(), if_none_match=True)

    collector = Collector(store, clock)
    again = await collector.accept(header, frame)
    assert isinstance(again, Accepted) and again.duplicate
    conflict = await collector.accept(header, frame_of(header, "other"))
    assert isinstance(conflict, IdentityConflictFound)
    await collector.flush()
    assert not await exists(store, keys.accepted_manifest_key(identity))  # never twice
    recorded = records.IdentityConflict.from_json((await store.get(conflict.quarantine_key))[0])
    assert recorded.accepted_manifest_key == legacy_key

    ctx = await context(store, clock)
    await SteadyScanner(ctx).run_pass()  # the duplicate's row names the long form
    audit = await run_full_audit(ctx)
    assert audit.status == "completed"
    assert (audit.manifests_seen, audit.problems) == (1, 0)
    assert legacy_key in await catalog_keys(store)  # cataloged under the key it is stored at

    plan = await make_plan(store, None)  # one batch
    assert plan.manifest_ids() == [identity.manifest_id]
    report = await verify(store)
    assert [hour.accepted.batches for hour in report.hours] == [1]
    assert report.unparseable_keys == 0
