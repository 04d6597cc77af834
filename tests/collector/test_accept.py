"""Every branch of the acceptance protocol (PROTOCOL §3.2), driven by a fault-injecting store."""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from dataclasses import dataclass

import pytest

from chaos.faulty_store import Fault, FaultyStore
from collector.accept import AcceptanceUnavailable, Accepted, BatchAcceptor, IdentityConflictFound
from index.log_writer import IndexLogWriter
from index.row_checks import decode
from index.rows import IndexRow
from protocol import keys, records
from protocol.clock import ManualClock, SystemClock
from store.base import ObjectStore
from store.errors import NotFound
from store.memory import MemoryStore
from store.retry import Backoff
from tests.collector.conftest import logged_keys

BOOT = uuid.UUID("5f0c7a3e-1d2b-4c3a-9e8f-0123456789ab")


@dataclass(frozen=True)
class Header:
    agent_id: str = "agent-a"
    boot_id: uuid.UUID = BOOT
    seq_start: int = 10
    seq_end: int = 12
    record_count: int = 3


HEADER = Header()
IDENTITY = keys.BatchIdentity("agent-a", BOOT, 10, 12)
FRAME = b"LMB1-frame-bytes-one" * 4
OTHER = b"LMB1-frame-bytes-two" * 4
SHA = hashlib.sha256(FRAME).hexdigest()
OTHER_SHA = hashlib.sha256(OTHER).hexdigest()


class Harness:
    def __init__(
        self, store: ObjectStore, *, clock: object = None, budget_s: float = 5.0, queue: int = 100
    ) -> None:
        self.clock = clock or ManualClock()
        self.index_log = IndexLogWriter(
            store=store,  # type: ignore[arg-type]
            clock=self.clock,  # type: ignore[arg-type]
            rng=random.Random(1),
            writer_id="collector-t",
            flush_rows=queue,
            max_buffered_rows=queue,
        )
        self.ops: list[tuple[str, str]] = []
        self.acceptor = BatchAcceptor(
            store=store,
            collector_id="collector-t",
            clock=self.clock,  # type: ignore[arg-type]
            rng=random.Random(2),
            index_log=self.index_log,
            budget_s=budget_s,
            backoff=Backoff(attempts=6, base_s=0.001, cap_s=0.01),
            observe_store_op=lambda op, result: self.ops.append((op, result)),
        )

    async def accept(
        self, frame: bytes = FRAME, *, resend: bool = False
    ) -> Accepted | IdentityConflictFound:
        sha = hashlib.sha256(frame).hexdigest()
        return await self.acceptor.accept(HEADER, frame, sha, resend=resend)

    async def settle(self) -> set[str]:
        """Flush the index log; the keys its rows name so far."""
        await self.index_log.flush()
        assert self.index_log.buffered == 0
        return await logged_keys(self.index_log._store)


async def manifest_in(store: ObjectStore) -> records.AcceptedManifest:
    body, _ = await store.get(keys.accepted_manifest_key(IDENTITY))
    return records.AcceptedManifest.from_json(body)


async def test_new_batch_takes_exactly_two_store_ops_and_indexes_later() -> None:
    store = MemoryStore()
    harness = Harness(store)
    result = await harness.accept()
    assert isinstance(result, Accepted) and not result.duplicate
    assert result.store_ops == 2
    assert [op for op, _ in harness.ops] == ["put_raw_blob", "put_manifest"]
    assert (await store.get(keys.raw_blob_key(SHA)))[0] == FRAME
    manifest = await manifest_in(store)
    assert (
        manifest == result.manifest and manifest.frame_sha256 == SHA and manifest.record_count == 3
    )
    # index log rows are buffered, not written on the acknowledgement path
    assert [info.key async for info in store.list(keys.INDEX_LOG_PREFIX)] == []
    assert await harness.settle() == {keys.raw_blob_key(SHA), manifest.manifest_key}


async def test_same_frame_again_is_a_duplicate_and_changes_nothing() -> None:
    store = MemoryStore()
    first = await Harness(store).accept()
    again = await Harness(store).accept()
    assert isinstance(again, Accepted) and again.duplicate
    assert isinstance(first, Accepted)
    assert again.manifest == first.manifest == await manifest_in(store)


