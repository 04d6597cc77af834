"""The identity-conflict path and the request deadline (PROTOCOL §3.2, §3.5 collector side).

- Every conflict holds off a deletion of the *accepted* blob (which its quarantine record
  names) by the whole collector side: read the mark, veto a ``marked`` one and read it
  again, wait out a ``deleting`` one, then HEAD the blob; a blob raw retention already
  deleted makes the record say ``accepted_blob_present: false``.
- A re-send whose manifest names another hash stores and keeps the submitted blob (step 1
  with the collector side) before the conflict path.
- No create is sent after the request's start + budget: a wait that eats the budget ends
  the request (503) with no create sent.

Each store here records every request it receives with the manual clock's time.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

import pytest

from collector.accept import AcceptanceUnavailable, Accepted, BatchAcceptor, IdentityConflictFound
from index.log_writer import IndexLogWriter
from protocol import keys, records
from protocol.clock import ManualClock
from store.base import ObjectInfo
from store.errors import NotFound
from store.memory import MemoryStore
from store.retry import Backoff
from tests.collector.test_accept import FRAME, HEADER, IDENTITY, OTHER, OTHER_SHA, SHA

BUDGET_S = 5.0
ACCEPTED_MARK = keys.gc_mark_key(SHA)
SUBMITTED_MARK = keys.gc_mark_key(OTHER_SHA)


@dataclass(frozen=True)
class Request:
    method: str
    key: str
    at_s: float  # the manual clock's monotonic time when the request was sent


@dataclass
class GcDeletion:
    """A GC deletion of ``sha``'s blob under way: the mark is ``deleting``; the blob and
    then the mark go on the ``after_reads``-th read of the mark, or on the first read
    answered at or after ``at_s`` (never when both are None)."""

    sha: str
    after_reads: int | None = None
    at_s: float | None = None
    reads: int = 0

    def finishes(self, now_s: float) -> bool:
        self.reads += 1
        return self.reads == self.after_reads or (self.at_s is not None and now_s >= self.at_s)


class RecordingStore(MemoryStore):
    """Records each request; each read of a key in ``slow`` takes that many seconds of
    the manual clock; ``deletions`` finish as their mark is read."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.manual = clock
        self.requests: list[Request] = []
        self.slow: dict[str, float] = {}
        self.deletions: list[GcDeletion] = []

    def _note(self, method: str, key: str) -> None:
        self.requests.append(Request(method, key, self.manual.monotonic()))
        self.manual.advance(self.slow.get(key, 0.0))

    async def get(self, key: str) -> tuple[bytes, str]:
        self._note("GET", key)
        for deletion in self.deletions:
            if key == keys.gc_mark_key(deletion.sha):
                if deletion.finishes(self.manual.monotonic()):
                    await super().delete(keys.raw_blob_key(deletion.sha))
                    await super().delete(key)
        return await super().get(key)

    async def head(self, key: str) -> ObjectInfo:
        self._note("HEAD", key)
        return await super().head(key)

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        self._note("PUT", key)
        return await super().put(key, body, if_none_match=if_none_match, if_match=if_match)

    def on(self, *keys_: str) -> list[str]:
        """The requests on these keys, as ``"METHOD key"``, in order."""
        return [f"{r.method} {r.key}" for r in self.requests if r.key in keys_]

    def puts_under(self, prefix: str) -> list[Request]:
        return [r for r in self.requests if r.method == "PUT" and r.key.startswith(prefix)]


@dataclass
class World:
    clock: ManualClock = field(default_factory=ManualClock)
    store: RecordingStore = field(init=False)

    def __post_init__(self) -> None:
        self.store = RecordingStore(self.clock)

    def acceptor(self) -> BatchAcceptor:
        return BatchAcceptor(
            store=self.store,
            collector_id="collector-t",
            clock=self.clock,
            rng=random.Random(2),
            index_log=IndexLogWriter(
                store=self.store, clock=self.clock, rng=random.Random(1), writer_id="t"
            ),
            budget_s=BUDGET_S,
            backoff=Backoff(attempts=50, base_s=0.05, cap_s=0.2),
        )

    async def accept(
        self, frame: bytes, *, resend: bool = False
    ) -> Accepted | IdentityConflictFound:
        sha = hashlib.sha256(frame).hexdigest()
        return await self.acceptor().accept(HEADER, frame, sha, resend=resend)

    async def accepted_first(self) -> None:
        """FRAME accepted; the requests so far forgotten and the clock's budget fresh."""
        assert isinstance(await self.accept(FRAME), Accepted)
        self.store.requests.clear()

    async def mark(self, sha: str, state: str) -> None:
        mark = records.GcMark(
            frame_sha256=sha,
            raw_blob_key=keys.raw_blob_key(sha),
            marked_at_unix_ns=1,
            gc_run_id="gc-1",
            state=state,  # type: ignore[arg-type]
        )
        await MemoryStore.put(self.store, keys.gc_mark_key(sha), mark.to_json())

    async def quarantined(self) -> records.IdentityConflict:
        key = keys.quarantine_key(IDENTITY, OTHER_SHA)
        return records.IdentityConflict.from_json((await MemoryStore.get(self.store, key))[0])

    async def exists(self, key: str) -> bool:
        try:
            await MemoryStore.head(self.store, key)
        except NotFound:
            return False
        return True


