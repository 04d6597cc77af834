"""The shipped IAM documents (deploy/bucket-policy) let the code do its work: collectors,
the reconciler and its GC run against a store that enforces, for each role's client, what
the documents allow (`tests.deploy.policy_store.PolicyStore`, with the evaluator of
`tests.deploy.deploy_files`). A request the code makes through a role that may not make
it fails the way S3's 403 does; a policy/code mismatch fails here, not in production.

The world goes through every kind of delete the GC makes: a blob and its mark (deletion),
a vetoed mark (withdrawn), a veto that has done its work, and a stale ``deleting`` mark
resolved by a disabled GC.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import uuid

from collector.accept import Accepted, BatchAcceptor
from config import GcSettings, ReconcilerSettings, Settings, load_settings
from index.log_writer import IndexLogWriter
from index.rows import blob_row
from protocol import keys, records
from protocol.clock import ManualClock
from protocol.frame_encode import encode_frame, points_table
from reconciler.daemon import Reconciler
from store.errors import NotFound
from store.memory import MemoryStore
from store.retry import Backoff
from tests.deploy.deploy_files import DEPLOY
from tests.deploy.policy_store import PolicyStore

BOOT = uuid.UUID("5f0c7a3e-1d2b-4c3a-9e8f-0123456789ab")
HOUR_S = 3600.0
GRACE_S = 600.0
AUDIT_EVERY_S = 60.0


@dataclasses.dataclass(frozen=True)
class Header:
    agent_id: str
    boot_id: uuid.UUID
    seq_start: int
    seq_end: int
    record_count: int


def frame(seq: int) -> tuple[Header, bytes, str]:
    table = points_table([1_760_000_000 * 10**9 + seq], ["cpu"], [float(seq)], [None])
    body = encode_frame(agent_id="agent-iam", boot_id=BOOT, seq_start=seq, points=table)
    return Header("agent-iam", BOOT, seq, seq, 1), body, hashlib.sha256(body).hexdigest()


def settings(*, gc_enabled: bool = True) -> Settings:
    return Settings(
        reconciler=ReconcilerSettings(
            lease_ttl_s=30.0,
            lookback_s=7200.0,
            verify_rate_per_s=1000.0,
            concurrency=4,
            max_audit_interval_s=AUDIT_EVERY_S,
        ),
        gc=GcSettings(
            enabled=gc_enabled,
            retry_horizon_s=2 * HOUR_S,
            mark_grace_s=GRACE_S,
            max_delete_fraction=1.0,
        ),
    )


class World:
    def __init__(self) -> None:
        location = load_settings(
            DEPLOY / "kubernetes" / "reconciler.toml", environ={}
        ).store.location
        bucket, prefix = location.bucket, location.prefix  # type: ignore[union-attr]
        self.clock = ManualClock()
        self.memory = MemoryStore(clock=self.clock)
        self.roles = {
            role: PolicyStore(self.memory, role, bucket=bucket, prefix=prefix)
            for role in ("collector", "reconciler", "gc")
        }
        self.log = IndexLogWriter(
            store=self.roles["collector"], clock=self.clock, rng=random.Random(1), writer_id="c"
        )

    def reconciler(self, *, gc_enabled: bool = True) -> Reconciler:
        return Reconciler(
            store=self.roles["reconciler"],
            gc_store=self.roles["gc"],
            settings=settings(gc_enabled=gc_enabled),
            clock=self.clock,
            rng=random.Random(2),
            owner="reconciler-iam",
        )

    async def accept(self, seq: int) -> Accepted:
        header, body, digest = frame(seq)
        acceptor = BatchAcceptor(
            store=self.roles["collector"],
            collector_id="collector-iam",
            clock=self.clock,
            rng=random.Random(seq),
            index_log=self.log,
            backoff=Backoff(attempts=20, base_s=0.001, cap_s=0.005),
        )
        result = await acceptor.accept(header, body, digest)
        assert isinstance(result, Accepted)
        await self.log.flush()
        return result

    async def orphan(self, seq: int) -> str:
        """A blob a collector created (and logged) before it crashed."""
        _header, body, digest = frame(seq)
        await self.roles["collector"].put(keys.raw_blob_key(digest), body, if_none_match=True)
        self.log.append(blob_row(digest, self.clock.now_ns()))
        await self.log.flush()
        return digest

    async def exists(self, key: str) -> bool:
        try:
            await self.memory.head(key)
        except NotFound:
            return False
        return True

    def denied(self) -> list[str]:
        return [denial for store in self.roles.values() for denial in store.denied]


async def test_the_gc_deletes_blobs_marks_and_vetoes_under_the_shipped_policies() -> None:
    world = World()
    await world.accept(1)
    deleted, vetoed = await world.orphan(2), await world.orphan(3)
    world.clock.advance(3 * HOUR_S)
    reconciler = world.reconciler()
    await reconciler.run_once()  # steady pass, the first audit, the GC marks both orphans
    for digest in (deleted, vetoed):
        assert await world.exists(keys.gc_mark_key(digest)), world.denied()

    await world.accept(3)  # a re-send of the marked blob: the collector writes a veto
    assert await world.exists(keys.gc_veto_key(vetoed))
    for _ in range(2):  # past the grace: a scheduled audit, the deletion, the withdrawal
        world.clock.advance(GRACE_S + AUDIT_EVERY_S)
        await reconciler.run_once()
    assert not await world.exists(keys.raw_blob_key(deleted)), world.denied()
    assert not await world.exists(keys.gc_mark_key(deleted))
    assert await world.exists(keys.raw_blob_key(vetoed))
    assert not await world.exists(keys.gc_mark_key(vetoed))
    assert not await world.exists(keys.gc_veto_key(vetoed))  # it has done its work

    # A disabled GC still resolves a stale "deleting" mark: through the GC role too.
    _header, body, stale = frame(4)
    await world.memory.put(keys.raw_blob_key(stale), body)
    now = world.clock.now_ns()
    mark = records.GcMark(
        frame_sha256=stale,
        raw_blob_key=keys.raw_blob_key(stale),
        marked_at_unix_ns=now,
        gc_run_id="crashed",
        state="deleting",
        deleting_since_unix_ns=now,
        lease_epoch=1,
        lease_expires_at_unix_ns=now + 30 * 10**9,
    )
    await world.memory.put(keys.gc_mark_key(stale), mark.to_json())
    world.clock.advance(HOUR_S)
    await world.reconciler(gc_enabled=False).run_once()
    assert not await world.exists(keys.gc_mark_key(stale))
    assert await world.exists(keys.raw_blob_key(stale))
    assert world.denied() == []