async def test_different_frame_same_identity_is_a_conflict_with_quarantine_record() -> None:
    store = MemoryStore()
    await Harness(store).accept(FRAME)
    harness = Harness(store)
    result = await harness.accept(OTHER)
    assert isinstance(result, IdentityConflictFound)
    assert result.accepted.frame_sha256 == SHA and result.submitted_frame_sha256 == OTHER_SHA
    assert (await manifest_in(store)).frame_sha256 == SHA  # the accepted one is untouched
    conflict = records.IdentityConflict.from_json((await store.get(result.quarantine_key))[0])
    assert conflict.accepted_frame_sha256 == SHA and conflict.submitted_frame_sha256 == OTHER_SHA
    assert conflict.submitted_raw_blob_key == keys.raw_blob_key(OTHER_SHA)
    await store.head(keys.raw_blob_key(OTHER_SHA))  # the submitted bytes are kept for inspection
    assert result.quarantine_key in await harness.settle()  # its quarantine row


@pytest.mark.parametrize(
    ("op", "faults"),
    [
        ("put_if_none_match", (Fault.CONFLICT, Fault.CONFLICT)),
        ("put_if_none_match", (Fault.UNAVAILABLE,)),
        ("put_if_none_match", (Fault.UNKNOWN_NOT_APPLIED,)),
        ("put_if_none_match", (Fault.LOST_REPLY,)),
    ],
)
@pytest.mark.parametrize("prefix", [keys.RAW_BLOBS_PREFIX, keys.ACCEPTED_PREFIX])
async def test_transient_faults_on_either_create_end_in_one_new_acceptance(
    op: str, faults: tuple[Fault, ...], prefix: str
) -> None:
    store = FaultyStore(MemoryStore(), seed=3)
    store.script(op, prefix, *faults)
    harness = Harness(store)
    result = await harness.accept()
    assert isinstance(result, Accepted)
    # A lost reply on our own manifest create is recognised as ours: not a duplicate.
    assert result.duplicate is False
    assert sum(store.injected.values()) == len(faults)
    assert (await manifest_in(store.inner)).frame_sha256 == SHA
    assert keys.raw_blob_key(SHA) in await harness.settle()  # its blob row, whatever the faults


async def test_lost_reply_then_read_faults_still_settle_by_reading() -> None:
    store = FaultyStore(MemoryStore(), seed=4)
    store.script("put_if_none_match", keys.ACCEPTED_PREFIX, Fault.LOST_REPLY, Fault.CONFLICT)
    store.script("get", keys.ACCEPTED_PREFIX, Fault.UNAVAILABLE, Fault.UNAVAILABLE)
    result = await Harness(store).accept()
    assert isinstance(result, Accepted) and not result.duplicate


async def test_store_down_answers_unavailable_never_accepted() -> None:
    store = FaultyStore(
        MemoryStore(), seed=5, rates={"put_if_none_match": {Fault.UNAVAILABLE: 1.0}}
    )
    with pytest.raises(AcceptanceUnavailable):
        await Harness(store).accept()
    with pytest.raises(NotFound):
        await store.inner.head(keys.accepted_manifest_key(IDENTITY))


async def test_applied_but_unobservable_manifest_is_503_not_200() -> None:
    # The create landed but every answer and every read afterwards fails: only a read may
    # decide, none succeeds, so the answer must be 503 (the agent retries → duplicate).
    store = FaultyStore(MemoryStore(), seed=6)
    store.script("put_if_none_match", keys.ACCEPTED_PREFIX, *([Fault.LOST_REPLY] * 20))
    store.script("get", keys.ACCEPTED_PREFIX, *([Fault.UNAVAILABLE] * 20))
    with pytest.raises(AcceptanceUnavailable):
        await Harness(store).accept()
    assert (await manifest_in(store.inner)).frame_sha256 == SHA
    retry = await Harness(store.inner).accept()
    assert isinstance(retry, Accepted) and retry.duplicate


async def test_hanging_store_is_cut_off_by_the_request_budget() -> None:
    store = FaultyStore(MemoryStore(), seed=7)
    store.script("put_if_none_match", keys.ACCEPTED_PREFIX, *([Fault.HANG] * 50))
    harness = Harness(store, clock=SystemClock(), budget_s=0.3)
    started = asyncio.get_running_loop().time()
    with pytest.raises(AcceptanceUnavailable):
        await harness.accept()
    assert asyncio.get_running_loop().time() - started < 3.0
    assert ("put_manifest", "outcome_unknown") in harness.ops