BLOB, VETO = keys.raw_blob_key(SHA), keys.gc_veto_key(SHA)


# --- the accepted blob, on every conflict (item 1) ----------------------------------------


@pytest.mark.parametrize("resend", [False, True])
async def test_every_conflict_reads_the_mark_and_heads_the_accepted_blob_before_its_record(
    resend: bool,
) -> None:
    world = World()
    await world.accepted_first()

    result = await world.accept(OTHER, resend=resend)

    assert isinstance(result, IdentityConflictFound)
    record = keys.quarantine_key(IDENTITY, OTHER_SHA)
    assert world.store.on(ACCEPTED_MARK, BLOB, VETO, record) == [
        f"GET {ACCEPTED_MARK}",
        f"HEAD {BLOB}",
        f"PUT {record}",
    ]
    assert (await world.quarantined()).accepted_blob_present is True


async def test_a_marked_accepted_blob_is_vetoed_read_again_and_headed_before_the_record() -> None:
    world = World()
    await world.accepted_first()
    await world.mark(SHA, "marked")  # raw retention marked the accepted batch's blob

    result = await world.accept(OTHER)

    assert isinstance(result, IdentityConflictFound)
    record = keys.quarantine_key(IDENTITY, OTHER_SHA)
    assert world.store.on(ACCEPTED_MARK, BLOB, VETO, record) == [
        f"GET {ACCEPTED_MARK}",
        f"PUT {VETO}",
        f"GET {ACCEPTED_MARK}",
        f"HEAD {BLOB}",
        f"PUT {record}",
    ]
    assert (await world.quarantined()).accepted_blob_present is True


async def test_a_deletion_under_way_is_waited_out_and_the_record_says_the_blob_is_gone() -> None:
    world = World()
    await world.accepted_first()
    await world.mark(SHA, "deleting")  # past the GC's last veto check
    world.store.deletions.append(GcDeletion(SHA, after_reads=4))

    result = await world.accept(OTHER)

    assert isinstance(result, IdentityConflictFound)
    on = world.store.on(ACCEPTED_MARK, BLOB, record := keys.quarantine_key(IDENTITY, OTHER_SHA))
    assert on[-3:] == [f"GET {ACCEPTED_MARK}", f"HEAD {BLOB}", f"PUT {record}"]
    assert on.count(f"GET {ACCEPTED_MARK}") == 4  # waited until the mark was gone
    assert (await world.quarantined()).accepted_blob_present is False
    assert not await world.exists(BLOB)  # this request never had those bytes


async def test_an_accepted_blob_raw_retention_already_deleted_is_recorded_absent() -> None:
    world = World()
    await world.accepted_first()
    await MemoryStore.delete(world.store, BLOB)  # mark removed after the deletion

    result = await world.accept(OTHER, resend=True)

    assert isinstance(result, IdentityConflictFound) and result.accepted.frame_sha256 == SHA
    conflict = await world.quarantined()
    assert conflict.accepted_blob_present is False
    assert conflict.accepted_frame_sha256 == SHA  # still named: a re-created blob is kept
    assert await world.exists(keys.raw_blob_key(OTHER_SHA))


# --- the submitted blob of a re-send (item 2) -----------------------------------------------