async def test_a_full_index_log_buffer_drops_and_counts_but_still_accepts() -> None:
    store = MemoryStore()
    harness = Harness(store, queue=1)
    result = await harness.accept()
    assert isinstance(result, Accepted)
    assert harness.index_log.stats.dropped_full == 1  # the blob row fit; the accepted did not


async def test_marked_blob_gets_a_veto_before_the_manifest() -> None:
    store = MemoryStore()
    await store.put(keys.raw_blob_key(SHA), FRAME)
    mark = records.GcMark(
        frame_sha256=SHA, raw_blob_key=keys.raw_blob_key(SHA), marked_at_unix_ns=1, gc_run_id="gc-1"
    )
    await store.put(keys.gc_mark_key(SHA), mark.to_json())
    harness = Harness(store)
    result = await harness.accept()
    assert isinstance(result, Accepted)
    veto = records.GcVeto.from_json((await store.get(keys.gc_veto_key(SHA)))[0])
    assert veto.frame_sha256 == SHA and veto.collector_id == "collector-t"
    names = [op for op, _ in harness.ops]
    assert names.index("put_gc_veto") < names.index("put_manifest")
    # Still marked after the veto: proved by a HEAD, the frame is not uploaded again.
    assert names.index("put_gc_veto") < names.index("head_raw_blob") < names.index("put_manifest")
    assert names.count("put_raw_blob") == 1


class DeletingGc(MemoryStore):
    """A store where a GC run is mid-deletion: after two reads of the mark, it finishes."""

    mark_reads = 0

    async def get(self, key: str) -> tuple[bytes, str]:
        if key == keys.gc_mark_key(SHA):
            self.mark_reads += 1
            if self.mark_reads == 3:
                await self.delete(keys.raw_blob_key(SHA))
                await self.delete(key)
        return await super().get(key)


async def test_blob_being_deleted_by_gc_is_recreated_before_acceptance() -> None:
    store = DeletingGc()
    await store.put(keys.raw_blob_key(SHA), FRAME)
    mark = records.GcMark(
        frame_sha256=SHA,
        raw_blob_key=keys.raw_blob_key(SHA),
        marked_at_unix_ns=1,
        gc_run_id="gc-1",
        state="deleting",
    )
    await store.put(keys.gc_mark_key(SHA), mark.to_json())
    result = await Harness(store).accept()
    assert isinstance(result, Accepted)
    assert (await store.get(keys.raw_blob_key(SHA)))[
        0
    ] == FRAME  # re-created after the GC deleted it
    await store.head(keys.gc_veto_key(SHA))


@pytest.mark.parametrize("seed", range(8))
async def test_racing_acceptors_under_random_faults_agree_on_one_manifest(seed: int) -> None:
    inner = MemoryStore()
    rates = {
        "put_if_none_match": {Fault.CONFLICT: 0.15, Fault.LOST_REPLY: 0.15, Fault.UNAVAILABLE: 0.1},
        "get": {Fault.UNAVAILABLE: 0.2},
    }
    rng = random.Random(seed)
    frames = [FRAME if rng.random() < 0.7 else OTHER for _ in range(8)]
    outcomes = await asyncio.gather(
        *(
            Harness(FaultyStore(inner, seed=seed * 100 + i, rates=rates)).accept(f)
            for i, f in enumerate(frames)
        ),
        return_exceptions=True,
    )
    stored = await manifest_in(inner) if any(isinstance(o, Accepted) for o in outcomes) else None
    for frame, outcome in zip(frames, outcomes, strict=True):
        sha = hashlib.sha256(frame).hexdigest()
        if isinstance(outcome, Accepted):
            assert (
                stored is not None and stored.frame_sha256 == sha == outcome.manifest.frame_sha256
            )
            assert (await inner.get(keys.raw_blob_key(sha)))[0] == frame
        elif isinstance(outcome, IdentityConflictFound):
            assert stored is not None and stored.frame_sha256 != sha
        else:
            assert isinstance(outcome, AcceptanceUnavailable)
    new = [o for o in outcomes if isinstance(o, Accepted) and not o.duplicate]
    assert len(new) <= 1


# --- a duplicate's cost and the re-send order (PROTOCOL §3.2, §3.5 collector side) ----------

PUT_CLASS = ("put_raw_blob", "put_manifest", "put_gc_veto", "put_quarantine")


async def test_a_duplicate_without_the_header_is_a_refused_upload_and_one_manifest_read() -> None:
    # An agent that restarted re-sends without X-Lightmetrics-Resend: the blob's 412 sends
    # the collector to the manifest first, which settles the duplicate (2 requests, not 5).
    store = MemoryStore()
    await Harness(store).accept()
    stored = [info.key async for info in store.list("")]
    harness = Harness(store)

    result = await harness.accept()

    assert isinstance(result, Accepted) and result.duplicate
    assert harness.ops == [("put_raw_blob", "precondition_failed"), ("get_manifest", "ok")]
    assert [info.key async for info in store.list("")] == stored


async def test_a_stored_blob_with_no_manifest_is_proven_with_a_head_not_a_second_upload() -> None:
    store = MemoryStore()
    await store.put(keys.raw_blob_key(SHA), FRAME)  # the same content, stored before
    harness = Harness(store)

    result = await harness.accept()

    assert isinstance(result, Accepted) and not result.duplicate
    assert harness.ops == [
        ("put_raw_blob", "precondition_failed"),
        ("get_manifest", "not_found"),
        ("get_gc_mark", "not_found"),
        ("head_raw_blob", "ok"),
        ("put_manifest", "ok"),
    ]
    assert sum(op in PUT_CLASS for op, _ in harness.ops) == 2


async def test_a_conflict_whose_blob_was_stored_keeps_that_blob_before_quarantining() -> None:
    store = MemoryStore()
    await Harness(store).accept(FRAME)
    await store.put(keys.raw_blob_key(OTHER_SHA), OTHER)  # the submitted content exists
    mark = records.GcMark(
        frame_sha256=OTHER_SHA,
        raw_blob_key=keys.raw_blob_key(OTHER_SHA),
        marked_at_unix_ns=1,
        gc_run_id="gc-1",
    )
    await store.put(keys.gc_mark_key(OTHER_SHA), mark.to_json())  # and the GC marked it
    harness = Harness(store)

    result = await harness.accept(OTHER)

    assert isinstance(result, IdentityConflictFound)
    ops = [op for op, _ in harness.ops]
    assert ops[:3] == ["put_raw_blob", "get_manifest", "get_gc_mark"]
    assert ops.index("put_gc_veto") < ops.index("put_quarantine")
    assert "put_manifest" not in ops  # the manifest read already found the conflict
    assert (await store.get(keys.raw_blob_key(OTHER_SHA)))[0] == OTHER
    veto = records.GcVeto.from_json((await store.get(keys.gc_veto_key(OTHER_SHA)))[0])
    assert veto.frame_sha256 == OTHER_SHA


class VanishingBlob(MemoryStore):
    """A GC run that finishes between our 412 and the mark read: blob and mark are gone."""

    async def get(self, key: str) -> tuple[bytes, str]:
        if key == keys.gc_mark_key(SHA):
            await self.delete(keys.raw_blob_key(SHA))
        return await super().get(key)


async def test_a_blob_deleted_after_the_412_is_created_again_when_the_head_finds_nothing() -> None:
    store = VanishingBlob()
    await store.put(keys.raw_blob_key(SHA), FRAME)  # an orphan the GC is about to delete
    harness = Harness(store)

    result = await harness.accept()

    assert isinstance(result, Accepted) and not result.duplicate
    assert (await store.get(keys.raw_blob_key(SHA)))[0] == FRAME
    assert [op for op in harness.ops if op[0] != "put_manifest"] == [
        ("put_raw_blob", "precondition_failed"),
        ("get_manifest", "not_found"),
        ("get_gc_mark", "not_found"),
        ("head_raw_blob", "not_found"),
        ("put_raw_blob", "ok"),
    ]


async def test_a_resend_of_an_accepted_frame_is_one_get_and_writes_nothing() -> None:
    store = MemoryStore()
    first = await Harness(store).accept()
    stored = [info.key async for info in store.list("")]
    harness = Harness(store)

    result = await harness.accept(resend=True)

    assert isinstance(result, Accepted) and result.duplicate and result.store_ops == 1
    assert isinstance(first, Accepted) and result.manifest == first.manifest
    assert harness.ops == [("get_manifest", "ok")]
    assert [info.key async for info in store.list("")] == stored