async def test_a_resend_of_another_frame_keeps_a_submitted_blob_the_gc_is_deleting() -> None:
    """The agent sent OTHER before (its blob landed, the answer was lost) and re-sends it
    with the header while the GC is deleting that blob as an orphan: step 1 with the §3.5
    collector side (412, veto, wait, HEAD, create again) runs before the quarantine
    record that names the blob is created."""
    world = World()
    await world.accepted_first()
    submitted = keys.raw_blob_key(OTHER_SHA)
    await MemoryStore.put(world.store, submitted, OTHER)
    await world.mark(OTHER_SHA, "deleting")
    world.store.deletions.append(GcDeletion(OTHER_SHA, after_reads=2))

    result = await world.accept(OTHER, resend=True)

    assert isinstance(result, IdentityConflictFound)
    record = keys.quarantine_key(IDENTITY, OTHER_SHA)
    assert world.store.on(submitted, SUBMITTED_MARK, keys.gc_veto_key(OTHER_SHA), record) == [
        f"PUT {submitted}",  # 412
        f"GET {SUBMITTED_MARK}",  # deleting
        f"PUT {keys.gc_veto_key(OTHER_SHA)}",
        f"GET {SUBMITTED_MARK}",  # gone: the GC deleted the blob meanwhile
        f"HEAD {submitted}",  # 404
        f"PUT {submitted}",  # created again
        f"PUT {record}",
    ]
    assert (await MemoryStore.get(world.store, submitted))[0] == OTHER


# --- no create after start + budget (item 3) ------------------------------------------------


@dataclass(frozen=True)
class BudgetCase:
    name: str
    frame: bytes
    resend: bool = False
    accepted_first: bool = True
    deleting: str | None = None
    """A blob (hash) the GC is deleting when the request starts."""
    ends_late: bool = False
    """Its deletion finishes on the first mark read answered past the deadline (else never)."""
    slow: tuple[tuple[str, float], ...] = ()


BUDGET_CASES = [
    # The accepted blob's deletion never finishes: the wait runs into the deadline.
    BudgetCase("accepted-deletion-stuck", OTHER, deleting=SHA, slow=((ACCEPTED_MARK, 0.7),)),
    # It finishes on the read answered past the deadline: the HEAD and the record would
    # come next.
    BudgetCase(
        "accepted-deletion-ends-late",
        OTHER,
        resend=True,
        deleting=SHA,
        ends_late=True,
        slow=((ACCEPTED_MARK, 0.7),),
    ),
    # The HEAD of the accepted blob is answered past the deadline: the record would be next.
    BudgetCase("accepted-head-late", OTHER, slow=((BLOB, BUDGET_S),)),
    # The submitted blob's deletion ends on the read past the deadline: its re-create
    # would come next (on the conflict path, and on a new batch before its manifest).
    BudgetCase(
        "submitted-deletion-ends-late",
        OTHER,
        resend=True,
        deleting=OTHER_SHA,
        ends_late=True,
        slow=((SUBMITTED_MARK, 0.7),),
    ),
    BudgetCase(
        "new-batch-deletion-ends-late",
        FRAME,
        accepted_first=False,
        deleting=SHA,
        ends_late=True,
        slow=((ACCEPTED_MARK, 0.7),),
    ),
]


@pytest.mark.parametrize("case", BUDGET_CASES, ids=lambda case: case.name)
async def test_a_wait_that_eats_the_budget_is_503_and_sends_no_create_past_the_deadline(
    case: BudgetCase,
) -> None:
    world = World()
    if case.accepted_first:
        await world.accepted_first()
    start_s = world.clock.monotonic()
    deadline_s = start_s + BUDGET_S
    if case.deleting is not None:
        frame = FRAME if case.deleting == SHA else OTHER
        await MemoryStore.put(world.store, keys.raw_blob_key(case.deleting), frame)
        await world.mark(case.deleting, "deleting")
        at_s = deadline_s if case.ends_late else None
        world.store.deletions.append(GcDeletion(case.deleting, at_s=at_s))
    world.store.slow.update(case.slow)

    with pytest.raises(AcceptanceUnavailable):
        await world.accept(case.frame, resend=case.resend)

    assert world.clock.monotonic() >= deadline_s  # the budget was eaten
    puts = [r for r in world.store.requests if r.method == "PUT"]
    assert all(r.at_s < deadline_s for r in puts), [(r.key, r.at_s) for r in puts]
    assert world.store.puts_under(keys.QUARANTINE_PREFIX) == []
    if case.ends_late:  # the deletion finished: a create would have been next
        assert not await world.exists(keys.raw_blob_key(case.deleting or ""))