async def test_a_resend_with_no_manifest_takes_steps_one_and_two() -> None:
    harness = Harness(MemoryStore())

    result = await harness.accept(resend=True)

    assert isinstance(result, Accepted) and not result.duplicate
    assert harness.ops == [
        ("get_manifest", "not_found"),
        ("put_raw_blob", "ok"),
        ("put_manifest", "ok"),
    ]


async def test_a_resend_whose_manifest_read_fails_falls_back_to_the_normal_steps() -> None:
    inner = MemoryStore()
    await Harness(inner).accept()
    store = FaultyStore(inner, seed=8)
    store.script("get", keys.ACCEPTED_PREFIX, Fault.UNAVAILABLE)
    harness = Harness(store)

    result = await harness.accept(resend=True)

    assert isinstance(result, Accepted) and result.duplicate
    assert harness.ops[0] == ("get_manifest", "unavailable")
    assert ("put_manifest", "precondition_failed") in harness.ops


async def test_a_resend_of_another_frame_is_the_conflict_path_with_its_blob_kept() -> None:
    store = MemoryStore()
    await Harness(store).accept(FRAME)
    harness = Harness(store)

    result = await harness.accept(OTHER, resend=True)

    assert isinstance(result, IdentityConflictFound)
    assert result.accepted.frame_sha256 == SHA and result.submitted_frame_sha256 == OTHER_SHA
    assert harness.ops[:5] == [
        ("get_manifest", "ok"),
        ("put_raw_blob", "ok"),
        ("get_gc_mark", "not_found"),  # the accepted blob: no deletion to hold off ...
        ("head_raw_blob", "ok"),  # ... and it is there
        ("put_quarantine", "ok"),
    ]
    assert (await store.get(keys.raw_blob_key(OTHER_SHA)))[0] == OTHER
    await store.head(result.quarantine_key)


@pytest.mark.parametrize("resend", [False, True])
async def test_a_conflict_whose_quarantine_record_cannot_be_written_is_unavailable(
    resend: bool,
) -> None:
    inner = MemoryStore()
    await Harness(inner).accept(FRAME)
    store = FaultyStore(inner, seed=9)
    store.script("put_if_none_match", keys.QUARANTINE_PREFIX, *([Fault.UNAVAILABLE] * 50))

    with pytest.raises(AcceptanceUnavailable):
        await Harness(store).accept(OTHER, resend=resend)

    assert [info.key async for info in inner.list(keys.QUARANTINE_PREFIX)] == []
    assert (await manifest_in(inner)).frame_sha256 == SHA


async def logged_rows(store: ObjectStore) -> dict[tuple[str, bool | None], IndexRow]:
    rows: dict[tuple[str, bool | None], IndexRow] = {}
    async for info in store.list(keys.INDEX_LOG_PREFIX):
        body, _etag = await store.get(info.key)
        for row in decode(body, source=info.key):
            rows[(row.key, row.own_create)] = row
    return rows


async def test_log_rows_are_store_attested_own_creates_and_reads() -> None:
    """PROTOCOL §3.7: an accepted row carries the ETag the store answered, whether the create
    was this collector's own (200), and the batch's point times; a duplicate's row carries
    the ETag of the GET that read the manifest and ``own_create`` false; a quarantine row
    created here is own."""
    store = MemoryStore()
    first = Harness(store)
    await first.acceptor.accept(HEADER, FRAME, SHA, ts_range=(5, 9))
    await first.settle()
    again = Harness(store)
    await again.acceptor.accept(HEADER, FRAME, SHA, ts_range=(5, 9))
    await again.settle()
    conflict = Harness(store)
    await conflict.acceptor.accept(HEADER, OTHER, OTHER_SHA, ts_range=(1, 2))
    await conflict.settle()
    rows = await logged_rows(store)
    key = keys.accepted_manifest_key(IDENTITY)
    _body, etag = await store.get(key)
    own, read = rows[(key, True)], rows[(key, False)]
    assert own.etag == etag and (own.min_ts_ns, own.max_ts_ns) == (5, 9)
    assert read.etag == etag and (read.min_ts_ns, read.max_ts_ns) == (5, 9)
    assert own.time_unix_ns == read.time_unix_ns  # the stored record's value, not recomputed
    quarantine_key = keys.quarantine_key(IDENTITY, OTHER_SHA)
    _body, q_etag = await store.get(quarantine_key)
    assert rows[(quarantine_key, True)].etag == q_etag
    blob = rows[(keys.raw_blob_key(SHA), None)]
    assert blob.etag is None and blob.kind == "blob"
